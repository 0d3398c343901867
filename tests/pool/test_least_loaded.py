"""LeastLoadedLoadBalancer and the load the proxy keeps for it."""

from __future__ import annotations

import random
import uuid
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardline import LoadBalancerContext, LoadBalancerLike
from shardline.balancers.least_loaded import LeastLoadedLoadBalancer
from shardline.balancers.protocol import NOTHING_TRIED
from support.balancer_driving import start
from support.least_loaded_model import Loads, cost
from support.observed_load import load_during_and_after
from support.workers import worker

pytestmark = pytest.mark.usefixtures("balancer_protocol")  # each test through both protocols
START = 10**12  # the pools' pinned clock, ns
MS = 1_000_000


def pool(*ns: int) -> LoadBalancerContext:
    context = LoadBalancerContext()
    for n in ns:
        context.add_worker(worker(n), f"conn-{n}")
    return context


async def first_choice(balancer: LeastLoadedLoadBalancer, context: Any) -> uuid.UUID:
    gen = start(balancer, None, context)
    uid = await anext(gen)
    await gen.aclose()
    return uid


async def first_choices(context: Any, calls: int, seed: int = 1) -> Counter[uuid.UUID]:
    balancer = LeastLoadedLoadBalancer(random.Random(seed))
    return Counter([await first_choice(balancer, context) for _ in range(calls)])


def test_it_is_a_load_balancer() -> None:
    assert isinstance(LeastLoadedLoadBalancer(), LoadBalancerLike)


async def test_the_busiest_worker_is_never_the_first_choice() -> None:
    context = pool(1, 2, 3)
    for _ in range(5):
        context.begin_dispatch(worker(1).uid)
    counts = await first_choices(context, 1000)
    assert counts[worker(1).uid] == 0
    assert counts[worker(2).uid] + counts[worker(3).uid] == 1000


async def test_equal_load_prefers_the_lower_latency_in_each_pair() -> None:
    context = pool(1, 2, 3)
    for n, seconds in ((1, 0.001), (2, 0.010), (3, 0.100)):
        context.begin_dispatch(worker(n).uid)
        context.end_dispatch(worker(n).uid, seconds)
    counts = await first_choices(context, 3000)
    # The fastest wins 2 of the 3 pairs, the middle one 1, the slowest none (tolerance ±5%).
    assert counts[worker(3).uid] == 0
    assert abs(counts[worker(1).uid] / 3000 - 2 / 3) < 0.05
    assert abs(counts[worker(2).uid] / 3000 - 1 / 3) < 0.05


async def test_each_worker_is_offered_once_per_call() -> None:
    async def scenario() -> list[uuid.UUID]:
        gen = start(LeastLoadedLoadBalancer(random.Random(3)), None, pool(1, 2, 3, 4))
        offered = [await anext(gen)]
        while True:
            try:
                offered.append(await gen.athrow(RuntimeError("failed")))
            except StopAsyncIteration:
                return offered

    offered = await scenario()
    assert sorted(offered) == sorted(worker(n).uid for n in (1, 2, 3, 4))


async def test_a_context_without_load_is_a_random_choice() -> None:
    class Plain:
        def __init__(self) -> None:
            self.workers = {worker(n).uid: (worker(n), None) for n in range(4)}

    counts = await first_choices(Plain(), 4000)
    assert all(800 < counts[worker(n).uid] < 1200 for n in range(4))


def test_load_tracks_inflight_dispatches_and_a_latency_average_across_refreshes() -> None:
    context = pool(1, 2)
    context._pin_clock(START)
    model = Loads.of(2)
    uid = worker(1).uid
    assert context.begin_dispatch(uid) == (worker(1), "conn-1")
    context.begin_dispatch(uid)
    assert context.load(uid) == (2, 0.0)
    assert context.load(worker(2).uid) == (0, 0.0)  # no latency anywhere yet
    context.end_dispatch(uid, 0.2)
    context.update_worker(worker(1, address="moved"), "conn-moved")  # the load stays
    context.end_dispatch(uid, 0.4)
    assert context.load(uid) == (0, pytest.approx(0.2 + 0.2 * (0.4 - 0.2)))
    context.end_dispatch(uid, 0.1)  # more ends than begins: never below zero
    assert context.load(uid)[0] == 0
    for seconds in (0.2, 0.4, 0.1):
        model.sample(0, seconds, START)
    # never measured: the pool's mean latency, over every worker's samples
    assert context.load(worker(2).uid) == (0, model.mean)
    assert model.mean == pytest.approx(0.2 + (0.4 - 0.2) / 32 + (0.1 - 0.20625) / 32)


def test_a_latency_not_measured_lately_moves_toward_the_pools_mean() -> None:
    context = pool(1, 2)
    context._pin_clock(START)
    model = Loads.of(2)
    slow, fast = worker(1).uid, worker(2).uid
    for uid, n, seconds in ((slow, 0, 0.010), *[(fast, 1, 0.001)] * 100):
        context.begin_dispatch(uid)
        context.end_dispatch(uid, seconds)
        model.sample(n, seconds, START)
    assert context.load(slow) == (0, 0.010)  # measured just now: its own average
    assert model.mean is not None
    for ms in (50, 100, 1000, 10_000):
        context._pin_clock(START + ms * MS)
        assert context.load(slow) == (0, model.weighed(0, START + ms * MS))
    context._pin_clock(START + 100 * MS)  # halfway after 0.1 s
    assert context.load(slow)[1] == pytest.approx((0.010 + model.mean) / 2)
    context._pin_clock(START + 10_000 * MS)
    assert context.load(slow)[1] == pytest.approx(model.mean + (0.010 - model.mean) / 101)


async def test_a_slow_worker_is_offered_again_once_its_average_is_old() -> None:
    """Least-loaded stops sending to a worker it rates slow, so nothing measures it again:
    its average ages toward the pool's mean until it is a candidate, and the dispatch it then
    gets measures it (still slow: avoided again at once)."""
    context = pool(1, 2)
    context._pin_clock(START)
    slow, fast = worker(1).uid, worker(2).uid
    for uid, seconds in ((slow, 0.010), *[(fast, 0.001)] * 100):
        context.begin_dispatch(uid)
        context.end_dispatch(uid, seconds)
    context.begin_dispatch(fast)  # one in flight: it costs 2 ms, the slow one 10 ms
    assert set((await first_choices(context, 50)).elements()) == {fast}
    context._pin_clock(START + 10_000 * MS)
    assert set((await first_choices(context, 50)).elements()) == {slow}
    context.begin_dispatch(slow)
    context.end_dispatch(slow, 0.010)
    assert set((await first_choices(context, 50)).elements()) == {fast}


def test_a_worker_not_measured_yet_is_weighed_as_an_average_one() -> None:
    context = pool(1, 2, 3)
    context._pin_clock(START)
    for n, seconds in ((1, 0.002), (2, 0.004)):
        for _ in range(40):
            context.begin_dispatch(worker(n).uid)
            context.end_dispatch(worker(n).uid, seconds)
    new = worker(3).uid
    mean = context.load(new)[1]
    assert 0.002 < mean < 0.004
    # against the slower worker the new one wins, against the faster it loses, either way
    assert context.less_loaded_of(1, 2) == context.less_loaded_of(2, 1) == new
    assert context.less_loaded_of(0, 2) == context.less_loaded_of(2, 0) == worker(1).uid


def test_the_load_leaves_with_the_worker() -> None:
    context = pool(1)
    context.begin_dispatch(worker(1).uid)
    context.remove_worker(worker(1))
    context.end_dispatch(worker(1).uid, 0.3)  # a dispatch ending after its worker left
    assert context.load(worker(1).uid) == (0, 0.0)
    context.add_worker(worker(1), "again")
    assert context.load(worker(1).uid) == (0, 0.0)
    with pytest.raises(KeyError):
        context.begin_dispatch(worker(2).uid)


async def test_the_proxy_keeps_the_load_during_and_after_a_dispatch() -> None:
    seen, (inflight_after, latency) = await load_during_and_after(LeastLoadedLoadBalancer)
    assert seen == [(1, 0.0)]
    assert inflight_after == 0
    assert latency > 0.0


class ListedPool:
    """The same workers and loads as a pool, but not a ``WorkerPool``: the balancer lists them
    (the general path, the reference for the pool's own draw)."""

    def __init__(self, context: LoadBalancerContext) -> None:
        self.workers = dict(context.workers)
        self.load = context.load


@settings(max_examples=200)
@given(
    size=st.integers(0, 12),
    evicted=st.sets(st.integers(0, 11)),
    loads=st.lists(st.tuples(st.integers(0, 3), st.sampled_from([0.0, 0.5, 1.0])), max_size=12),
    seed=st.integers(0, 2**32),
)
def test_the_pools_own_draw_picks_what_listing_the_workers_picks(
    size: int, evicted: set[int], loads: list[tuple[int, float]], seed: int
) -> None:
    context = pool(*range(size))
    context._pin_clock(START)  # the two paths read load at one moment
    for n in evicted & set(range(size - 1)):  # holes in the admission order, the last kept
        context.remove_worker(worker(n))
    for uid, (in_flight, latency) in zip(list(context.workers), loads, strict=False):
        if latency:
            context.begin_dispatch(uid)
            context.end_dispatch(uid, latency)
        for _ in range(in_flight):
            context.begin_dispatch(uid)
    fast = LeastLoadedLoadBalancer(random.Random(seed))
    listed = LeastLoadedLoadBalancer(random.Random(seed))
    reference = ListedPool(context)
    for _ in range(4):
        assert fast.select(None, context=context, tried=NOTHING_TRIED) == listed.select(
            None, context=reference, tried=NOTHING_TRIED
        )


@settings(max_examples=200)
@given(
    samples=st.lists(
        st.tuples(
            st.integers(0, 5), st.sampled_from([0.001, 0.002, 0.01, 0.1]), st.integers(0, 300)
        ),
        max_size=20,
    ),
    in_flight=st.lists(st.integers(0, 12), min_size=6, max_size=6),
    later=st.integers(0, 2_000),
    size=st.integers(1, 6),
)
def test_less_loaded_of_weighs_as_the_reference_model(
    samples: list[tuple[int, float, int]], in_flight: list[int], later: int, size: int
) -> None:
    """Samples on some workers at moments ``ms`` apart, calls in flight, then the clock moved
    on: each pair's choice, and each worker's ``load``, are the model's to the bit."""
    context = pool(*range(size))
    model = Loads.of(size)
    uids = list(context.workers)
    now = START
    context._pin_clock(now)
    for n, seconds, ms in samples:
        if n < size:
            now += ms * MS
            context._pin_clock(now)
            context.begin_dispatch(uids[n])
            context.end_dispatch(uids[n], seconds)
            model.sample(n, seconds, now)
    for uid, count in zip(uids, in_flight, strict=False):
        for _ in range(count):
            context.begin_dispatch(uid)
    now += later * MS
    context._pin_clock(now)
    loads = [(in_flight[n], model.weighed(n, now)) for n in range(size)]
    assert [context.load(uid) for uid in uids] == loads
    for first in range(size):
        for second in range(size):
            expected = first if cost(loads[first]) <= cost(loads[second]) else second
            assert context.less_loaded_of(first, second) == uids[expected]
