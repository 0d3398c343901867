"""What passive health (issue 25, bullet 3) costs a dispatch: the pool's native round-robin
dispatch, ``dispatch_next(None, True)`` then ``finish_dispatch(uid, started)`` (a success), on
a pool with health configured against the same pool without, timed back to back in every round.

Two scenarios: health on with every worker healthy (the common case: each read checks one
pool-wide count), and health on with one worker ejected for the whole run (every read checks
each worker it passes, at one clock reading per call). ``theirs`` is the pool without health,
``ours`` the pool with it, so the ratio is off / on: 1.0 is free, 0.9 costs 10%.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from shardline import LoadBalancerContext, WorkerMetadata
from shardline.pool import HealthPolicy

from .bench_goals import interleave

pytest.importorskip("pytest_benchmark")

CALLS = 1000


def record(n: int) -> WorkerMetadata:
    return WorkerMetadata(
        uid=uuid.UUID(int=n + 1), address=f"127.0.0.1:{10000 + n}", pid=n + 1, version="1"
    )


def pool(size: int) -> LoadBalancerContext:
    made = LoadBalancerContext()
    for n in range(size):
        made.add_worker(record(n), f"conn-{n}")
    return made


def dispatches(context: LoadBalancerContext) -> Callable[[], Any]:
    """A round of ``CALLS`` counted dispatches, each finished as a success at once."""
    dispatch_next, finish = context.dispatch_next, context.finish_dispatch

    def round_() -> Any:
        for _ in range(CALLS):
            uid, _, _, started = dispatch_next(None, True)
            finish(uid, started)

    return round_


@pytest.mark.parametrize("size", [8, 1024])
@pytest.mark.parametrize("scenario", ["all healthy", "one ejected"])
def test_health_dispatch_cost_interleaved(
    benchmark: Any, per_call: Callable[..., Any], scenario: str, size: int
) -> None:
    off, on = pool(size), pool(size)
    # an ejection that outlasts the run
    on.configure_health(HealthPolicy(base_ejection=3600.0, max_ejection=3600.0))
    if scenario == "one ejected":
        sick = record(0).uid
        for _ in range(5):
            _, _, started = on.start_dispatch(sick)
            on.finish_dispatch(sick, started, on.OUTCOME_FAILURE)
        assert sick not in on.workers
    benchmark.group = f"pool health dispatch, {size:,} workers, interleaved"
    interleave(
        benchmark,
        per_call,
        dispatches(on),
        dispatches(off),
        CALLS,
        impl=f"health on ({scenario}) vs off, {size:,} workers",
    )
    healthy = size - (scenario == "one ejected")
    assert len(on.workers) == healthy
    assert on.health_counts()[0] == size - healthy
    assert all(on.load(uid)[0] == 0 for uid in on.workers)  # every dispatch was finished
