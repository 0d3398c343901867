"""RoundRobinLoadBalancer: the seed's cases 16-34 (`TestRoundRobinLoadBalancer`)."""

from __future__ import annotations

import asyncio
import gc
import pickle
import uuid
import weakref
from collections.abc import Iterator, Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardline import LoadBalancerContext, LoadBalancerLike, RoundRobinLoadBalancer, WorkerMetadata
from support.balancer_driving import all_failing, fail, first, served_by, start, succeed
from support.workers import worker

pytestmark = pytest.mark.usefixtures("balancer_protocol")  # each test through both protocols


def pool(*ns: int) -> LoadBalancerContext:
    context = LoadBalancerContext()
    for n in ns:
        context.add_worker(worker(n), f"conn-{n}")
    return context


def uid(n: int) -> uuid.UUID:
    return worker(n).uid


def test_it_is_a_load_balancer() -> None:
    assert isinstance(RoundRobinLoadBalancer(), LoadBalancerLike)


async def test_case16_empty_pool_yields_nothing() -> None:
    assert await all_failing(RoundRobinLoadBalancer(), pool()) == []


async def test_case17_a_single_worker_is_offered() -> None:
    assert await all_failing(RoundRobinLoadBalancer(), pool(1)) == [uid(1)]


async def test_case18_a_new_call_starts_past_the_served_worker() -> None:
    balancer, context = RoundRobinLoadBalancer(), pool(1, 2, 3)
    assert await served_by(balancer, context) == uid(1)
    assert await served_by(balancer, context) == uid(2)


async def test_case19_a_failure_advances_to_the_next_uid() -> None:
    async def scenario() -> list[uuid.UUID | None]:
        gen = start(RoundRobinLoadBalancer(), None, pool(1, 2, 3))
        return [await first(gen), await fail(gen)]

    assert await scenario() == [uid(1), uid(2)]


async def test_case20_every_worker_failing_ends_the_cycle() -> None:
    assert await all_failing(RoundRobinLoadBalancer(), pool(1, 2, 3)) == [uid(1), uid(2), uid(3)]


async def test_case21_a_worker_evicted_mid_cycle_is_skipped() -> None:
    context = pool(1, 2, 3)
    offered = await all_failing(
        RoundRobinLoadBalancer(), context, after_first=lambda: context.remove_worker(worker(2))
    )
    assert offered == [uid(1), uid(3)]


async def test_case22_success_ends_the_cycle() -> None:
    async def scenario() -> bool:
        gen = start(RoundRobinLoadBalancer(), None, pool(1, 2))
        candidate = await first(gen)
        assert candidate is not None
        return await succeed(gen, candidate)

    assert await scenario()


async def test_case23_failures_before_a_success_follow_rotation_order() -> None:
    async def scenario() -> list[uuid.UUID | None]:
        gen = start(RoundRobinLoadBalancer(), None, pool(1, 2, 3, 4))
        offered = [await first(gen), await fail(gen), await fail(gen)]
        last = offered[-1]
        assert last is not None
        assert await succeed(gen, last)
        return offered

    assert await scenario() == [uid(1), uid(2), uid(3)]


async def test_case24_successive_calls_rotate_the_starting_worker() -> None:
    balancer, context = RoundRobinLoadBalancer(), pool(1, 2, 3)
    starts = [await served_by(balancer, context) for _ in range(6)]
    assert starts == [uid(1), uid(2), uid(3), uid(1), uid(2), uid(3)]


async def test_case25_concurrent_drivers_are_offered_distinct_workers() -> None:
    async def scenario() -> tuple[uuid.UUID | None, uuid.UUID | None]:
        balancer, context = RoundRobinLoadBalancer(), pool(1, 2, 3)
        one = start(balancer, None, context)
        two = start(balancer, None, context)
        return await first(one), await first(two)

    a, b = await scenario()
    assert a is not None
    assert b is not None
    assert a != b


async def test_case26_evicting_the_boundary_worker_still_ends_the_call() -> None:
    async def scenario() -> list[uuid.UUID]:
        context = pool(1, 2, 3)
        gen = start(RoundRobinLoadBalancer(), None, context)
        offered = [await first(gen)]
        context.remove_worker(worker(1))  # the boundary: it can never recur
        candidate = await fail(gen)
        while candidate is not None:
            offered.append(candidate)
            assert len(offered) < 10, "the cycle did not end"
            candidate = await fail(gen)
        return [u for u in offered if u is not None]

    offered = await scenario()
    assert offered[:3] == [uid(1), uid(2), uid(3)]


async def test_case27_a_worker_evicted_after_the_snapshot_is_skipped() -> None:
    async def scenario() -> list[uuid.UUID]:
        balancer, context = RoundRobinLoadBalancer(), pool(1, 2, 3)
        gen = start(balancer, None, context)
        offered = [await first(gen)]  # the snapshot of this wrap holds 1, 2, 3
        context.remove_worker(worker(3))
        candidate = await fail(gen)
        while candidate is not None:
            offered.append(candidate)
            candidate = await fail(gen)
        return [u for u in offered if u is not None]

    assert await scenario() == [uid(1), uid(2)]


async def test_case28_a_sole_worker_refreshed_after_its_yield_exhausts_the_cycle() -> None:
    async def scenario() -> list[uuid.UUID | None]:
        context = pool(1)
        gen = start(RoundRobinLoadBalancer(), None, context)
        offered = [await first(gen)]
        context.update_worker(worker(1, address="moved"), "conn-moved")
        offered.append(await fail(gen))
        return offered

    assert await scenario() == [uid(1), None]


async def test_case29_after_a_refresh_a_new_call_offers_the_uid_again() -> None:
    balancer, context = RoundRobinLoadBalancer(), pool(1)
    assert await all_failing(balancer, context) == [uid(1)]
    context.update_worker(worker(1, address="moved"), "conn-moved")
    assert await all_failing(balancer, context) == [uid(1)]
    assert context.workers[uid(1)] == (worker(1, address="moved"), "conn-moved")


async def test_case30_a_refresh_ahead_in_the_cycle_changes_the_record_not_the_cycle() -> None:
    async def scenario() -> list[uuid.UUID]:
        context = pool(1, 2, 3)
        gen = start(RoundRobinLoadBalancer(), None, context)
        offered = [await first(gen)]
        context.update_worker(worker(3, pid=9), "conn-3b")
        candidate = await fail(gen)
        while candidate is not None:
            offered.append(candidate)
            candidate = await fail(gen)
        return [u for u in offered if u is not None]

    assert await scenario() == [uid(1), uid(2), uid(3)]


async def test_case31_the_boundary_survives_its_own_refresh() -> None:
    async def scenario() -> list[uuid.UUID]:
        context = pool(1, 2)
        gen = start(RoundRobinLoadBalancer(), None, context)
        offered = [await first(gen)]
        context.update_worker(worker(1, version="2"), "conn-1b")
        candidate = await fail(gen)
        while candidate is not None:
            offered.append(candidate)
            assert len(offered) < 10
            candidate = await fail(gen)
        return [u for u in offered if u is not None]

    assert await scenario() == [uid(1), uid(2)]


@settings(max_examples=200, deadline=None)
@given(
    size=st.integers(2, 6),
    warmup=st.integers(0, 8),
    refresh_step=st.integers(0, 12),
    refreshed=st.integers(0, 5),
)
def test_case32_every_call_ends_within_bounds(
    size: int, warmup: int, refresh_step: int, refreshed: int
) -> None:
    balancer, context = RoundRobinLoadBalancer(), pool(*range(size))
    for _ in range(warmup):
        asyncio.run(served_by(balancer, context))

    async def scenario() -> list[uuid.UUID]:
        gen = start(balancer, None, context)
        offered: list[uuid.UUID] = []
        candidate = await first(gen)
        while candidate is not None:
            offered.append(candidate)
            assert len(offered) <= size, "a call offered more candidates than workers"
            if len(offered) == refresh_step:
                n = refreshed % size
                context.update_worker(worker(n, pid=len(offered)), f"conn-{n}-refreshed")
            candidate = await fail(gen)
        return offered

    offered = asyncio.run(scenario())
    assert sorted(offered) == sorted(uid(n) for n in range(size))


class CountingWorkers(Mapping[uuid.UUID, tuple[WorkerMetadata, str]]):
    """A duck-typed context's workers mapping that counts full iterations (snapshots)."""

    def __init__(self, ns: range) -> None:
        self._data = {uid(n): (worker(n), f"conn-{n}") for n in ns}
        self.iterations = 0

    def __getitem__(self, key: uuid.UUID) -> tuple[WorkerMetadata, str]:
        return self._data[key]

    def __iter__(self) -> Iterator[uuid.UUID]:
        self.iterations += 1
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


class DuckContext:
    def __init__(self, workers: CountingWorkers) -> None:
        self.workers = workers


async def test_case33_the_pool_is_snapshotted_once_per_wrap() -> None:
    balancer = RoundRobinLoadBalancer()
    workers = CountingWorkers(range(50))
    context = DuckContext(workers)
    served = [await served_by(balancer, context) for _ in range(150)]
    assert served == [uid(n % 50) for n in range(150)]
    assert workers.iterations == 3


async def test_case34_the_balancer_does_not_pin_a_retired_context() -> None:
    balancer, context = RoundRobinLoadBalancer(), pool(1, 2)
    await served_by(balancer, context)
    probe = weakref.ref(context)
    del context
    gc.collect()
    assert probe() is None


async def test_the_rotation_of_a_retired_context_is_released_with_it() -> None:
    # a context without a rotation of its own: the balancer keeps one for it, weakly
    balancer, context = RoundRobinLoadBalancer(), DuckContext(CountingWorkers(range(2)))
    await served_by(balancer, context)
    rotation = weakref.ref(balancer._rotations.of(context))
    del context
    gc.collect()
    assert rotation() is None


async def test_pickling_drops_the_rotations() -> None:
    balancer, context = RoundRobinLoadBalancer(), DuckContext(CountingWorkers(range(1, 4)))
    await served_by(balancer, context)
    copy = pickle.loads(pickle.dumps(balancer))
    assert await served_by(copy, context) == uid(1)
    assert await served_by(balancer, context) == uid(2)


async def test_the_rotation_of_a_pool_is_the_pools_own() -> None:
    # The rotation moved into the pool (issue 12): every balancer on a pool, a pickled copy
    # included, continues the same rotation, and the balancer keeps no state for the pool.
    balancer, context = RoundRobinLoadBalancer(), pool(1, 2, 3)
    await served_by(balancer, context)
    copy = pickle.loads(pickle.dumps(balancer))
    assert await served_by(copy, context) == uid(2)
    assert await served_by(RoundRobinLoadBalancer(), context) == uid(3)
    assert await served_by(balancer, context) == uid(1)
    assert len(balancer._rotations) == 0
