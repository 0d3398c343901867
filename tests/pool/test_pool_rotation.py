"""The pool's native fast path (issue 12, part 1) and its Rust workers view (issue 14, part 3):
the rotation, ``dispatch_next``, the dispatch clock, and the proxy taking its first candidate
from the pool."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings

from shardline import (
    DiscoveryEvent,
    RoundRobinLoadBalancer,
    TransientRpcError,
    WorkerMetadata,
    WorkerPool,
    WorkerProxy,
)
from shardline._core import WorkersView
from shardline.balancers.protocol import Tried, pool_rotation
from support.rotation_model import RotationModel, changed, operations
from support.workers import worker


def pool(*ns: int) -> WorkerPool:
    made = WorkerPool()
    for n in ns:
        made.add_worker(worker(n), f"conn-{n}")
    return made


def uid(n: int) -> uuid.UUID:
    return worker(n).uid


def test_a_bare_pool_has_a_live_read_only_rust_workers_view() -> None:
    context = pool(2, 1)
    view = context.workers
    assert type(view) is WorkersView
    assert isinstance(view, Mapping)
    context.add_worker(worker(3), "conn-3")
    context.remove_worker(worker(2))
    assert list(view) == [uid(1), uid(3)]
    assert view[uid(1)] == (worker(1), "conn-1")
    assert view.get(uid(2)) is None
    assert view.get(uid(2), "gone") == "gone"
    assert list(view.items()) == [(uid(1), (worker(1), "conn-1")), (uid(3), (worker(3), "conn-3"))]
    assert [metadata for metadata, _ in view.values()] == [worker(1), worker(3)]
    assert list(view.keys()) == [uid(1), uid(3)]
    assert len(view) == 2
    assert repr(view) == "WorkersView(2 workers)"
    with pytest.raises(KeyError):
        view[uid(2)]
    with pytest.raises(TypeError):
        view[uid(1)] = (worker(1), "other")  # type: ignore[index]


def test_dispatch_next_returns_what_the_proxy_needs_and_counts_when_asked() -> None:
    context = pool(1, 2)
    picked = context.dispatch_next(None, True)
    assert picked is not None
    first, metadata, connection, started, token = picked
    assert (first, metadata, connection, token) == (uid(1), worker(1), "conn-1", None)
    assert context.load(uid(1))[0] == 1
    context.finish_dispatch(first, started)
    assert context.load(uid(1))[0] == 0
    assert context.dispatch_next() == (uid(2), worker(2), "conn-2", 0, None)
    # not counted, never measured: weighed at the pool's mean, worker 1's one sample
    assert context.load(uid(2)) == (0, context.load(uid(1))[1])
    assert context.dispatch_next([uid(1)]) == (uid(2), worker(2), "conn-2", 0, None)
    assert context.dispatch_next([uid(1), uid(2)]) is None
    assert WorkerPool().dispatch_next() is None


def test_tried_is_matched_by_uid_not_by_object() -> None:
    context = pool(1, 2)
    context.update_worker(worker(1, pid=7), "conn-1b")  # the pooled uid object is now another
    equal_but_distinct = uuid.UUID(int=1)
    assert context.next_in_rotation([equal_but_distinct]) == uid(2)
    assert context.next_in_rotation({equal_but_distinct: None}) == uid(2)


def test_finish_dispatch_times_the_dispatch_on_the_pools_clock() -> None:
    context = pool(1)
    outer = time.perf_counter()
    _, _, started = context.start_dispatch(uid(1))
    inner = time.perf_counter()
    while time.perf_counter() - inner < 0.002:  # a dispatch of at least 2 ms, on any clock
        pass
    context.finish_dispatch(uid(1), started)
    elapsed = time.perf_counter() - outer
    inflight, latency = context.load(uid(1))
    assert inflight == 0
    assert 0.002 <= latency <= elapsed


Op = tuple[str, int]


@settings(max_examples=300, deadline=None)
@given(ops=operations(range(8)))
def test_dispatch_next_follows_the_rotation_model(ops: list[Op]) -> None:
    """The rotation is a cursor over admission order with holes (see ``RotationModel``)."""
    follows_the_model(ops)


def test_compacting_the_holes_keeps_the_rotations_place() -> None:
    # Four workers, the cursor past the second; then workers 1 and 2 leave and rejoin (at the
    # end) in turn, each leaving a hole, until the pool compacts its holes away.
    churn: list[Op] = [("admit", n) for n in range(4)] + [("pick", 0), ("pick", 0)]
    for cycle in range(20):
        n = 1 + cycle % 2
        churn += [("evict", n), ("admit", n), ("pick", 0)]
    follows_the_model(churn)


def follows_the_model(ops: list[Op]) -> None:
    context, model = WorkerPool(), RotationModel()
    counted: dict[uuid.UUID, int] = {}
    for kind, n in ops:
        if changed(context, model, kind, n):
            if kind == "evict":
                counted.pop(uid(n), None)
        else:
            tried = [uid(m) for m in range(8) if n >> m & 1]  # a bit per worker
            expected = model.select(dict.fromkeys(tried))
            picked = context.dispatch_next(tried, n % 2 == 0)
            assert (picked[0] if picked else None) == expected
            if picked is not None:
                got, metadata, connection = picked[:3]
                assert (metadata, connection) == context.entry(got)
                if n % 2 == 0:
                    counted[got] = counted.get(got, 0) + 1
    for pooled in context.uids():
        assert context.load(pooled)[0] == counted.get(pooled, 0)


def test_pool_rotation_is_declared_by_the_class_that_defines_select() -> None:
    class Subclass(RoundRobinLoadBalancer):
        def select(self, task: Any, *, context: Any, tried: Tried) -> uuid.UUID | None:
            return super().select(task, context=context, tried=tried)

    assert pool_rotation(RoundRobinLoadBalancer())
    assert not pool_rotation(Subclass())


class Counting:
    def __init__(self, metadata: WorkerMetadata) -> None:
        self.uid = metadata.uid
        self.failure: Exception | None = None

    async def dispatch(self, task: Any, *, timeout: float | None = None) -> Any:
        if self.failure is not None:
            raise self.failure
        return self.uid


async def announced(*ns: int) -> Any:
    for n in ns:
        yield DiscoveryEvent("worker-added", worker(n))
    await asyncio.Event().wait()


async def test_the_proxy_takes_the_first_candidate_from_the_pool_then_goes_on_through_select():
    balancer = RoundRobinLoadBalancer()
    asked: list[Tried] = []
    select = balancer.select

    def spy(task: Any, *, context: Any, tried: Tried) -> uuid.UUID | None:
        asked.append(dict(tried))
        return select(task, context=context, tried=tried)

    balancer.select = spy  # type: ignore[method-assign]
    connections: dict[uuid.UUID, Counting] = {}

    def connect(metadata: WorkerMetadata) -> Counting:
        connections[metadata.uid] = Counting(metadata)
        return connections[metadata.uid]

    async def scenario() -> list[Any]:
        proxy = WorkerProxy(
            discovery=announced(1, 2, 3), loadbalancer=balancer, connect=connect, quorum=3
        )
        async with proxy:
            served = [await proxy.dispatch("a"), await proxy.dispatch("b")]
            assert asked == []  # two dispatches, no select: both from the pool's rotation
            connections[uid(3)].failure = TransientRpcError("busy")
            served.append(await proxy.dispatch("c"))  # 3 fails, select goes on to 1
            return served

    assert await scenario() == [uid(1), uid(2), uid(1)]
    assert len(asked) == 1
    assert list(asked[0]) == [uid(3)]
    assert isinstance(asked[0][uid(3)], TransientRpcError)


def test_round_robin_lets_an_error_of_the_pools_rotation_through() -> None:
    # a tried key that is no uid fails in the pool; the balancer must not take that for a
    # context without a rotation and answer from a rotation of its own
    with pytest.raises(AttributeError):
        RoundRobinLoadBalancer().select(None, context=pool(1, 2), tried={"not a uid": None})  # type: ignore[dict-item]
