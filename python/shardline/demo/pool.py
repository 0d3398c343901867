"""The worker-pool part of ``shardline demo``: the report every pool driver produces, the
streaming interface its views implement, and the in-process driver (``--in-process``): a
:class:`shardline.WorkerProxy` over in-process discovery and in-process workers.

The default driver, with real worker processes over gRPC and ``LocalDiscovery`` or etcd, is
:mod:`shardline.demo.pool_processes`; both produce a :class:`PoolRun`.

In-process, nothing opens a socket: a worker's address is a label such as ``127.0.0.1:7001``,
and its connection is an object whose ``dispatch`` returns which worker, at which address,
served the task. The scenario runs in phases; each phase sends its discovery events, waits until
the proxy's pool shows them, then dispatches its tasks one after another through the proxy:

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
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, Protocol

from shardline import DiscoveryEvent, LoadBalancerLike, WorkerMetadata, WorkerProxy
from shardline.balancers import create_balancer

__all__ = [
    "AddressRow",
    "InProcessDiscovery",
    "PhaseReport",
    "PoolDemoError",
    "PoolRun",
    "PoolView",
    "Served",
    "run_pool_demo",
]

logger = logging.getLogger("shardline.demo")

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


Status = Literal["pooled", "superseded", "left"]


def status_of(workers: Iterable[WorkerMetadata]) -> Callable[[uuid.UUID, str], Status]:
    """The :class:`AddressRow` status of a worker's address, ``(uid, address)``, against the
    proxy's records ``workers``."""
    pooled = {(metadata.uid, metadata.address) for metadata in workers}
    pooled_uids = {uid for uid, _ in pooled}

    def status(uid: uuid.UUID, address: str) -> Status:
        if (uid, address) in pooled:
            return "pooled"
        return "superseded" if uid in pooled_uids else "left"

    return status


@dataclass(frozen=True, slots=True)
class AddressRow:
    """One worker at one address after a phase: ``pooled`` (the proxy's current record),
    ``superseded`` (the worker has moved to another address) or ``left`` (the worker left).

    ``tasks`` were answered there during the phase, ``tasks_so_far`` since the start.
    ``failures`` counts the dispatches there that failed transiently during the phase (the
    proxy went on to the next worker the balancer offered) and ``superseded`` the tasks sent
    there during the
    phase while it was no longer its worker's registered address. With real processes, ``pid``
    is the process the record names and ``process`` its state (``running``, ``exited 0``,
    ``killed (SIGKILL)``); in-process both are ``None``.
    """

    name: str
    uid: uuid.UUID
    address: str
    status: Status
    tasks: int
    tasks_so_far: int
    pid: int | None = None
    process: str | None = None
    failures: int = 0
    superseded: int = 0

    @property
    def short_uid(self) -> str:
        return str(self.uid)[:8]


@dataclass(frozen=True, slots=True)
class PhaseReport:
    """Phase ``number`` (1-based): what happened (``events``, one line each), the balancer, the
    tasks answered and where, and after it, what the proxy's pool held (``pool``, one line per
    worker; empty in-process, where the rows say it all). ``retried``: dispatches that failed
    transiently, after which the proxy went on to the next worker; ``failed``: tasks that
    failed altogether; ``superseded``: tasks sent to a superseded address. ``notes`` are
    measured facts about the phase, one line each."""

    number: int
    description: str
    events: tuple[str, ...]
    balancer: str
    tasks: int
    rows: tuple[AddressRow, ...]
    pool: tuple[str, ...] = ()
    retried: int = 0
    failed: int = 0
    superseded: int = 0
    notes: tuple[str, ...] = ()


@dataclass(slots=True)
class PoolRun:
    """A whole pool scenario: what ran it (``header`` lines; ``processes`` if real worker
    processes), each phase's report as it ends (``phase_count`` in all), then the totals.
    ``pids`` maps an address to the process that served there, for real processes, and
    ``closing`` says how the processes still running at the end were stopped."""

    balancer: str
    header: tuple[str, ...] = ()
    processes: bool = False
    phase_count: int = 0
    phases: list[PhaseReport] = field(default_factory=list)
    per_address: Counter[tuple[str, str]] = field(default_factory=Counter)
    pids: dict[str, int] = field(default_factory=dict)
    superseded: int = 0
    retried: int = 0
    failed: int = 0
    closing: str = ""

    @property
    def total(self) -> int:
        return self.per_address.total()


class PoolView(Protocol):
    """Shows a pool run as it goes: ``header`` once the run knows what it runs on, ``phase``
    as each phase ends, ``summary`` at the end."""

    def header(self, run: PoolRun) -> None: ...

    def phase(self, run: PoolRun, phase: PhaseReport) -> None: ...

    def summary(self, run: PoolRun) -> None: ...


class PoolDemoError(RuntimeError):
    """The pool part could not run (a worker that would not start, a change that never
    reached the proxy…); the message says what and why."""


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


HEADER = (
    "Worker pool: a WorkerProxy over in-process discovery and in-process workers"
    " (--in-process: addresses are labels; no socket is opened, no process started)",
)


async def _run(balancer: LoadBalancerLike, view: PoolView | None) -> PoolRun:
    balancer_name = type(balancer).__name__
    result = PoolRun(
        balancer_name,
        header=(
            *HEADER,
            f"balancer: {balancer_name}; the tasks of each phase are dispatched after the proxy"
            " has applied its discovery events",
        ),
        phase_count=len(PHASES),
    )
    if view is not None:
        view.header(result)
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
        stale: Counter[tuple[uuid.UUID, str]] = Counter()
        for _ in range(phase.tasks):
            task_number += 1
            served: Served = await proxy.dispatch(f"task-{task_number}")
            counts[served.uid, served.address] += 1
            stale[served.uid, served.address] += served.superseded
            result.per_address[served.name, served.address] += 1
            result.superseded += served.superseded
        status = status_of(proxy.workers)
        rows = []
        for (uid, address), name in sorted(seen.items(), key=lambda item: item[1]):
            rows.append(
                AddressRow(
                    name,
                    uid,
                    address,
                    status(uid, address),
                    counts[uid, address],
                    result.per_address[name, address],
                    superseded=stale[uid, address],
                )
            )
        report = PhaseReport(
            number,
            phase.description,
            events,
            balancer_name,
            phase.tasks,
            tuple(rows),
            superseded=stale.total(),
        )
        result.phases.append(report)
        if view is not None:
            view.phase(result, report)

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
    if view is not None:
        view.summary(result)
    return result


def run_pool_demo(balancer: str = "round-robin", *, view: PoolView | None = None) -> PoolRun:
    """Runs the in-process pool scenario with the balancer named ``balancer`` (a name in the
    ``shardline.balancers`` entry-point group) on a fresh event loop, showing it on ``view`` as
    it goes if given, and returns what it recorded."""
    return asyncio.run(_run(create_balancer(balancer), view))
