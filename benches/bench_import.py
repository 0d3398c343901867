"""Import cost: ``from shardline import Topology, bucket_id`` in a fresh interpreter.

One group, ``import``: a new Python process running that import, and one running ``pass``
(floor); the pytest-benchmark time is the whole process, start-up included. What the import
itself costs is the ``shardline`` line of ``python -X importtime`` (cumulative: the package and
everything it loads) in each sample, kept in ``extra_info`` as ``p50_ns`` and ``p99_ns``.

Goal: at most 15 ms (the median of that line), with neither asyncio, sqlite3 nor ssl loaded
(issue 14); every sample is checked for both, and the benchmark fails past the goal.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("pytest_benchmark")

ROUNDS = 60
WARMUP = 3
GOAL_NS = 15_000_000
HEAVY = ("asyncio", "sqlite3", "ssl")

IMPORT = (
    "from shardline import Topology, bucket_id\n"
    "import sys\n"
    f"print(*sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
)


def importtime_ns(stderr: str, module: str) -> int:
    """The cumulative time of ``module``'s top-level line in ``-X importtime`` output."""
    for line in stderr.splitlines():
        fields = line.removeprefix("import time:").split("|")
        if len(fields) == 3 and fields[2].strip() == module and not fields[2][1:].startswith(" "):
            return int(fields[1]) * 1000
    raise AssertionError(f"no top-level {module!r} line in -X importtime output:\n{stderr}")


@pytest.mark.parametrize("impl", ["shardline: from shardline import Topology, bucket_id", "floor"])
def test_import(benchmark: Any, per_call: Callable[..., Any], impl: str) -> None:
    code = "pass" if impl == "floor" else IMPORT
    samples: list[int] = []

    def one_process() -> None:
        done = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", code],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        if impl != "floor":
            assert done.stdout == "\n", f"loaded {done.stdout.strip()}"
            samples.append(importtime_ns(done.stderr, "shardline"))

    benchmark.group = "import"
    per_call(one_process, 1, rounds=ROUNDS, warmup=WARMUP, impl=impl)
    if impl == "floor":
        return
    timed = samples[WARMUP:]
    quantiles = statistics.quantiles(timed, n=100)
    benchmark.extra_info["p50_ns"] = statistics.median(timed)
    benchmark.extra_info["p99_ns"] = quantiles[98]
    assert statistics.median(timed) <= GOAL_NS, (
        f"`from shardline import Topology, bucket_id` took {statistics.median(timed) / 1e6:.1f} ms"
        f" (median of -X importtime over {len(timed)} processes), over the 15 ms goal"
    )
