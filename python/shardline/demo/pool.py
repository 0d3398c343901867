"""The worker-pool part of ``shardline demo``: a :class:`shardline.WorkerProxy` over in-process
discovery and in-process workers, driven through a scripted scenario.

Nothing opens a socket: a worker's address is a label such as ``127.0.0.1:7001``, and its
connection is an object whose ``dispatch`` returns which worker, at which address, served the
task. The scenario runs in phases; each phase sends its discovery events, waits until the proxy's
pool shows them, then dispatches its tasks one after another through the proxy:

1. workers w1, w2 and w3 join (the proxy starts with a quorum of 3);
2. w2 moves to a new address (``worker-updated``);
3. w4 joins;
4. w1 leaves (``worker-dropped``).

The simulated cluster knows every worker's current address. When a connection serves a task it
checks whether its address is still its worker's current one; a task served at an address that
was superseded (moved away from, or left) is counted as such, so the summary's count of them is
measured, not assumed.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from shardline import (
    DiscoveryEvent,
    LoadBalancerLike,
    RoundRobinLoadBalancer,
    WeightedRoundRobinLoadBalancer,
    WorkerMetadata,
    WorkerProxy,
)

__all__ = [
    "BALANCERS",
    "AddressRow",
    "InProcessDiscovery",
    "PhaseReport",
    "PoolRun",
    "Served",
    "run_pool_demo",
]

logger = logging.getLogger("shardline.demo")

BALANCERS: dict[str, Callable[[], LoadBalancerLike]] = {
    "round-robin": RoundRobinLoadBalancer,
    "weighted": WeightedRoundRobinLoadBalancer,
}

_NAMESPACE = uuid.UUID("0d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a")
# A weight per worker, read by the weighted balancer only (``extra["weight"]``).
_WEIGHTS = {"w1": 1, "w2": 2, "w3": 1, "w4": 2}
# How many event-loop turns the driver waits for the proxy to apply a phase's events.
_SETTLE_TURNS = 1000

EventType = Literal["worker-added", "worker-updated", "worker-dropped"]


class InProcessDiscovery:
    """Discovery events fed by the demo: an async iterable that waits for more until closed."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[DiscoveryEvent | None] = asyncio.Queue()

    def send(self, event: DiscoveryEvent) -> None:
        self._queue.put_nowait(event)

    def close(self) -> None:
        """Ends the iteration once the events already sent have been read."""
        self._queue.put_nowait(None)

    async def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
        while (event := await self._queue.get()) is not None:
            yield event


@dataclass(frozen=True, slots=True)
class Served:
    """What an in-process worker returns for a task: who served it, where, and whether that
    address had been superseded (the worker had moved away from it, or left) when it served."""

    task: Any
    name: str
    uid: uuid.UUID
    address: str
    superseded: bool


class _Cluster:
    """The simulated workers: each one's current address (the truth discovery reports)."""

    def __init__(self) -> None:
        self.names: dict[uuid.UUID, str] = {}
        self.current: dict[uuid.UUID, str] = {}

    def connect(self, metadata: WorkerMetadata) -> _Connection:
        """The proxy's ``connect``: a connection to ``metadata.address``."""
        return _Connection(self, metadata.uid, metadata.address)


class _Connection:
    """A connection to one worker at one address; it never opens a socket."""

    def __init__(self, cluster: _Cluster, uid: uuid.UUID, address: str) -> None:
        self._cluster = cluster
        self._uid = uid
        self._address = address

    async def dispatch(self, task: Any, *, timeout: float | None = None) -> Served:
        await asyncio.sleep(0)  # a real round trip would yield to the loop
        superseded = self._cluster.current.get(self._uid) != self._address
        if superseded:
            logger.warning("task %r served at superseded address %s", task, self._address)
        return Served(task, self._cluster.names[self._uid], self._uid, self._address, superseded)


@dataclass(frozen=True, slots=True)
class AddressRow:
    """One worker at one address after a phase: ``pooled`` (the proxy's current record),
    ``superseded`` (the worker has moved to another address) or ``left`` (the worker left)."""

    name: str
    uid: uuid.UUID
    address: str
    status: Literal["pooled", "superseded", "left"]
    tasks: int
    tasks_so_far: int

    @property
    def short_uid(self) -> str:
        return str(self.uid)[:8]


@dataclass(frozen=True, slots=True)
class PhaseReport:
    """Phase ``number`` (1-based): its events, the balancer, the tasks and where they went."""

    number: int
    description: str
    events: tuple[str, ...]
    balancer: str
    tasks: int
    rows: tuple[AddressRow, ...]


@dataclass(slots=True)
class PoolRun:
    """The whole pool scenario: each phase's report, then the totals."""

    balancer: str
    phases: list[PhaseReport] = field(default_factory=list)
    per_address: Counter[tuple[str, str]] = field(default_factory=Counter)
    superseded: int = 0

    @property
    def total(self) -> int:
        return self.per_address.total()


@dataclass(frozen=True, slots=True)
class _Phase:
    description: str
    events: tuple[tuple[EventType, str, str], ...]  # (type, worker name, address)
    tasks: int


PHASES = (
    _Phase(
        "workers w1, w2, w3 join",
        (
            ("worker-added", "w1", "127.0.0.1:7001"),
            ("worker-added", "w2", "127.0.0.1:7002"),
            ("worker-added", "w3", "127.0.0.1:7003"),
        ),
        9,
    ),
    _Phase(
        "w2 moves to a new address (worker-updated)",
        (("worker-updated", "w2", "127.0.0.1:7102"),),
        9,
    ),
    _Phase("w4 joins", (("worker-added", "w4", "127.0.0.1:7004"),), 12),
    _Phase("w1 leaves (worker-dropped)", (("worker-dropped", "w1", "127.0.0.1:7001"),), 9),
)


def _metadata(name: str, address: str) -> WorkerMetadata:
    number = int(name.removeprefix("w"))
    return WorkerMetadata(
        uid=uuid.uuid5(_NAMESPACE, name),
        address=address,
        pid=4100 + number,
        version="1.0",
        extra=MappingProxyType({"weight": _WEIGHTS[name]}),
    )


async def _settle(proxy: WorkerProxy, cluster: _Cluster) -> None:
    """Waits until the proxy's pool is exactly the cluster's current workers and addresses."""
    for _ in range(_SETTLE_TURNS):
        if {(m.uid, m.address) for m in proxy.workers} == set(cluster.current.items()):
            return
        await asyncio.sleep(0)
    raise RuntimeError("the proxy did not apply the discovery events")


async def _run(balancer: LoadBalancerLike) -> PoolRun:
    balancer_name = type(balancer).__name__
    result = PoolRun(balancer_name)
    cluster = _Cluster()
    discovery = InProcessDiscovery()
    seen: dict[tuple[uuid.UUID, str], str] = {}  # (uid, address) → worker name, in order
    task_number = 0
    first, *rest = PHASES

    def send(phase: _Phase) -> tuple[str, ...]:
        shown = []
        for kind, name, address in phase.events:
            metadata = _metadata(name, address)
            cluster.names[metadata.uid] = name
            if kind == "worker-dropped":
                cluster.current.pop(metadata.uid, None)
            else:
                cluster.current[metadata.uid] = address
            seen.setdefault((metadata.uid, address), name)
            discovery.send(DiscoveryEvent(kind, metadata))
            logger.debug("discovery: %s %s at %s", kind, name, address)
            shown.append(f"{kind} {name} {str(metadata.uid)[:8]} at {address}")
        return tuple(shown)

    async def dispatch(number: int, phase: _Phase, events: tuple[str, ...]) -> None:
        nonlocal task_number
        await _settle(proxy, cluster)
        counts: Counter[tuple[uuid.UUID, str]] = Counter()
        for _ in range(phase.tasks):
            task_number += 1
            served: Served = await proxy.dispatch(f"task-{task_number}")
            counts[served.uid, served.address] += 1
            result.per_address[served.name, served.address] += 1
            result.superseded += served.superseded
        pooled = {(m.uid, m.address) for m in proxy.workers}
        pooled_uids = {uid for uid, _ in pooled}
        rows = []
        for (uid, address), name in sorted(seen.items(), key=lambda item: item[1]):
            if (uid, address) in pooled:
                status: Literal["pooled", "superseded", "left"] = "pooled"
            elif uid in pooled_uids:
                status = "superseded"
            else:
                status = "left"
            rows.append(
                AddressRow(
                    name,
                    uid,
                    address,
                    status,
                    counts[uid, address],
                    result.per_address[name, address],
                )
            )
        result.phases.append(
            PhaseReport(number, phase.description, events, balancer_name, phase.tasks, tuple(rows))
        )

    first_events = send(first)  # queued before the proxy starts: it waits for the quorum of 3
    proxy = WorkerProxy(
        discovery=discovery,
        loadbalancer=balancer,
        connect=cluster.connect,
        quorum=len(first.events),
        quorum_timeout=10.0,
    )
    async with proxy:
        await dispatch(1, first, first_events)
        for number, phase in enumerate(rest, 2):
            await dispatch(number, phase, send(phase))
    discovery.close()
    return result


def run_pool_demo(balancer: str = "round-robin") -> PoolRun:
    """Runs the pool scenario with the balancer named ``balancer`` (a key of
    :data:`BALANCERS`) on a fresh event loop, and returns what it recorded."""
    return asyncio.run(_run(BALANCERS[balancer]()))
