"""The worker pool and round-robin against wool 0.15.7 (issue 3), side by side.

Per pool size (8, 64, 1,024, 100,000 workers), one group per operation:

- ``refresh``: ``update_worker`` of a pooled worker with a new record;
- ``admit + evict``: ``add_worker`` of a new uid then ``remove_worker`` of it (size stays put);
- ``membership``: ``uid in context.workers`` (ours also through its fast path ``uid in context``),
  for a uid equal to the pooled one (a distinct object);
- ``membership, pooled uid``: the same for the pooled uid object itself, as a balancer hands it
  back (issue 12: the pool finds it by address, without reading ``uid.int``).

``pool ... interleaved`` (issue 12): admit + evict and both memberships, with 8, 1,024 and 100,000
workers, shardline and wool timed back to back in every round (ratio wool / shardline per round).
Its ``admit + evict floor`` row times, on shardline's side, the same two calls for a record that
is not pooled (``update_worker``, which admits nothing, and ``remove_worker``): the calls into
Rust, the attribute reads and the uid's conversion that any admit + evict through this API pays,
without the pool's own work; wool's side is its admit + evict. Its ``remove_worker`` reads
``uid.int`` too, which evicting an admitted record skips (it finds the pooled uid object by
address; the two membership rows differ by that path), so this floor is high by about the
difference of those rows, and its ratio a little under the most any pool behind these two calls
could reach.

``record construction, interleaved``: a ``WorkerMetadata`` made with keywords as discovery
makes one, shardline's and wool's back to back (shardline's keeps its uid's key when made).

And ``round-robin decision``: one ``delegate`` driven to its first candidate, which succeeds,
or (issue 12) one ``select`` for the first candidate, with 8 and 1,024 workers; ``round-robin
decision, interleaved`` times shardline's ``select`` and wool's ``delegate`` back to back.
Both projects get the same ``WorkerMetadata`` objects (wool's pool needs only ``.uid``).
Before timing, both pools are checked to hold the same uids in the same order and both
balancers to offer the same first candidate.

And ``proxy dispatch overhead``: a whole ``WorkerProxy.dispatch`` through a connection that
returns at once, with 8 and 1,024 workers, each proxy fed by a discovery stream announcing them
and driving its own default round-robin, context and dispatch loop. shardline's proxy takes the
connection from its ``connect`` hook; wool's builds a gRPC ``WorkerConnection`` per admitted
worker, so that name in ``wool.runtime.worker.proxy`` is replaced by a stub (the network is the
only thing stubbed). Before timing, one full rotation through each proxy must reach every
worker's connection once and bring back every task; after timing, the connections must have
counted every timed dispatch. ``proxy dispatch overhead, interleaved`` times the two proxies
back to back in every round, for a ratio per round that a drift of the machine cannot skew;
shardline's side drives, in turn, its built-in round robin (since issue 12's native fast path,
a call's first candidate comes from the pool's rotation, ``WorkerPool.dispatch_next``), a plugin
rotation through ``select`` and a plugin through the async-generator protocol (issue 12).
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncGenerator, Callable
from typing import Any

import pytest

from shardline import (
    LoadBalancerContext,
    RoundRobinLoadBalancer,
    SelectLoadBalancer,
    WorkerMetadata,
)
from shardline.balancers.protocol import NOTHING_TRIED

from .delegate_decisions import first_candidates

pytest.importorskip("pytest_benchmark")
wool_base = pytest.importorskip("wool.runtime.loadbalancer.base")
wool_rr = pytest.importorskip("wool.runtime.loadbalancer.roundrobin")
wool_proxy_module = pytest.importorskip("wool.runtime.worker.proxy")

SIZES = [8, 64, 1024, 100_000]
CALLS = 1000
IMPLS = ["shardline", "wool"]


def record(n: int, pid: int = 1) -> WorkerMetadata:
    return WorkerMetadata(
        uid=uuid.UUID(int=n + 1), address=f"127.0.0.1:{10000 + n % 5000}", pid=pid, version="1"
    )


def pools(size: int) -> dict[str, Any]:
    made = {"shardline": LoadBalancerContext(), "wool": wool_base.LoadBalancerContext()}
    for n in range(size):
        for pool in made.values():
            pool.add_worker(record(n), f"conn-{n}")
    assert list(made["shardline"].workers) == list(made["wool"].workers)
    return made


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("op", ["refresh", "admit + evict", "membership", "membership, pooled uid"])
def test_pool_operation(
    benchmark: Any, per_call: Callable[..., Any], op: str, size: int, impl: str
) -> None:
    pool = pools(size)[impl]
    run = operation(pool, op, size, impl)
    benchmark.group = f"pool {op}, {size:,} workers"
    per_call(run, CALLS, rounds=50 if size >= 100_000 else 200, impl=f"{impl} {op}")
    assert len(pool.workers) == size


def operation(pool: Any, op: str, size: int, impl: str) -> Callable[[], Any]:
    """One round of ``op`` (``CALLS`` calls) on ``pool``, which holds ``size`` workers."""
    targets = [record(n * 7919 % size, pid=2) for n in range(CALLS)]
    fresh = [record(size + n) for n in range(CALLS)]
    pooled = list(pool.workers)
    uids = (
        [pooled[n * 7919 % size] for n in range(CALLS)]
        if op == "membership, pooled uid"
        else [r.uid for r in targets]
    )

    def refresh() -> None:
        update = pool.update_worker
        for r in targets:
            update(r, "conn-new")

    def admit_evict() -> None:
        add, remove = pool.add_worker, pool.remove_worker
        for r in fresh:
            add(r, "conn-new")
            remove(r)

    def membership() -> bool:
        workers = pool if impl == "shardline" else pool.workers
        found = True
        for u in uids:
            found = u in workers
        return found

    def admit_evict_floor() -> None:
        update, remove = pool.update_worker, pool.remove_worker
        for r in fresh:
            update(r, "conn-new")
            remove(r)

    def checked_refresh() -> None:
        refresh()
        assert pool.workers[targets[0].uid][1] == "conn-new"

    def checked_membership() -> bool:
        found = membership()
        assert found
        return found

    run = {
        "refresh": checked_refresh,
        "admit + evict": admit_evict,
        "admit + evict floor": admit_evict_floor,
        "membership": checked_membership,
        "membership, pooled uid": checked_membership,
    }[op]
    return run


@pytest.mark.parametrize("size", [8, 1024, 100_000])
@pytest.mark.parametrize(
    "op", ["admit + evict", "admit + evict floor", "membership", "membership, pooled uid"]
)
def test_pool_operation_interleaved(
    benchmark: Any, per_call: Callable[..., Any], op: str, size: int
) -> None:
    """shardline and wool back to back in every round (bench_goals.py's ``interleave``)."""
    from .bench_goals import interleave

    made = pools(size)
    ours = operation(made["shardline"], op, size, "shardline")
    theirs = operation(made["wool"], op.removesuffix(" floor"), size, "wool")
    benchmark.group = f"pool {op}, interleaved"
    interleave(
        benchmark, per_call, ours, theirs, CALLS, impl=f"shardline vs wool {op}, {size:,} workers"
    )
    assert len(made["shardline"].workers) == len(made["wool"].workers) == size


def test_record_construction_interleaved(benchmark: Any, per_call: Callable[..., Any]) -> None:
    """A record made as discovery makes one (keywords), shardline's and wool's back to back:
    shardline's ``WorkerMetadata`` keeps its uid's key when it is made (issue 12), which the
    admit + evict rows no longer pay."""
    from wool.runtime.worker.metadata import WorkerMetadata as WoolMetadata

    from .bench_goals import interleave

    uids = [uuid.UUID(int=n + 1) for n in range(CALLS)]

    def ours() -> Any:
        made = None
        for uid in uids:
            made = WorkerMetadata(uid=uid, address="127.0.0.1:10000", pid=1, version="1")
        return made

    def theirs() -> Any:
        made = None
        for uid in uids:
            made = WoolMetadata(uid=uid, address="127.0.0.1:10000", pid=1, version="1")
        return made

    assert ours().uid == theirs().uid == uids[-1]
    benchmark.group = "record construction, interleaved"
    interleave(benchmark, per_call, ours, theirs, CALLS, impl="shardline vs wool record")


def delegate_decisions(
    balancer: Any, pool: Any, loop: asyncio.AbstractEventLoop
) -> Callable[[int], list[uuid.UUID]]:
    """``count`` round-robin decisions through ``delegate``: first candidate, then success."""

    return lambda count: loop.run_until_complete(
        first_candidates(balancer, pool, itertools.repeat(None, count))
    )


def select_decisions(balancer: Any, pool: Any) -> Callable[[int], list[uuid.UUID]]:
    """``count`` round-robin decisions through ``select``, the first candidate each (issue 12)."""

    def decisions(count: int) -> list[uuid.UUID]:
        select = balancer.select
        return [select(None, context=pool, tried=NOTHING_TRIED) for _ in range(count)]

    return decisions


DECISION_IMPLS = ["shardline delegate", "shardline select", "wool delegate"]


@pytest.mark.parametrize("impl", DECISION_IMPLS)
@pytest.mark.parametrize("size", [8, 1024])
def test_round_robin_decision(
    benchmark: Any, per_call: Callable[..., Any], size: int, impl: str
) -> None:
    pool = pools(size)[impl.split()[0]]
    loop = asyncio.new_event_loop()
    if impl == "shardline select":
        decisions = select_decisions(RoundRobinLoadBalancer(), pool)
    elif impl == "shardline delegate":
        decisions = delegate_decisions(RoundRobinLoadBalancer(), pool, loop)
    else:
        decisions = delegate_decisions(wool_rr.RoundRobinLoadBalancer(), pool, loop)
    assert decisions(size) == list(pool.workers)  # one full rotation, in admission order
    benchmark.group = f"round-robin decision, {size:,} workers"
    per_call(lambda: decisions(CALLS), CALLS, impl=impl)
    loop.close()


@pytest.mark.parametrize("size", [8, 1024])
def test_round_robin_decision_interleaved(
    benchmark: Any, per_call: Callable[..., Any], size: int
) -> None:
    """shardline's decision through ``select`` and wool's through its ``delegate``, timed back
    to back in every round (issue 12)."""
    from .bench_goals import interleave

    made = pools(size)
    loop = asyncio.new_event_loop()
    ours = select_decisions(RoundRobinLoadBalancer(), made["shardline"])
    theirs = delegate_decisions(wool_rr.RoundRobinLoadBalancer(), made["wool"], loop)
    assert ours(size) == theirs(size) == list(made["shardline"].workers)
    benchmark.group = "round-robin decision, interleaved"
    interleave(
        benchmark,
        per_call,
        lambda: ours(CALLS),
        lambda: theirs(CALLS),
        CALLS,
        impl=f"shardline select vs wool delegate, {size:,} workers",
    )
    loop.close()


class Immediate:
    """A connection that returns at once: what is left of a dispatch is the proxy's own cost.
    ``calls`` counts its dispatches, so a benchmark can check that the proxy reached it."""

    def __init__(self) -> None:
        self.calls = 0

    async def dispatch(self, task: Any, *, timeout: float | None = None) -> Any:
        self.calls += 1
        return task


async def _results(task: Any) -> AsyncGenerator[Any, None]:
    yield task


class ImmediateWool:
    """Stands in for wool's gRPC ``WorkerConnection``, with its constructor: ``dispatch``
    returns at once what wool's returns, an async generator of the task's results (the proxy
    hands it to the caller as is), here yielding the task itself."""

    def __init__(self, target: str, **options: Any) -> None:
        self.target = target
        self.calls = 0

    async def dispatch(self, task: Any, *, timeout: float | None = None) -> AsyncGenerator:
        self.calls += 1
        return _results(task)


class Announced:
    """Discovery that announces a fixed set of workers, then stays open."""

    def __init__(self, events: list[Any]) -> None:
        self.events = events

    async def __aiter__(self) -> Any:
        for event in self.events:
            yield event
        await asyncio.Event().wait()


async def shardline_proxy(
    size: int, loadbalancer: Any = RoundRobinLoadBalancer
) -> tuple[Any, list[Immediate]]:
    """shardline's ``WorkerProxy`` over ``size`` workers, one ``Immediate`` connection each."""
    from shardline import DiscoveryEvent, WorkerProxy

    connections: list[Immediate] = []

    def connect(metadata: WorkerMetadata) -> Immediate:
        connections.append(Immediate())
        return connections[-1]

    events = [DiscoveryEvent("worker-added", record(n)) for n in range(size)]
    proxy = WorkerProxy(
        discovery=Announced(events), connect=connect, quorum=size, loadbalancer=loadbalancer
    )
    await proxy.start()
    return proxy, connections


class PluginRotation(SelectLoadBalancer):
    """A plugin's round robin through ``select``, as its author might write it against the
    public surface alone (``context.workers``): its own snapshot and cursor, in Python."""

    needs_load = False

    def __init__(self) -> None:
        self.order: list[uuid.UUID] = []
        self.cursor = 0

    def select(self, task: Any, *, context: Any, tried: Any) -> uuid.UUID | None:
        workers = context.workers
        for _ in range(2):  # the rest of this wrap, then a fresh snapshot
            order = self.order
            while self.cursor < len(order):
                uid = order[self.cursor]
                self.cursor += 1
                if uid in workers and uid not in tried:
                    return uid
            self.order, self.cursor = list(workers), 0
        return None


class PluginGenerator:
    """A plugin written against the seed's async-generator protocol, declaring nothing (so the
    proxy keeps the load for it): the round robin that was built in before issue 12, by uid
    snapshot per wrap, boundary and failed set, over ``context.workers``."""

    def __init__(self) -> None:
        self.order: list[uuid.UUID] = []
        self.cursor = 0

    async def delegate(self, task: Any, *, context: Any) -> AsyncGenerator[uuid.UUID, Any]:
        workers = context.workers
        boundary: uuid.UUID | None = None
        failed: set[uuid.UUID] | None = None
        while True:
            cursor, order = self.cursor, self.order
            if cursor >= len(order):
                order, cursor = list(workers), 0
                self.order = order
                if not order:
                    return
            uid = order[cursor]
            self.cursor = cursor + 1
            if boundary is not None and (uid == boundary or (failed is not None and uid in failed)):
                if failed is None or len(failed) >= len(workers):
                    return
                continue
            if uid not in workers:
                continue
            if boundary is None or boundary not in workers:
                boundary = uid
            try:
                served = yield uid
            except Exception:
                if failed is None:
                    failed = set()
                failed.add(uid)
                continue
            if served is not None:
                return


BALANCERS: dict[str, Callable[[], Any]] = {
    "built-in round-robin (select)": RoundRobinLoadBalancer,
    "plugin: select, Python rotation": PluginRotation,
    "plugin: async generator": PluginGenerator,
}


async def wool_proxy(size: int, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[ImmediateWool]]:
    """wool's own ``WorkerProxy`` (its admission gate, round-robin, context and dispatch loop)
    over the same ``size`` workers, announced by a discovery stream, with only the network
    replaced: the name ``WorkerConnection`` its sentinel calls per admitted worker."""
    from wool import protocol
    from wool.runtime.discovery.base import DiscoveryEvent
    from wool.runtime.worker.metadata import WorkerMetadata as WoolMetadata

    connections: list[ImmediateWool] = []

    def connect(target: str, **options: Any) -> ImmediateWool:
        connections.append(ImmediateWool(target, **options))
        return connections[-1]

    monkeypatch.setattr(wool_proxy_module, "WorkerConnection", connect)
    events = [
        DiscoveryEvent(
            "worker-added",
            metadata=WoolMetadata(
                uid=r.uid, address=r.address, pid=r.pid, version=protocol.__version__
            ),
        )
        for r in (record(n) for n in range(size))
    ]
    proxy = wool_proxy_module.WorkerProxy(
        discovery=Announced(events), credentials=None, quorum=size, lazy=False
    )
    await proxy.start()
    return proxy, connections


OVERHEAD_IMPLS = [
    "floor: connection.dispatch",
    "shardline WorkerProxy.dispatch",
    "floor: wool stub connection.dispatch",
    "wool WorkerProxy.dispatch",
]


@pytest.mark.parametrize("impl", OVERHEAD_IMPLS)
@pytest.mark.parametrize("size", [8, 1024])
def test_proxy_dispatch_overhead(
    benchmark: Any,
    per_call: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
    size: int,
    impl: str,
) -> None:
    """A whole ``WorkerProxy.dispatch`` over a connection that returns at once, both projects
    (wool's returns the result stream its connection returned, shardline's the result)."""
    loop = asyncio.new_event_loop()
    wool = "wool" in impl
    if wool:
        proxy, connections = loop.run_until_complete(wool_proxy(size, monkeypatch))
    else:
        proxy, connections = loop.run_until_complete(shardline_proxy(size))

    async def rotation() -> list[Any]:
        results = []
        for task in range(size):
            result = await proxy.dispatch(task)
            results.append(await anext(result) if wool else result)
        return results

    # One full rotation through the proxy reaches every worker's connection once, in order.
    assert len(connections) == len(proxy.workers) == size
    assert loop.run_until_complete(rotation()) == list(range(size))
    assert [c.calls for c in connections] == [1] * size
    if wool:
        pooled = proxy._loadbalancer_context.workers.values()
        assert all(type(connection) is ImmediateWool for _, connection in pooled)

    send = connections[0].dispatch if impl.startswith("floor") else proxy.dispatch
    rounds = 0

    async def dispatches(count: int) -> Any:
        last = None
        for task in range(count):
            last = await send(task)
        return last

    def round_() -> Any:
        nonlocal rounds
        rounds += 1
        return loop.run_until_complete(dispatches(CALLS))

    benchmark.group = f"proxy dispatch overhead, {size:,} workers"
    last = per_call(round_, CALLS, impl=impl)
    assert sum(c.calls for c in connections) == size + rounds * CALLS
    assert (loop.run_until_complete(anext(last)) if wool else last) == CALLS - 1
    loop.run_until_complete(proxy.stop())
    loop.close()


@pytest.mark.parametrize("way", list(BALANCERS))
@pytest.mark.parametrize("size", [8, 1024])
def test_proxy_dispatch_overhead_interleaved(
    benchmark: Any,
    per_call: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
    size: int,
    way: str,
) -> None:
    """The same pair, one block of each timed back to back in every round (bench_goals.py's
    ``interleave``): the ratio wool / shardline per round, in ``extra_info``. shardline's proxy
    drives, by ``way``, its built-in round robin or a plugin through either protocol (issue 12);
    wool's its own round robin."""
    from .bench_goals import interleave

    loop = asyncio.new_event_loop()
    ours, ours_connections = loop.run_until_complete(shardline_proxy(size, BALANCERS[way]))
    theirs, theirs_connections = loop.run_until_complete(wool_proxy(size, monkeypatch))

    async def rotation(proxy: Any, streams: bool) -> list[Any]:
        results = [await proxy.dispatch(task) for task in range(size)]
        return [await anext(r) for r in results] if streams else results

    assert loop.run_until_complete(rotation(ours, False)) == list(range(size))
    assert loop.run_until_complete(rotation(theirs, True)) == list(range(size))
    for connections in (ours_connections, theirs_connections):
        assert [c.calls for c in connections] == [1] * size

    def block(proxy: Any) -> Callable[[], Any]:
        async def dispatches() -> Any:
            last = None
            for task in range(CALLS):
                last = await proxy.dispatch(task)
            return last

        return lambda: loop.run_until_complete(dispatches())

    benchmark.group = "proxy dispatch overhead, interleaved"
    builtin = way == "built-in round-robin (select)"
    interleave(
        benchmark,
        per_call,
        block(ours),
        block(theirs),
        CALLS,
        impl=f"shardline ({way}) vs wool WorkerProxy.dispatch, {size:,} workers",
        **(
            {
                "goal_group": f"proxy dispatch overhead, {size:,} workers",
                "goal_ours": "shardline WorkerProxy.dispatch",
                "goal_theirs": "wool WorkerProxy.dispatch",
            }
            if builtin
            else {}
        ),
    )
    ours_calls = sum(c.calls for c in ours_connections)
    assert ours_calls == sum(c.calls for c in theirs_connections) > size
    loop.run_until_complete(ours.stop())
    loop.run_until_complete(theirs.stop())
    loop.close()
