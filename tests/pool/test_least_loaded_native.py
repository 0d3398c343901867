"""Least-loaded's native first pick: ``WorkerPool.dispatch_less_loaded`` against the reference
model, the ``pool_least_loaded`` declaration, and the proxy taking that path."""

from __future__ import annotations

import asyncio
import pickle
import random
import uuid
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardline import (
    DiscoveryEvent,
    LeastLoadedLoadBalancer,
    LoadBalancerContext,
    NoWorkersAvailable,
    TransientRpcError,
    WorkerMetadata,
    WorkerProxy,
)
from shardline.balancers.protocol import SelectLoadBalancer, Tried, native_first
from shardline.pool import HealthPolicy
from support.least_loaded_model import Loads, cost
from support.workers import worker

START = 10**12  # the pool's pinned clock, ns
MS = 1_000_000
FAILURE = LoadBalancerContext.OUTCOME_FAILURE
SUCCESS = LoadBalancerContext.OUTCOME_SUCCESS


def pool(*ns: int) -> LoadBalancerContext:
    context = LoadBalancerContext()
    for n in ns:
        context.add_worker(worker(n), f"conn-{n}")
    return context


steps = st.lists(
    st.one_of(
        st.tuples(st.just("pick"), st.just(0), st.just(0)),
        # the oldest dispatch in flight ends after ``ms``, successful or not
        st.tuples(st.just("finish"), st.integers(0, 40), st.sampled_from([SUCCESS, FAILURE])),
        st.tuples(st.just("wait"), st.integers(0, 400), st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(size=st.integers(0, 8), evicted=st.sets(st.integers(0, 6)), steps=steps)
def test_the_native_pick_is_the_models_choice_at_the_pools_draw(
    size: int, evicted: set[int], steps: list[tuple[str, int, int]]
) -> None:
    """Each pick is, of the two workers at the positions ``next_draw`` announced, the cheaper
    by the model's load (to the bit); it counts one dispatch in flight to it and in
    ``dispatch_counts``, and its ``finish_dispatch`` samples its latency as the model does."""
    context = pool(*range(size))
    for n in evicted & set(range(size - 1)):  # holes in the admission order, the last kept
        context.remove_worker(worker(n))
    uids = list(context.workers)
    model = Loads.of(len(uids))
    in_flight = [0] * len(uids)
    running: list[tuple[int, int]] = []  # (position, started)
    now = START
    context._pin_clock(now)
    for kind, ms, outcome in steps:
        if kind == "wait":
            now += ms * MS
            context._pin_clock(now)
        elif kind == "finish" and running:
            position, started = running.pop(0)
            now += ms * MS
            context._pin_clock(now)
            context.finish_dispatch(uids[position], started, outcome)
            in_flight[position] -= 1
            model.sample(position, (now - started) * 1e-9, now)
        elif kind == "pick":
            dispatched = context.dispatch_counts()[0]
            first, second = context.next_draw()
            picked = context.dispatch_less_loaded()
            if not uids:
                assert picked is None
                continue
            assert picked is not None
            assert (first, second) == (0, 0) if len(uids) == 1 else first != second
            loads = [(in_flight[n], model.weighed(n, now)) for n in range(len(uids))]
            expected = first if cost(loads[first]) <= cost(loads[second]) else second
            uid, metadata, connection, started, token = picked
            assert uid == uids[expected]
            assert (metadata, connection) == context.entry(uid)
            assert (started, token) == (now, None)
            assert context.dispatch_counts()[0] == dispatched + 1
            in_flight[expected] += 1
            running.append((expected, started))
    assert [context.load(uid)[0] for uid in uids] == in_flight


def test_the_draws_cover_every_pair_of_positions() -> None:
    context = pool(1, 2, 3)
    pairs: Counter[tuple[int, int]] = Counter()
    for _ in range(3000):
        pairs[context.next_draw()] += 1
        picked = context.dispatch_less_loaded()
        assert picked is not None
        context.finish_dispatch(picked[0], picked[3])
    assert set(pairs) == {(a, b) for a in range(3) for b in range(3) if a != b}
    assert all(count > 3000 / 6 * 0.8 for count in pairs.values())


def test_ejected_workers_are_never_picked_and_none_comes_back_without_a_visible_one() -> None:
    context = pool(1, 2, 3)
    context._pin_clock(START)
    context.configure_health(HealthPolicy(max_ejected_share=1.0))
    for n in (1, 3):
        for _ in range(5):
            _, _, started = context.start_dispatch(worker(n).uid)
            context.finish_dispatch(worker(n).uid, started, FAILURE)
    assert context.health_counts()[2] == 2
    for outcome in [SUCCESS] * 50 + [FAILURE] * 5:
        positions = context.next_draw()
        picked = context.dispatch_less_loaded()
        assert picked is not None
        assert picked[0] == worker(2).uid == context.less_loaded_of(*positions)
        context.finish_dispatch(picked[0], picked[3], outcome)
    assert context.health_counts()[2] == 3  # worker 2 ejected too
    assert context.dispatch_less_loaded() is None
    assert pool().dispatch_less_loaded() is None


def test_a_worker_on_probation_gets_one_native_probe() -> None:
    context = pool(1)
    context._pin_clock(START)
    context.configure_health(HealthPolicy())
    for _ in range(5):
        _, _, started = context.start_dispatch(worker(1).uid)
        context.finish_dispatch(worker(1).uid, started, FAILURE)
    assert context.dispatch_less_loaded() is None  # ejected
    context._pin_clock(START + 2 * 1_000_000_000)  # its 1 s ejection is over: on probation
    probe = context.dispatch_less_loaded()
    assert probe is not None
    assert probe[0] == worker(1).uid
    assert context.dispatch_less_loaded() is None  # its probe is running
    context.finish_dispatch(probe[0], probe[3], SUCCESS)
    assert context.dispatch_less_loaded() is not None  # re-admitted


# the declaration


class Repeats(LeastLoadedLoadBalancer):
    """Overrides ``select``, and repeats the declaration: its select still starts so."""

    pool_least_loaded = True

    def select(self, task: Any, *, context: Any, tried: Tried) -> uuid.UUID | None:
        return super().select(task, context=context, tried=tried)


class Overrides(LeastLoadedLoadBalancer):
    def select(self, task: Any, *, context: Any, tried: Tried) -> uuid.UUID | None:
        return super().select(task, context=context, tried=tried)


class Inherits(LeastLoadedLoadBalancer):
    """Changes nothing of ``select``: the declaration stands."""


class Plugin(SelectLoadBalancer):
    pool_least_loaded = True

    def select(self, task: Any, *, context: Any, tried: Tried) -> uuid.UUID | None:
        return None


def copied(balancer: Any) -> Any:
    return pickle.loads(pickle.dumps(balancer))


@pytest.mark.parametrize(
    ("balancer", "declared"),
    [
        (LeastLoadedLoadBalancer(), "pool-least-loaded"),
        (LeastLoadedLoadBalancer(random.Random(1)), None),  # the given generator draws
        # a copy gets a fresh generator, not the given one: the pool's draws again
        (
            pickle.loads(pickle.dumps(LeastLoadedLoadBalancer(random.Random(1)))),
            "pool-least-loaded",
        ),
        (Inherits(), "pool-least-loaded"),
        (Overrides(), None),
        (Repeats(), "pool-least-loaded"),
        (Repeats(random.Random(1)), None),
        (Plugin(), "pool-least-loaded"),
    ],
    ids=lambda value: type(value).__name__ if not isinstance(value, str | None) else "",
)
def test_the_declaration_is_the_select_classs_and_a_given_rng_withdraws_it(
    balancer: Any, declared: str | None
) -> None:
    assert native_first(balancer) == declared


# the proxy


class Recorded:
    """A connection that answers with its worker's number, or raises ``failure`` when set."""

    def __init__(self, metadata: WorkerMetadata, log: list[int]) -> None:
        self.n = metadata.uid.int
        self.log = log
        self.failure: Exception | None = None

    async def dispatch(self, task: Any, *, timeout: float | None = None) -> Any:
        self.log.append(self.n)
        if self.failure is not None:
            raise self.failure
        return self.n


async def announced(*ns: int) -> Any:
    for n in ns:
        yield DiscoveryEvent("worker-added", worker(n))
    await asyncio.Event().wait()


class Spied(LeastLoadedLoadBalancer):
    """Records each ``tried`` its select is asked with (an instance attribute: the declaration,
    the class's, stands)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[dict[uuid.UUID, Exception | None]] = []
        select = super().select

        def spy(task: Any, *, context: Any, tried: Tried) -> uuid.UUID | None:
            self.asked.append(dict(tried))
            return select(task, context=context, tried=tried)

        self.select = spy  # type: ignore[method-assign]


async def test_the_proxy_takes_the_first_candidate_natively_then_goes_on_through_select() -> None:
    balancer = Spied()
    log: list[int] = []
    connections: dict[int, Recorded] = {}

    def connect(metadata: WorkerMetadata) -> Recorded:
        connections[metadata.uid.int] = Recorded(metadata, log)
        return connections[metadata.uid.int]

    proxy = WorkerProxy(
        discovery=announced(1, 2, 3, 4),
        connect=connect,
        loadbalancer=balancer,
        quorum=4,
        retry_budget=None,  # every failure goes on to the next candidate
        health=None,  # no worker ejected by its failures: each is offered every call
    )
    async with proxy:
        assert proxy.explain("x").protocol == "pool-least-loaded"
        for _ in range(40):
            await proxy.dispatch("x")
        assert balancer.asked == []  # every call's one candidate was the pool's
        assert proxy._context.dispatch_counts()[0] == proxy.stats().dispatched == 40
        assert [proxy._context.load(worker(n).uid)[0] for n in (1, 2, 3, 4)] == [0] * 4

        connections[1].failure = TransientRpcError("busy", reason="busy")
        connections[2].failure = TransientRpcError("busy", reason="busy")
        log.clear()
        balancer.asked.clear()
        results = [await proxy.dispatch("x") for _ in range(40)]
        assert set(results) <= {3, 4}
        # after a native failure, select with tried; no call offers a worker twice
        assert all(asked and all(uid.int in (1, 2) for uid in asked) for asked in balancer.asked)
        assert proxy.stats().transient == len(log) - 40

        for n in (3, 4):
            connections[n].failure = TransientRpcError("busy", reason="busy")
        log.clear()
        with pytest.raises(NoWorkersAvailable):
            await proxy.dispatch("x")
        assert sorted(log) == [1, 2, 3, 4]  # each worker offered once
        assert [proxy._context.load(worker(n).uid)[0] for n in (1, 2, 3, 4)] == [0] * 4


async def test_explain_names_the_worker_the_next_native_dispatch_picks() -> None:
    log: list[int] = []
    proxy = WorkerProxy(
        discovery=announced(1, 2, 3, 4, 5),
        connect=lambda metadata: Recorded(metadata, log),
        loadbalancer=LeastLoadedLoadBalancer,
        quorum=5,
    )
    async with proxy:
        proxy._context._pin_clock(START)  # the load read by both is the same
        for _ in range(30):
            explanation = proxy.explain("x")
            assert explanation.notes
            assert "next draw" in explanation.notes[0]
            assert await proxy.dispatch("x") == explanation.first.int  # type: ignore[union-attr]
