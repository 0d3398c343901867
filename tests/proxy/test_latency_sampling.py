"""The dispatch latency histogram samples the round-robin native path (issue 15: with latency
measured, dispatch costs at most 10% more).

The pool times one in ``DISPATCH_SAMPLE`` of the dispatches ``dispatch_next`` hands out
uncounted, exactly the Nth, 2Nth… of its tally, and never counts them in flight; a balancer
that needs the load, on the native path or not, still has every dispatch counted and timed.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardline import (
    DiscoveryEvent,
    LeastLoadedLoadBalancer,
    RoundRobinLoadBalancer,
    TransientRpcError,
    WorkerMetadata,
    WorkerProxy,
)
from shardline.pool.context import LoadBalancerContext
from shardline.pool.health import HealthPolicy

N = LoadBalancerContext.DISPATCH_SAMPLE


def record(n: int) -> WorkerMetadata:
    return WorkerMetadata(uid=uuid.UUID(int=n), address=f"127.0.0.1:{7000 + n}", pid=n, version="1")


class LoadedRoundRobin(RoundRobinLoadBalancer):
    """The round-robin rotation, served natively, for a balancer that needs the load."""

    needs_load = True


class Watched:
    """A connection that records, while it runs, how many dispatches the pool counts in
    flight to its worker, and fails transiently when told to."""

    def __init__(self, pool: LoadBalancerContext, metadata: WorkerMetadata) -> None:
        self.pool = pool
        self.uid = metadata.uid
        self.in_flight: list[int] = []
        self.fail = False
        self.delay = 0.0

    async def dispatch(self, task: Any, *, timeout: float | None = None) -> Any:
        self.in_flight.append(self.pool.load(self.uid)[0])
        await asyncio.sleep(self.delay)
        if self.fail:
            raise TransientRpcError("busy")
        return task


async def announced(workers: int) -> AsyncIterator[DiscoveryEvent]:
    for n in range(1, workers + 1):
        yield DiscoveryEvent("worker-added", record(n))
    await asyncio.Event().wait()


class Fleet:
    def __init__(self, balancer: Any, workers: int, health: HealthPolicy | None = None) -> None:
        self.connections: list[Watched] = []
        self.proxy = WorkerProxy(
            discovery=announced(workers),
            loadbalancer=balancer,
            connect=self.connect,
            quorum=workers,
            # health counts and times dispatches of its own: by default, the paths without
            health=health,
        )
        self.pool: LoadBalancerContext = self.proxy._context

    def connect(self, metadata: WorkerMetadata) -> Watched:
        connection = Watched(self.pool, metadata)
        self.connections.append(connection)
        return connection

    def in_flight(self) -> list[int]:
        return [n for connection in self.connections for n in connection.in_flight]

    def timed(self) -> int:
        latency = self.proxy.stats().latency
        assert latency is not None
        return latency.count


def test_the_pool_samples_exactly_every_nth_uncounted_dispatch_once_timing() -> None:
    pool = LoadBalancerContext()
    for n in (1, 2, 3):
        pool.add_worker(record(n), f"conn-{n}")
    before = [pool.dispatch_next()[3] for _ in range(2 * N)]  # type: ignore[index]
    assert before == [0] * (2 * N)  # not timing: nothing sampled
    pool.time_dispatches()
    picks = [pool.dispatch_next() for _ in range(3 * N)]
    sampled = [2 * N + i + 1 for i, picked in enumerate(picks) if picked and picked[3]]
    assert sampled == [3 * N, 4 * N, 5 * N]  # the pool's Nth, 2Nth… dispatch, never more
    assert all(pool.load(record(n).uid) == (0, 0.0) for n in (1, 2, 3))
    for picked in picks:
        assert picked is not None
        if picked[3]:
            pool.observe_dispatch(picked[3])
    assert all(pool.load(record(n).uid) == (0, 0.0) for n in (1, 2, 3))  # no load kept
    dispatched, latency = pool.dispatch_counts()
    assert dispatched == 5 * N
    assert latency is not None
    assert sum(latency[0]) == 3
    assert latency[1] > 0


def test_a_counted_dispatch_next_is_always_timed() -> None:
    pool = LoadBalancerContext()
    pool.add_worker(record(1), "conn-1")
    pool.time_dispatches()
    picks = [pool.dispatch_next(None, True) for _ in range(N + 1)]
    assert all(picked is not None and picked[3] > 0 for picked in picks)
    assert pool.load(record(1).uid)[0] == N + 1


@settings(max_examples=30, deadline=None)
@given(calls=st.integers(0, 5 * N), workers=st.integers(1, 4), before=st.integers(0, 2 * N))
def test_the_native_path_times_only_the_sampled_dispatches_and_counts_none_in_flight(
    calls: int, workers: int, before: int
) -> None:
    async def scenario() -> None:
        fleet = Fleet(RoundRobinLoadBalancer, workers)
        await fleet.proxy.start()
        for task in range(before):  # dispatched before measuring: in the tally, not timed
            await fleet.proxy.dispatch(task)
        fleet.proxy.measure_latency()
        for task in range(calls):
            assert await fleet.proxy.dispatch(task) == task
        stats = fleet.proxy.stats()
        assert stats.dispatched == before + calls  # exact, sampled or not
        assert fleet.timed() == (before + calls) // N - before // N
        assert fleet.in_flight() == [0] * (before + calls)
        await fleet.proxy.stop()

    asyncio.run(scenario())


async def test_with_health_on_the_histogram_takes_only_its_sampled_native_dispatches() -> None:
    """Health times some native dispatches for itself (every one to a worker slower than
    ``stuck_floor / stuck_multiple``, one in ``HEALTH_TIMED_EVERY`` to a fast one): the
    histogram must not take those, or it would weigh the slow worker's latencies more."""
    fleet = Fleet(RoundRobinLoadBalancer, 3, health=HealthPolicy())
    await fleet.proxy.start()
    policy = HealthPolicy()
    fleet.connections[0].delay = 2 * policy.stuck_floor / policy.stuck_multiple
    fleet.proxy.measure_latency()
    calls = 6 * max(N, LoadBalancerContext.HEALTH_TIMED_EVERY)
    for task in range(calls):
        assert await fleet.proxy.dispatch(task) == task
    assert fleet.pool.dispatch_counts()[0] == calls
    assert fleet.timed() == calls // N
    assert fleet.proxy.stats().ejections == 0
    await fleet.proxy.stop()


@pytest.mark.parametrize("balancer", [LoadedRoundRobin, LeastLoadedLoadBalancer])
async def test_a_balancer_that_needs_the_load_has_every_dispatch_counted_and_timed(
    balancer: Any,
) -> None:
    fleet = Fleet(balancer, 3)
    await fleet.proxy.start()
    assert fleet.proxy.explain("task").protocol == (
        "pool-rotation" if balancer is LoadedRoundRobin else "pool-least-loaded"
    )
    fleet.proxy.measure_latency()
    for task in range(3 * N + 1):
        await fleet.proxy.dispatch(task)
    assert fleet.timed() == fleet.proxy.stats().dispatched == 3 * N + 1
    assert fleet.in_flight() == [1] * (3 * N + 1)
    assert all(fleet.pool.load(record(n).uid)[1] > 0 for n in (1, 2, 3))
    await fleet.proxy.stop()


async def test_after_a_native_failure_the_retries_through_select_are_all_timed() -> None:
    fleet = Fleet(RoundRobinLoadBalancer, 3)
    await fleet.proxy.start()
    fleet.proxy.measure_latency()
    fleet.connections[0].fail = True
    for task in range(N):  # a call that meets worker 1 first retries through select
        await fleet.proxy.dispatch(task)
    stats = fleet.proxy.stats()
    retries = stats.transient
    assert retries > 0
    assert fleet.pool.dispatch_counts()[0] == N
    assert stats.dispatched == N + retries
    assert fleet.timed() == 1 + retries  # the Nth native dispatch, and every retry
    assert all(fleet.pool.load(record(n).uid)[0] == 0 for n in (1, 2, 3))
    await fleet.proxy.stop()
