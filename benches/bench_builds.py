"""What one build of shardline costs on the hot paths against another, interleaved.

Two builds live in two virtualenvs of the same interpreter, described by ``SHARDLINE_BUILDS``
(JSON: two objects with the build's ``name``, its venv's ``python`` and, optionally, the
``extension`` suffix its ``_core`` file must end with, or ``"!SUFFIX"`` for one it must not);
``benches/build_cost.py`` makes them and sets it, and ``make bench-abi3`` (the abi3 wheel against
its full-API build) and ``make bench-instrumentation`` (this tree against a base revision) run
it. Without it this module skips. Each build runs ``build_worker.py``, which times one block of
a path when asked:

- ``owner``: ``Topology.owner`` of a bucket, 3,000 buckets in 256 ranges (``bench_lookup.py``);
- ``route``: ``Topology.route`` of a str key, the same map (``bench_hashing.py``'s keys);
- ``route_many``: ``Topology.route_many`` of an int64 array of 100,000 keys, the same map
  (``bench_route_many.py``'s; per key);
- ``dispatch``: ``WorkerProxy.dispatch`` over 8 workers whose connection answers at once
  (``bench_pool.py``'s proxy dispatch overhead).

Every round asks both builds for one block, back to back, in alternating order (as
``bench_goals.py`` does), so a drift of the machine cannot skew the ratio, which is taken per
round. The per-call medians are in ``extra_info`` (``a_ns`` and ``b_ns`` for the first and the
second build, named in ``a`` and ``b``; ``a_over_b`` with its quartiles); the pytest-benchmark
time of a round is both blocks plus the pipes and means nothing by itself. Before timing, both
builds must give the same answer on every probe, and each must have loaded the extension it is
described with.
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

from .build_worker import BLOCK

pytest.importorskip("pytest_benchmark")

ROUNDS = 1000
WARMUP = 20
ROOT = Path(__file__).resolve().parent.parent


class Worker:
    """One build's ``build_worker`` process."""

    def __init__(self, python: str) -> None:
        self.process = subprocess.Popen(
            [python, "-m", "benches.build_worker"],
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
        assert answer, f"build_worker exited with {self.process.wait(timeout=10)}"
        return json.loads(answer)

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        assert self.process.wait(timeout=30) == 0


def loaded_as_described(extension: str, expected: str | None) -> bool:
    if expected is None:
        return True
    if expected.startswith("!"):
        return not extension.endswith(expected[1:])
    return extension.endswith(expected)


@pytest.fixture(scope="module")
def workers() -> Iterator[list[tuple[str, Worker]]]:
    described = os.environ.get("SHARDLINE_BUILDS")
    if not described:
        pytest.skip(
            "needs two builds in two venvs: `make bench-abi3` or `make bench-instrumentation`"
        )
    builds = json.loads(described)
    assert len(builds) == 2, "SHARDLINE_BUILDS describes two builds"
    started = [(build["name"], Worker(build["python"])) for build in builds]
    try:
        checks = [worker.ask("check") for _, worker in started]
        for build, check in zip(builds, checks, strict=True):
            extension = check.pop("extension")
            assert loaded_as_described(extension, build.get("extension")), (build, extension)
        assert checks[0] == checks[1]
        yield started
    finally:
        for _, worker in started:
            worker.close()


@pytest.mark.parametrize("path", list(BLOCK))
def test_build_cost(
    benchmark: Any, per_call: Callable[..., Any], workers: list[tuple[str, Worker]], path: str
) -> None:
    (a, first), (b, second) = workers
    times: dict[str, list[int]] = {a: [], b: []}
    orders = itertools.cycle([((a, first), (b, second)), ((b, second), (a, first))])
    request = f"time {path}"

    def round_() -> None:
        for name, worker in next(orders):
            times[name].append(worker.ask(request))

    benchmark.group = f"build cost, interleaved: {a} vs {b}"
    per_call(round_, 2 * BLOCK[path], rounds=ROUNDS, warmup=WARMUP, impl=f"{path}, {a} vs {b}")
    a_times, b_times = times[a][WARMUP:], times[b][WARMUP:]
    ratios = [x / y for x, y in zip(a_times, b_times, strict=True)]
    benchmark.extra_info.update(
        a=a,
        b=b,
        a_ns=statistics.median(a_times) / BLOCK[path],
        b_ns=statistics.median(b_times) / BLOCK[path],
        a_over_b=statistics.median(ratios),
        a_over_b_q1_q3=statistics.quantiles(ratios, n=4)[::2],
    )
