"""The worker pool and round-robin against wool 0.15.7 (issue 3), side by side.

Per pool size (8, 64, 1,024, 100,000 workers), one group per operation:

- ``refresh``: ``update_worker`` of a pooled worker with a new record;
- ``admit + evict``: ``add_worker`` of a new uid then ``remove_worker`` of it (size stays put);
- ``membership``: ``uid in context.workers`` (ours also through its fast path ``uid in context``).

And ``round-robin decision``: one ``delegate`` driven to its first candidate, which succeeds,
with 8 and 1,024 workers. Both projects get the same ``WorkerMetadata`` objects (wool's pool
needs only ``.uid``). Before timing, both pools are checked to hold the same uids in the same
order and both balancers to offer the same first candidate.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from shardline import LoadBalancerContext, RoundRobinLoadBalancer, WorkerMetadata

pytest.importorskip("pytest_benchmark")
wool_base = pytest.importorskip("wool.runtime.loadbalancer.base")
wool_rr = pytest.importorskip("wool.runtime.loadbalancer.roundrobin")

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
@pytest.mark.parametrize("op", ["refresh", "admit + evict", "membership"])
def test_pool_operation(
    benchmark: Any, per_call: Callable[..., Any], op: str, size: int, impl: str
) -> None:
    pool = pools(size)[impl]
    targets = [record(n * 7919 % size, pid=2) for n in range(CALLS)]
    fresh = [record(size + n) for n in range(CALLS)]
    uids = [r.uid for r in targets]

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

    run = {"refresh": refresh, "admit + evict": admit_evict, "membership": membership}[op]
    benchmark.group = f"pool {op}, {size:,} workers"
    per_call(run, CALLS, rounds=50 if size >= 100_000 else 200, impl=f"{impl} {op}")
    assert len(pool.workers) == size
    assert pool.workers[targets[0].uid][1] in ("conn-new", f"conn-{targets[0].uid.int - 1}")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("size", [8, 1024])
def test_round_robin_decision(
    benchmark: Any, per_call: Callable[..., Any], size: int, impl: str
) -> None:
    pool = pools(size)[impl]
    balancer = RoundRobinLoadBalancer() if impl == "shardline" else wool_rr.RoundRobinLoadBalancer()
    loop = asyncio.new_event_loop()

    async def decisions(count: int) -> list[uuid.UUID]:
        chosen = []
        for _ in range(count):
            gen = balancer.delegate(None, context=pool)
            uid = await anext(gen)
            try:
                await gen.asend(uid)
            except StopAsyncIteration:
                chosen.append(uid)
        return chosen

    first = loop.run_until_complete(decisions(size))
    assert first == list(pool.workers)  # one full rotation, in admission order
    benchmark.group = f"round-robin decision, {size:,} workers"
    per_call(lambda: loop.run_until_complete(decisions(CALLS)), CALLS, impl=f"{impl} delegate")
    loop.close()


class Immediate:
    """A connection that returns at once: what is left of a dispatch is the proxy's own cost."""

    async def dispatch(self, task: Any, *, timeout: float | None = None) -> Any:
        return task


class Announced:
    """Discovery that announces a fixed set of workers, then stays open."""

    def __init__(self, records: list[WorkerMetadata]) -> None:
        self.records = records

    async def __aiter__(self) -> Any:
        from shardline import DiscoveryEvent

        for record in self.records:
            yield DiscoveryEvent("worker-added", record)
        await asyncio.Event().wait()


@pytest.mark.parametrize("impl", ["floor: connection.dispatch", "shardline WorkerProxy.dispatch"])
@pytest.mark.parametrize("size", [8, 1024])
def test_proxy_dispatch_overhead(
    benchmark: Any, per_call: Callable[..., Any], size: int, impl: str
) -> None:
    from shardline import WorkerProxy

    loop = asyncio.new_event_loop()
    connection = Immediate()
    proxy = WorkerProxy(
        discovery=Announced([record(n) for n in range(size)]),
        connect=lambda metadata: connection,
        quorum=size,
    )
    loop.run_until_complete(proxy.start())

    async def dispatches(count: int) -> int:
        send = connection.dispatch if impl.startswith("floor") else proxy.dispatch
        done = 0
        for task in range(count):
            done += await send(task) == task
        return done

    assert loop.run_until_complete(dispatches(size)) == size
    benchmark.group = f"proxy dispatch overhead, {size:,} workers"
    per_call(lambda: loop.run_until_complete(dispatches(CALLS)), CALLS, impl=impl)
    loop.run_until_complete(proxy.stop())
    loop.close()
