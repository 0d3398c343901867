"""The built-in round-robin's ``select`` in Rust (issue 12, goal "decision via select"): one call
into the core on this project's pool, the rotation's semantics unchanged, and the balancer
still a Python class as far as subclasses, pickling and other contexts are concerned."""

from __future__ import annotations

import pickle
import sys
import uuid
from collections.abc import Iterator
from types import FrameType, MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardline import (
    LoadBalancerContext,
    RoundRobinLoadBalancer,
    SelectLoadBalancer,
    WorkerMetadata,
    WorkerPool,
)
from shardline.balancers.protocol import NOTHING_TRIED, pool_rotation, select_of
from support.rotation_model import RotationModel, changed, operations


def worker(n: int, pid: int = 1) -> WorkerMetadata:
    return WorkerMetadata(uid=uuid.UUID(int=n), address=f"10.0.0.{n}:5000", pid=pid, version="1")


def uid(n: int) -> uuid.UUID:
    return uuid.UUID(int=n)


@pytest.mark.parametrize("pool_class", [WorkerPool, LoadBalancerContext])
def test_a_decision_on_a_pool_runs_no_python_code(pool_class: type[WorkerPool]) -> None:
    pool = pool_class()
    for n in (1, 2, 3):
        pool.add_worker(worker(n), f"conn-{n}")
    balancer = RoundRobinLoadBalancer()
    tried = MappingProxyType({uid(3): None})  # an equal uid, not the pooled object
    entered: list[str] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":  # a Python frame starts; calls into C report "c_call"
            entered.append(frame.f_code.co_qualname)

    sys.setprofile(profile)
    try:
        first = balancer.select(None, context=pool, tried=NOTHING_TRIED)
        second = balancer.select(None, context=pool, tried=tried)
    finally:
        sys.setprofile(None)
    assert (first, second) == (uid(1), uid(2))
    assert entered == []


def test_select_follows_the_protocol_and_declares_the_pools_rotation() -> None:
    balancer = RoundRobinLoadBalancer()
    assert isinstance(balancer, SelectLoadBalancer)
    assert select_of(balancer) is not None
    assert pool_rotation(balancer)
    assert balancer.needs_load is False


@settings(max_examples=300, deadline=None)
@given(ops=operations(range(1, 9)), copies=st.integers(1, 3))
def test_select_follows_the_rotation_model(ops: list[tuple[str, int]], copies: int) -> None:
    # several balancers (a pickled copy among them) share the pool's one rotation
    pool, model = LoadBalancerContext(), RotationModel()
    balancers = [RoundRobinLoadBalancer()]
    balancers += [pickle.loads(pickle.dumps(balancers[0])) for _ in range(copies - 1)]
    for step, (kind, n) in enumerate(ops):
        if not changed(pool, model, kind, n):
            tried = {uid(m + 1): None for m in range(8) if n >> m & 1}  # a bit per worker
            balancer = balancers[step % len(balancers)]
            chosen = balancer.select(None, context=pool, tried=MappingProxyType(tried))
            assert chosen == model.select(set(tried))
            assert chosen is None or (chosen not in tried and chosen in pool)


class ContextWithRotation:
    """A context that is not a ``WorkerPool`` but has a rotation of its own."""

    def __init__(self, *ns: int) -> None:
        self.workers = {uid(n): (worker(n), f"conn-{n}") for n in ns}
        self.asked: list[list[uuid.UUID]] = []

    def next_in_rotation(self, tried: Any) -> uuid.UUID | None:
        self.asked.append(list(tried))
        return next((u for u in self.workers if u not in tried), None)


class PlainContext:
    """A context with a ``workers`` mapping and nothing else."""

    def __init__(self, *ns: int) -> None:
        self.workers = {uid(n): (worker(n), f"conn-{n}") for n in ns}

    def __iter__(self) -> Iterator[uuid.UUID]:
        return iter(self.workers)


def test_other_contexts_keep_their_own_rotation_or_the_balancers() -> None:
    balancer = RoundRobinLoadBalancer()
    with_rotation = ContextWithRotation(1, 2)
    assert balancer.select(None, context=with_rotation, tried={uid(1): None}) == uid(2)
    assert with_rotation.asked == [[uid(1)]]
    plain = PlainContext(1, 2)
    chosen = [balancer.select(None, context=plain, tried=NOTHING_TRIED) for _ in range(3)]
    assert chosen == [uid(1), uid(2), uid(1)]
    assert balancer.select(None, context=plain, tried={uid(1): None, uid(2): None}) is None


class Named(RoundRobinLoadBalancer):
    """A subclass with constructor arguments of its own, as a plugin might write."""

    def __init__(self, name: str, *, spare: int = 0) -> None:
        super().__init__()
        self.name = name
        self.spare = spare


def test_a_subclass_takes_its_own_arguments_and_pickles_with_its_state() -> None:
    balancer = Named("east", spare=2)
    pool = LoadBalancerContext()
    pool.add_worker(worker(1), "conn-1")
    assert balancer.select(None, context=pool, tried=NOTHING_TRIED) == uid(1)
    copy = pickle.loads(pickle.dumps(balancer))
    assert (type(copy), copy.name, copy.spare) == (Named, "east", 2)
    assert copy.select(None, context=pool, tried=NOTHING_TRIED) == uid(1)
