"""What the stable ABI (abi3) costs on the hot paths: the abi3 build against the full-API build.

The two builds of the same commit live in two virtualenvs of the same interpreter, whose
pythons ``SHARDLINE_ABI3_PYTHON`` and ``SHARDLINE_FULL_PYTHON`` name (``benches/abi3_cost.py``
makes them, and ``make bench-abi3`` runs it; without them this module skips). Each runs
``abi3_worker.py``, which times one block of ``CALLS_PER_ROUND`` calls of a path when asked:

- ``owner``: ``Topology.owner`` of a bucket, 3,000 buckets in 256 ranges (``bench_lookup.py``);
- ``route``: ``Topology.route`` of a str key, the same map (``bench_hashing.py``'s keys);
- ``dispatch``: ``WorkerProxy.dispatch`` over 8 workers whose connection answers at once
  (``bench_pool.py``'s proxy dispatch overhead).

Every round asks both builds for one block, back to back, in alternating order (as
``bench_goals.py`` does), so a drift of the machine cannot skew the ratio, which is taken per
round. The per-call medians are in ``extra_info`` (``abi3_ns``, ``full_ns``, ``abi3_over_full``
with its quartiles); the pytest-benchmark time of a round is both blocks plus the pipes and means
nothing by itself. Before timing, both builds must give the same answer on every probe, and each
must have loaded the extension it is named for.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .benchkit import CALLS_PER_ROUND

pytest.importorskip("pytest_benchmark")

BUILDS = {"abi3": "SHARDLINE_ABI3_PYTHON", "full": "SHARDLINE_FULL_PYTHON"}
ROUNDS = 1000
WARMUP = 20
ROOT = Path(__file__).resolve().parent.parent


class Worker:
    """One build's ``abi3_worker`` process."""

    def __init__(self, python: str) -> None:
        self.process = subprocess.Popen(
            [python, "-m", "benches.abi3_worker"],
            cwd=ROOT,
            # The same str hashes in both processes: one difference less between the two.
            env={**os.environ, "PYTHONHASHSEED": "0"},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def ask(self, request: str) -> Any:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(request + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        assert answer, f"abi3_worker exited with {self.process.wait(timeout=10)}"
        return json.loads(answer)

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        assert self.process.wait(timeout=30) == 0


@pytest.fixture(scope="module")
def workers() -> Iterator[dict[str, Worker]]:
    pythons = {build: os.environ.get(variable) for build, variable in BUILDS.items()}
    if not all(pythons.values()):
        pytest.skip("needs the two builds in two venvs: `make bench-abi3`")
    started = {build: Worker(python) for build, python in pythons.items() if python}
    try:
        checks = {build: worker.ask("check") for build, worker in started.items()}
        assert checks["abi3"].pop("extension").endswith(".abi3.so")
        assert not checks["full"].pop("extension").endswith(".abi3.so")
        assert checks["abi3"] == checks["full"]
        yield started
    finally:
        for worker in started.values():
            worker.close()


@pytest.mark.parametrize("path", ["owner", "route", "dispatch"])
def test_abi3_cost(
    benchmark: Any, per_call: Callable[..., Any], workers: dict[str, Worker], path: str
) -> None:
    times: dict[str, list[int]] = {"abi3": [], "full": []}
    orders = itertools.cycle([("abi3", "full"), ("full", "abi3")])
    request = f"time {path}"

    def round_() -> None:
        for build in next(orders):
            times[build].append(workers[build].ask(request))

    benchmark.group = "abi3 cost, interleaved"
    per_call(
        round_, 2 * CALLS_PER_ROUND, rounds=ROUNDS, warmup=WARMUP, impl=f"{path}, abi3 vs full"
    )
    abi3, full = times["abi3"][WARMUP:], times["full"][WARMUP:]
    ratios = [a / f for a, f in zip(abi3, full, strict=True)]
    benchmark.extra_info.update(
        abi3_ns=statistics.median(abi3) / CALLS_PER_ROUND,
        full_ns=statistics.median(full) / CALLS_PER_ROUND,
        abi3_over_full=statistics.median(ratios),
        abi3_over_full_q1_q3=statistics.quantiles(ratios, n=4)[::2],
    )
