"""The registration part of ``shardline demo``: a replica swap whose replacement never comes up,
and the reachability record that heals on the serving replica's next probe.

Everything runs in one process, over the public :mod:`shardline.registration` API: a
:class:`~shardline.registration.MemoryRecordStore` holds the record of service ``app``, a
:class:`~shardline.registration.RegistrationKeeper` keeps it from each replica's side,
:func:`~shardline.registration.advertised_address` reads it, and a
:class:`~shardline.registration.RegistrationDiscovery` feeds a :class:`shardline.WorkerProxy`
whose connections are in-process (an address is a label; no socket is opened).

The story is the seed's (issue 5): replica A (owner ``a-1``) serves ``app``. Its replacement B
(owner ``b-2``) starts and claims the record, which turns it ``False`` while A still serves;
B's registration is refused while A holds the service ("client already exists and is active"),
and B is then killed without ever deregistering. A's next successful probe re-asserts ``True``:
the record heals. The same swap is then run with a model of the seed's pre-fix keeper, which
reports ``True`` only when it registers: there the record stays ``False`` for good.

Time is virtual: the keepers (and a client that dispatches one request per virtual second)
sleep on :class:`VirtualClock`, an injected :class:`~shardline.registration.Clock` that the
driver moves from one wake-up to the next, waiting after each until every sleeper sleeps again
and the proxy has applied the record's change. The keepers' real defaults (tick 5 s, probe
interval 60 s, backoff 30 s) therefore take a few milliseconds, and every time shown is exact.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
import time
from collections.abc import AsyncGenerator, AsyncIterable, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from shardline import DiscoveryEvent, NoWorkersAvailable, WorkerMetadata, WorkerProxy
from shardline.registration import (
    MemoryRecordStore,
    Record,
    RegistrationDiscovery,
    RegistrationKeeper,
    advertised_address,
)
from shardline.registration.clock import Clock

__all__ = [
    "SERVICE",
    "RegistrationDemoError",
    "RegistrationRun",
    "Timeline",
    "TimelineRow",
    "VirtualClock",
    "Window",
    "run_registration_demo",
]

SERVICE = "app"
REFUSAL = "client already exists and is active"
# How many event-loop turns the driver waits for the keepers and the proxy to settle.
_SETTLE_TURNS = 10_000


class RegistrationDemoError(RuntimeError):
    """The registration part could not run (a keeper or the proxy did not settle)."""


class VirtualClock:
    """A :class:`~shardline.registration.Clock` whose time moves only when the driver moves
    it: ``sleep`` waits until :meth:`wake_next` reaches its deadline, however long that takes
    in real time. Sleepers due at the same time wake in the order they went to sleep."""

    def __init__(self) -> None:
        self._now = 0.0
        self._queue: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._queue, (self._now + seconds, next(self._order), future))
        await future  # a cancelled sleeper cancels its future, which wake_next skips

    @property
    def sleeping(self) -> int:
        """How many sleepers wait to be woken."""
        return sum(1 for _, _, future in self._queue if not future.done())

    def next_deadline(self) -> float | None:
        """When the next sleeper is due, or ``None`` if nobody sleeps."""
        while self._queue and self._queue[0][2].done():
            heapq.heappop(self._queue)
        return self._queue[0][0] if self._queue else None

    def wake_next(self) -> None:
        """Moves time to the next sleeper's deadline and wakes it."""
        if self.next_deadline() is None:
            raise RuntimeError("nobody sleeps on the virtual clock")
        deadline, _, future = heapq.heappop(self._queue)
        self._now = max(self._now, deadline)
        future.set_result(None)

    def move_to(self, when: float) -> None:
        """Moves time on to ``when`` (never back) without waking anybody."""
        self._now = max(self._now, when)


@dataclass(frozen=True, slots=True)
class TimelineRow:
    """What happened at ``time`` (virtual seconds) and the state once it had settled:
    ``events`` (one line per replica or the driver), library ``logs``, the ``record``,
    what ``advertised_address`` answered, the discovery events the proxy got, and how a
    dispatch through the proxy went right then (``served_by`` the replica that answered, or
    ``None`` with ``failure`` saying why)."""

    time: float
    events: tuple[str, ...]
    record: Record | None
    advertised: str | None
    pool_events: tuple[str, ...]
    served_by: str | None
    failure: str | None = None
    logs: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Window:
    """A stretch of virtual time during which the record said A's service is not registered
    while A served it; ``end`` is ``None`` when it was still open at the end of the run."""

    start: float
    end: float | None
    opened_by: str
    closed_by: str | None

    @property
    def length(self) -> float | None:
        return None if self.end is None else self.end - self.start


@dataclass(slots=True)
class Timeline:
    """One run of the swap: which keeper ran it (``keeper``, a sentence), its rows, the
    wrong-``False`` windows measured from the record's changes, and the client's requests."""

    title: str
    keeper: str
    end: float
    rows: list[TimelineRow] = field(default_factory=list)
    windows: list[Window] = field(default_factory=list)
    requests: int = 0
    served: int = 0
    failed_while_wrong: int = 0
    failed_otherwise: int = 0
    dropped_at: list[float] = field(default_factory=list)  # the proxy got worker-dropped
    added_at: list[float] = field(default_factory=list)  # the proxy got worker-added


@dataclass(slots=True)
class RegistrationRun:
    """The registration part: the settings, the swap with the library's keeper (``fixed``),
    and, unless left out, the same swap with a model of the seed's pre-fix keeper
    (``contrast``). ``elapsed`` is the real time both took, in seconds."""

    tick: float
    probe_interval: float
    backoff: float
    claim_at: float
    killed_at: float
    end: float
    header: tuple[str, ...]
    fixed: Timeline
    contrast: Timeline | None = None
    elapsed: float = 0.0

    @property
    def bound(self) -> float:
        """The keeper's bound on a wrong ``False``: one probe interval plus one tick."""
        return self.probe_interval + self.tick


class _Keeper(Protocol):
    async def start(self) -> None: ...

    async def deregister(self) -> bool: ...


@dataclass(slots=True)
class _Replica:
    name: str
    owner: str
    address: str
    serving: bool = False  # the server serves this replica's registration
    alive: bool = True


class _Driver:
    """One swap, driven on a virtual clock; collects the facts of each step into rows."""

    def __init__(self, run: RegistrationRun, timeline: Timeline, prefix: bool) -> None:
        self.run = run
        self.timeline = timeline
        self.prefix = prefix
        self.clock = VirtualClock()
        self.store = _RecordingStore(self)
        self.a = _Replica("A", "a-1", "10.0.1.1:8080")
        self.b = _Replica("B", "b-2", "10.0.1.2:8080")
        self.replicas = {r.owner: r for r in (self.a, self.b)}
        self.facts: list[tuple[str, str]] = []  # (actor, what it did), in order
        self.last_call: dict[str, str] = {}  # owner -> "registration" or "probe"
        self.logs: list[str] = []
        self.pool_events: list[str] = []
        self.loops = 0  # tasks that sleep on the clock between their steps
        self.keepers: list[_Keeper] = []
        self.proxy: WorkerProxy | None = None
        self.wrong_since: tuple[float, str] | None = None

    # -- the replicas' callables -------------------------------------------------------------

    def fact(self, actor: _Replica | None, text: str) -> None:
        self.facts.append(("driver" if actor is None else f"{actor.name} ({actor.owner})", text))

    def register(self, replica: _Replica) -> Callable[[], Awaitable[str]]:
        async def register() -> str:
            if replica is self.b:
                # A still holds the service's client id: the server refuses B's connection
                self.fact(replica, f"register() refused: {REFUSAL}")
                raise ConnectionRefusedError(REFUSAL)
            replica.serving = True
            self.last_call[replica.owner] = "registration"
            self.fact(replica, f"register() returned {replica.address}")
            return replica.address

        return register

    def probe(self, replica: _Replica) -> Callable[[], Awaitable[bool]]:
        async def probe() -> bool:
            self.last_call[replica.owner] = "probe"
            self.fact(replica, "probe() answered: still served")
            return replica.serving

        return probe

    def is_ready(self, replica: _Replica) -> Callable[[], bool]:
        return lambda: replica.alive

    def keeper(self, replica: _Replica) -> _Keeper:
        options: dict[str, Any] = {
            "register": self.register(replica),
            "probe": self.probe(replica),
            "is_ready": self.is_ready(replica),
            "tick": self.run.tick,
            "probe_interval": self.run.probe_interval,
            "backoff": self.run.backoff,
            "clock": self.clock,
        }
        if self.prefix:
            return _PreFixKeeper(SERVICE, replica.owner, self.store, driver=self, **options)
        return RegistrationKeeper(SERVICE, replica.owner, self.store, **options)

    # -- what the store and the proxy see ----------------------------------------------------

    def written(self, after: Record | None, write: str) -> str:
        """Called by the store after every ``write`` (e.g. "B's claim"): opens and closes the
        wrong-False windows; what to say about it ("" if nothing)."""
        wrong = self.a.serving and not (after is not None and after.registered)
        now = self.clock.now()
        if wrong and self.wrong_since is None:
            self.wrong_since = (now, write)
            return " (a wrong False: A still serves)"
        if not wrong and self.wrong_since is not None:
            start, opened_by = self.wrong_since
            self.timeline.windows.append(Window(start, now, opened_by, write))
            self.wrong_since = None
            return f": the record heals, {now - start:.1f} s after {opened_by}"
        return ""

    async def observed(
        self, source: AsyncIterable[DiscoveryEvent]
    ) -> AsyncGenerator[DiscoveryEvent, None]:
        """The proxy's discovery: ``source``'s events, each noted on its way."""
        async for event in source:
            if event.type == "worker-dropped":
                self.pool_events.append("worker-dropped")
                self.timeline.dropped_at.append(self.clock.now())
            else:
                self.pool_events.append(f"{event.type} {event.metadata.address}")
                if event.type == "worker-added":
                    self.timeline.added_at.append(self.clock.now())
            yield event

    def connect(self, metadata: WorkerMetadata) -> _Connection:
        return _Connection(self, metadata.address)

    def pool_matches(self) -> bool:
        assert self.proxy is not None
        record = self.store.current
        wanted = {record.address} if record is not None and record.registered else set()
        return {m.address for m in self.proxy.workers} == wanted

    async def settle(self) -> None:
        """Waits until every loop sleeps on the clock again and the proxy shows the record."""
        for _ in range(_SETTLE_TURNS):
            if self.clock.sleeping == self.loops and self.pool_matches():
                return
            await asyncio.sleep(0)
        raise RegistrationDemoError(
            f"at {self.clock.now():.1f} s (virtual) the keepers or the proxy did not settle"
            f" within {_SETTLE_TURNS} event-loop turns"
        )

    async def dispatch(self, task: str) -> tuple[str | None, str | None]:
        """Who served ``task`` through the proxy, or why nobody did."""
        assert self.proxy is not None
        try:
            served: str = await self.proxy.dispatch(task)
        except NoWorkersAvailable:
            return None, "NoWorkersAvailable (app is not in the pool)"
        return served, None

    async def row(self) -> None:
        """Shows the step that just settled, if anything happened in it."""
        if not self.facts and not self.logs:
            return
        events: list[str] = []
        for actor, group in itertools.groupby(self.facts, key=lambda fact: fact[0]):
            events.append(f"{actor}: {', '.join(text for _, text in group)}")
        record = await self.store.get(SERVICE)

        def alive() -> str | None:
            return self.a.address if self.a.serving else None

        advertised = await advertised_address(self.store, SERVICE, alive=alive)
        served_by, failure = await self.dispatch(f"check at {self.clock.now():.1f} s")
        self.timeline.rows.append(
            TimelineRow(
                self.clock.now(),
                tuple(events),
                record,
                advertised,
                tuple(self.pool_events),
                served_by,
                failure,
                tuple(self.logs),
            )
        )
        self.facts.clear()
        self.logs.clear()
        self.pool_events.clear()

    # -- the scenario ------------------------------------------------------------------------

    async def client(self) -> None:
        """Dispatches one request per virtual second, at 0.5 s, 1.5 s, …, to the end."""
        await self.clock.sleep(0.5)
        while True:
            self.timeline.requests += 1
            served_by, _ = await self.dispatch(f"request {self.timeline.requests}")
            if served_by is not None:
                self.timeline.served += 1
            elif self.wrong_since is not None:
                self.timeline.failed_while_wrong += 1
            else:
                self.timeline.failed_otherwise += 1
            await self.clock.sleep(1.0)

    async def start(self, replica: _Replica) -> None:
        self.fact(replica, "starts")
        keeper = self.keeper(replica)
        self.keepers.append(keeper)
        self.loops += 1
        await keeper.start()

    async def kill(self, replica: _Replica) -> None:
        # a killed process runs no keeper: its ticks do nothing and it never deregisters
        replica.alive = False
        replica.serving = False
        self.fact(replica, "killed (it never deregisters; its keeper writes nothing more)")

    async def advance(self, until: float) -> None:
        """Wakes every sleeper due up to ``until``, one at a time, showing each step."""
        while (deadline := self.clock.next_deadline()) is not None and deadline <= until:
            self.clock.wake_next()
            await self.settle()
            await self.row()
        self.clock.move_to(until)

    async def main(self) -> None:
        run = self.run
        discovery = RegistrationDiscovery(self.store, [SERVICE])
        feed = self.observed(discovery.subscribe())
        self.proxy = WorkerProxy(discovery=feed, connect=self.connect, quorum=0)
        client: asyncio.Task[None] | None = None
        try:
            await self.proxy.start()
            client = asyncio.create_task(self.client(), name="registration demo client")
            self.loops += 1
            actions: list[tuple[float, Callable[[], Awaitable[None]]]] = [
                (0.0, lambda: self.start(self.a)),
                (run.claim_at, lambda: self.start(self.b)),
                (run.killed_at, lambda: self.kill(self.b)),
            ]
            for when, action in sorted(actions, key=lambda item: item[0]):
                await self.advance(when)
                await action()
                await self.settle()
                await self.row()
            await self.advance(run.end)
            if self.wrong_since is not None:
                start, opened_by = self.wrong_since
                self.timeline.windows.append(Window(start, None, opened_by, None))
        finally:
            self.store.recording = False
            await self.proxy.stop()
            await feed.aclose()
            await discovery.aclose()
            if client is not None:
                client.cancel()
                await asyncio.wait([client])
            for keeper in self.keepers:
                await keeper.deregister()


class _Connection:
    """The proxy's connection to an address: answers which live replica serves there."""

    def __init__(self, driver: _Driver, address: str) -> None:
        self._driver = driver
        self._address = address

    async def dispatch(self, task: Any, *, timeout: float | None = None) -> str:
        for replica in self._driver.replicas.values():
            if replica.serving and replica.address == self._address:
                return replica.name
        raise ConnectionRefusedError(f"nothing serves {self._address}")


class _RecordingStore(MemoryRecordStore):
    """A :class:`MemoryRecordStore` that tells the driver about every write (while
    ``recording``): who wrote what, and whether it changed the record."""

    def __init__(self, driver: _Driver) -> None:
        super().__init__()
        self._driver = driver
        self.recording = True
        self.current: Record | None = None

    async def claim(self, service: str, owner: str | None) -> None:
        before = self.current
        await super().claim(service, owner)
        await self._after(before, owner, "claims the record", "claim")

    async def report(
        self, service: str, registered: bool, owner: str | None, address: str | None = None
    ) -> bool:
        before = self.current
        applied = await super().report(service, registered, owner, address)
        what = f"reports {registered}"
        if not applied:
            what += ": dropped (not its record)"
        verb = f"report {registered}"
        if registered and owner in self._driver.last_call:
            verb += f" after its {self._driver.last_call[owner]}"
        await self._after(before, owner, what, verb)
        return applied

    async def _after(self, before: Record | None, owner: str | None, what: str, verb: str) -> None:
        # MemoryRecordStore.get never suspends: this is the record the write left
        self.current = await self.get(SERVICE)
        if not self.recording:
            return
        replica = self._driver.replicas.get(owner) if owner is not None else None
        name = "an untagged replica" if replica is None else replica.name
        said = self._driver.written(self.current, f"{name}'s {verb}")
        self._driver.fact(replica, f"{what} (no change)" if self.current == before else what + said)


class _PreFixKeeper:
    """A model of the seed's keeper *before* the fix, for contrast only (not library code):
    it claims on start and reports ``True`` when a registration succeeds, but a successful
    probe reports nothing, so a record another writer turned ``False`` is never corrected.
    Its timers are those of :class:`~shardline.registration.RegistrationKeeper`."""

    def __init__(
        self,
        service: str,
        owner: str,
        store: MemoryRecordStore,
        *,
        driver: _Driver,
        register: Callable[[], Awaitable[str]],
        probe: Callable[[], Awaitable[bool]],
        is_ready: Callable[[], bool],
        tick: float,
        probe_interval: float,
        backoff: float,
        clock: Clock,
    ) -> None:
        self._service, self._owner, self._store, self._driver = service, owner, store, driver
        self._register, self._probe, self._is_ready = register, probe, is_ready
        self._tick, self._probe_interval, self._backoff = tick, probe_interval, backoff
        self._clock = clock
        self._address: str | None = None
        self._retry_at = -math.inf
        self._probe_at = math.inf
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._store.claim(self._service, self._owner)
        self._task = asyncio.create_task(self._run())

    async def deregister(self) -> bool:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task])
        return await self._store.report(self._service, False, self._owner)

    async def _run(self) -> None:
        while True:
            if self._is_ready():
                await self._tick_once()
            await self._clock.sleep(self._tick)

    async def _tick_once(self) -> None:
        now = self._clock.now()
        if self._address is None:
            if now < self._retry_at:
                return
            try:
                self._address = await self._register()
            except Exception:
                self._retry_at = self._clock.now() + self._backoff
                return
            self._probe_at = self._clock.now() + self._probe_interval
            await self._store.report(self._service, True, self._owner, self._address)
        elif now >= self._probe_at:
            alive = await self._probe()
            self._probe_at = self._clock.now() + self._probe_interval
            if alive:
                replica = self._driver.replicas[self._owner]
                self._driver.fact(replica, "reports nothing (pre-fix: only a registration does)")
            else:
                self._address = None


class _LogToRow(logging.Handler):
    """Shows the library's registration warnings in the timeline instead of on stderr."""

    def __init__(self, driver: _Driver) -> None:
        super().__init__(logging.WARNING)
        self._driver = driver

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._driver.logs.append(
                f"log {record.levelname.lower()} {record.name}: {record.getMessage()}"
            )
        except Exception:
            self.handleError(record)


async def _swap(run: RegistrationRun, timeline: Timeline, *, prefix: bool) -> None:
    driver = _Driver(run, timeline, prefix)
    library = logging.getLogger("shardline.registration")
    handler = _LogToRow(driver)
    propagate = library.propagate
    library.addHandler(handler)
    library.propagate = False
    try:
        await driver.main()
    finally:
        library.removeHandler(handler)
        library.propagate = propagate


def run_registration_demo(
    *,
    tick: float = 5.0,
    probe_interval: float = 60.0,
    backoff: float = 30.0,
    claim_at: float = 61.0,
    killed_at: float = 130.0,
    end: float = 240.0,
    contrast: bool = True,
) -> RegistrationRun:
    """Runs the replica swap on a fresh event loop and returns what it recorded: A registers at
    0 s, B claims the record at ``claim_at`` and is killed at ``killed_at`` (virtual seconds),
    and the run ends at ``end``. With ``contrast``, the same swap runs again with the model of
    the pre-fix keeper. The keepers get ``tick``, ``probe_interval`` and ``backoff``."""
    if not 0 < claim_at < killed_at < end:
        raise ValueError(f"need 0 < claim_at < killed_at < end, got {claim_at}, {killed_at}, {end}")

    def seconds(value: float) -> str:
        return f"{value:g} s"

    header = (
        f"Registration: the reachability record of service {SERVICE!r} in a MemoryRecordStore,"
        " kept by each replica's RegistrationKeeper, read with advertised_address and fed to a"
        " WorkerProxy by RegistrationDiscovery (in-process: addresses are labels, no socket is"
        " opened)",
        "replica A (owner a-1) serves app at 10.0.1.1:8080; its replacement B (owner b-2)"
        f" starts at {seconds(claim_at)} and claims the record, its registration is refused"
        f" while A holds the service ({REFUSAL!r}), and it is killed at {seconds(killed_at)}"
        " without deregistering",
        f"time is virtual: the keepers sleep on an injected clock that the demo moves from one"
        f" wake-up to the next; tick {seconds(tick)}, probe interval {seconds(probe_interval)},"
        f" backoff {seconds(backoff)} (RegistrationKeeper's defaults); a client dispatches one"
        " request to app through the proxy every virtual second",
    )
    run = RegistrationRun(
        tick,
        probe_interval,
        backoff,
        claim_at,
        killed_at,
        end,
        header,
        Timeline(
            "with the fix: the library's RegistrationKeeper",
            "each replica runs shardline.registration.RegistrationKeeper, which re-asserts True"
            " after every successful probe",
            end,
        ),
    )
    started = time.perf_counter()

    async def main() -> None:
        await _swap(run, run.fixed, prefix=False)
        if contrast:
            run.contrast = Timeline(
                "for contrast, the seed's pre-fix behaviour (a model, not library code)",
                "each replica runs a model of the pre-fix keeper: it reports True only when it"
                " registers, and a successful probe asserts nothing",
                end,
            )
            await _swap(run, run.contrast, prefix=True)

    asyncio.run(main())
    run.elapsed = time.perf_counter() - started
    return run
