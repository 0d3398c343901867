"""What passive health (issue 25, bullet 3) costs a dispatch on the default round-robin, with
every worker healthy and with one ejected for the whole run: ``theirs`` is without health,
``ours`` with it, timed back to back in every round, so the ratio is off / on (1.0 is free,
0.9 costs 10%).

- ``pool health dispatch``: the pool's native dispatch as the proxy makes it, an uncounted
  ``dispatch_next(None, False)`` whose result is unpacked and let go (the same Python on both
  sides); with health on, a token dispatch ends when its token is let go (a success), a timed
  one with ``finish_dispatch(uid, started)``.
- ``proxy health dispatch``: a whole ``WorkerProxy.dispatch`` with the default ``health``
  against ``health=None``, both over connections that answer at once (``bench_pool.py``'s
  ``Immediate``), so what is left is the proxy's own cost.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from shardline import DiscoveryEvent, LoadBalancerContext, WorkerMetadata, WorkerProxy
from shardline.pool import HealthPolicy

from .bench_goals import interleave
from .bench_pool import Announced, Immediate

pytest.importorskip("pytest_benchmark")

CALLS = 1000
# an ejection that outlasts the run
LASTING = HealthPolicy(base_ejection=3600.0, max_ejection=3600.0)


def record(n: int) -> WorkerMetadata:
    return WorkerMetadata(
        uid=uuid.UUID(int=n + 1), address=f"127.0.0.1:{10000 + n}", pid=n + 1, version="1"
    )


def pool(size: int) -> LoadBalancerContext:
    made = LoadBalancerContext()
    for n in range(size):
        made.add_worker(record(n), f"conn-{n}")
    return made


def eject_first(context: LoadBalancerContext) -> None:
    sick = record(0).uid
    for _ in range(5):
        _, _, started = context.start_dispatch(sick)
        context.finish_dispatch(sick, started, context.OUTCOME_FAILURE)
    assert sick not in context.workers


def dispatches(context: LoadBalancerContext, health: bool) -> Callable[[], Any]:
    """A round of ``CALLS`` native dispatches as the proxy makes them, each a success."""
    dispatch_next, finish = context.dispatch_next, context.finish_dispatch

    def with_health() -> Any:
        for _ in range(CALLS):
            picked = dispatch_next(None, False)
            assert picked is not None
            uid, _, _, started, token = picked
            del picked, token  # a token dispatch ends when its token is let go
            if started:
                finish(uid, started)

    def without() -> Any:
        for _ in range(CALLS):
            picked = dispatch_next(None, False)
            assert picked is not None
            uid, _, _, started, token = picked
            del picked, token
            if started:  # never: no histogram
                finish(uid, started)

    return with_health if health else without


@pytest.mark.parametrize("size", [8, 1024])
@pytest.mark.parametrize("scenario", ["all healthy", "one ejected"])
def test_health_dispatch_cost_interleaved(
    benchmark: Any, per_call: Callable[..., Any], scenario: str, size: int
) -> None:
    off, on = pool(size), pool(size)
    on.configure_health(LASTING)
    if scenario == "one ejected":
        eject_first(on)
    benchmark.group = f"pool health dispatch, {size:,} workers, interleaved"
    interleave(
        benchmark,
        per_call,
        dispatches(on, True),
        dispatches(off, False),
        CALLS,
        impl=f"health on ({scenario}) vs off, {size:,} workers",
    )
    healthy = size - (scenario == "one ejected")
    assert len(on.workers) == healthy
    assert on.health_counts()[0] == size - healthy
    assert all(on.load(uid)[0] == 0 for uid in on.workers)  # every dispatch ended
    # each worker's timed dispatches gave it a latency average
    assert all(on.load(uid)[1] > 0 for uid in on.workers)


async def proxy(size: int, health: HealthPolicy | None) -> tuple[WorkerProxy, list[Immediate]]:
    connections: list[Immediate] = []

    def connect(metadata: WorkerMetadata) -> Immediate:
        connections.append(Immediate())
        return connections[-1]

    events = [DiscoveryEvent("worker-added", record(n)) for n in range(size)]
    made = WorkerProxy(discovery=Announced(events), connect=connect, quorum=size, health=health)
    await made.start()
    return made, connections


@pytest.mark.parametrize("size", [8, 1024])
def test_proxy_health_cost_interleaved(
    benchmark: Any, per_call: Callable[..., Any], size: int
) -> None:
    loop = asyncio.new_event_loop()
    ours, ours_connections = loop.run_until_complete(proxy(size, HealthPolicy()))
    theirs, theirs_connections = loop.run_until_complete(proxy(size, None))

    def block(made: WorkerProxy) -> Callable[[], Any]:
        async def calls() -> Any:
            dispatch = made.dispatch
            last = None
            for task in range(CALLS):
                last = await dispatch(task)
            return last

        return lambda: loop.run_until_complete(calls())

    benchmark.group = f"proxy health dispatch, {size:,} workers, interleaved"
    interleave(
        benchmark,
        per_call,
        block(ours),
        block(theirs),
        CALLS,
        impl=f"WorkerProxy.dispatch, health on vs health=None, {size:,} workers",
    )
    ours_calls = sum(c.calls for c in ours_connections)
    assert ours_calls == sum(c.calls for c in theirs_connections) > size
    assert ours.stats().ejections == 0
    assert all(load == 0 for load, _ in map(ours._context.load, ours._context.uids()))
    loop.run_until_complete(ours.stop())
    loop.run_until_complete(theirs.stop())
    loop.close()
