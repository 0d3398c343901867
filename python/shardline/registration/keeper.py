"""`RegistrationKeeper`: one replica's side of a service's reachability record."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Literal

from shardline.checks import check_seconds
from shardline.registration.checks import check_owner, check_service
from shardline.registration.clock import Clock, MonotonicClock
from shardline.registration.record import RecordStore

__all__ = ["KEEPER_STATES", "KeeperState", "KeeperStats", "RegistrationKeeper"]

logger = logging.getLogger("shardline.registration")

KeeperState = Literal["idle", "unregistered", "registered", "deregistered"]
KEEPER_STATES: tuple[KeeperState, ...] = ("idle", "unregistered", "registered", "deregistered")
"""Every :attr:`KeeperStats.state`, in the order a keeper goes through them."""


@dataclass(frozen=True, slots=True)
class KeeperStats:
    """A snapshot of a keeper's counters (:attr:`RegistrationKeeper.stats`).

    ``registered`` is True while the keeper holds a registration (``address`` is set).
    ``registrations`` counts the ``register()`` calls that returned an address,
    ``registration_failures`` those that raised or returned none; ``probes`` counts the
    ``probe()`` calls that said the registration is still served, ``probe_failures`` those that
    said it is not or raised (each drops the registration). ``reports`` counts the writes of
    ``True`` the store accepted, ``report_failures`` those that raised; ``reasserts`` counts
    those of the accepted writes that followed a successful probe rather than a registration
    (the re-assertions that heal a record another writer turned ``False``).

    ``state`` is where the keeper is: ``"idle"`` (not started), ``"unregistered"`` (started:
    the record claimed, or a failed probe dropped the registration; registering is due),
    ``"registered"`` (it holds a registration, and the record says so once a report was
    accepted), ``"deregistered"`` (retracted; for good).
    """

    registered: bool
    registrations: int
    registration_failures: int
    probes: int
    probe_failures: int
    reports: int
    report_failures: int
    reasserts: int
    state: KeeperState


class RegistrationKeeper:
    """Keeps ``service``'s record in ``store`` true from the side of one replica, tagged
    ``owner`` (``None``: untagged).

    The caller supplies three callables:

    - ``register()``: registers this replica wherever the service is served and returns the
      address to advertise (a non-empty str); raising means the registration failed.
    - ``probe()``: asks the server whether it still serves this replica's registration;
      ``True`` means it does, ``False`` or raising means it does not.
    - ``is_ready()``: whether this replica is meant to serve right now.

    ``start()`` claims the record (``Record(owner, False)``, whatever was there: a new
    replica generation takes over) and starts a loop that ticks at once and then every
    ``tick`` seconds. A tick while ``is_ready()`` is false does nothing at all. A tick while
    ready:

    - when not registered, and no registration failed within the last ``backoff`` seconds:
      calls ``register()``; on success reports ``True`` with the address (if the replica is
      still ready once ``register()`` has returned); on failure logs it and tries again no
      sooner than ``backoff`` seconds later;
    - when registered, and ``probe_interval`` seconds have passed since the registration or
      since the last probe ended: calls ``probe()``; on success reads ``is_ready()`` again,
      *after* the probe returned, and reports ``True`` only if the replica is still ready (a
      deregistration can land while the probe is suspended); on failure writes nothing and
      drops the registration, so the next ready tick registers again (a reconnect).

    ``deregister()`` marks the keeper not ready, stops the loop (cancelling a ``register()``
    or ``probe()`` in flight, and waiting for a store write in flight), then reports ``False``
    and returns whether that was applied (not when a successor owns the record now). A
    deregistered keeper never writes ``True`` again and cannot be started again.
    ``async with keeper`` starts it and deregisters it on the way out.

    The bound on a wrong ``False``: when another writer turns the record ``False`` while this
    replica serves (a successor's claim; a competing replica's retraction after it took the
    record over), this keeper reports ``True`` again within ``probe_interval + tick`` seconds,
    plus the time its probe and write take, as long as it stays ready, its probes succeed and
    the store accepts the write.

    Failures: ``start()`` raises what the store's ``claim`` raises, ``deregister()`` what its
    ``report`` raises. In the loop, a failing write of ``True`` is logged and made again
    after the next successful probe; any other error of a tick (``is_ready()`` raising) is
    logged and the loop goes on. Arguments are checked on construction (``ValueError``,
    naming the value): ``tick`` and ``probe_interval`` positive, ``backoff`` zero or more,
    all finite.

    Implementation notes:
        The loop sleeps ``tick`` after each tick, so ticks drift by the time a tick's work
        takes; timers are read from ``clock`` (default :class:`MonotonicClock`). A write of
        ``True`` runs shielded from the loop's cancellation and ``deregister()`` waits for it
        before writing ``False``, so the two can never reach the store in the opposite order.
    """

    def __init__(
        self,
        service: str,
        owner: str | None,
        store: RecordStore,
        *,
        register: Callable[[], Awaitable[str]],
        probe: Callable[[], Awaitable[bool]],
        is_ready: Callable[[], bool],
        tick: float = 5.0,
        probe_interval: float = 60.0,
        backoff: float = 30.0,
        clock: Clock | None = None,
    ) -> None:
        self.service = check_service(service)
        self.owner = check_owner(owner)
        self._store = store
        self._register = register
        self._probe = probe
        self._is_ready = is_ready
        self._tick_seconds = check_seconds("tick", tick)
        self._probe_interval = check_seconds("probe_interval", probe_interval)
        self._backoff = check_seconds("backoff", backoff, zero=True)
        self._clock: Clock = MonotonicClock() if clock is None else clock
        self._address: str | None = None
        self._retry_at = -math.inf  # no registration attempt before this time
        self._probe_at = math.inf  # the next probe is due at this time
        self._started = False
        self._stopped = False
        self._task: asyncio.Task[None] | None = None
        self._write: asyncio.Future[bool] | None = None
        self._registrations = self._registration_failures = 0
        self._probes = self._probe_failures = 0
        self._reports = self._report_failures = self._reasserts = 0

    @property
    def address(self) -> str | None:
        """The address of this replica's current registration, ``None`` while unregistered."""
        return self._address

    @property
    def stats(self) -> KeeperStats:
        """A snapshot of the keeper's counters (see :class:`KeeperStats`)."""
        return KeeperStats(
            registered=self._address is not None,
            registrations=self._registrations,
            registration_failures=self._registration_failures,
            probes=self._probes,
            probe_failures=self._probe_failures,
            reports=self._reports,
            report_failures=self._report_failures,
            reasserts=self._reasserts,
            state=self._state(),
        )

    def _state(self) -> KeeperState:
        if self._stopped:
            return "deregistered"
        if not self._started:
            return "idle"
        return "unregistered" if self._address is None else "registered"

    async def start(self) -> None:
        """Claims the record and starts the loop; ``RuntimeError`` if the keeper was started or
        deregistered before."""
        if self._started or self._stopped:
            raise RuntimeError(
                f"the keeper of {self.service!r} was already started or deregistered"
            )
        self._started = True
        await self._store.claim(self.service, self.owner)
        if not self._stopped:  # a deregistration that landed during the claim wins
            self._task = asyncio.create_task(
                self._run(), name=f"registration keeper of {self.service!r}"
            )

    async def deregister(self) -> bool:
        """Stops the keeper and retracts the record; whether the retraction was applied."""
        self._stopped = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])
        write, self._write = self._write, None
        if write is not None:
            await asyncio.wait([write])
            if not write.cancelled() and write.exception() is not None:
                self._log_failed_write(write.exception())
        self._address = None
        return await self._store.report(self.service, False, self.owner)

    async def __aenter__(self) -> RegistrationKeeper:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.deregister()

    def _ready(self) -> bool:
        return not self._stopped and self._is_ready()

    async def _run(self) -> None:
        while True:
            try:
                await self._tick()
            except Exception:
                logger.exception("a registration tick of %r failed", self.service)
            await self._clock.sleep(self._tick_seconds)

    async def _tick(self) -> None:
        if not self._ready():
            return
        if self._address is None:
            if self._clock.now() >= self._retry_at:
                await self._try_register()
        elif self._clock.now() >= self._probe_at:
            await self._probe_and_assert(self._address)

    async def _try_register(self) -> None:
        try:
            address = await self._register()
            if not isinstance(address, str) or not address:
                raise ValueError(f"register() returned {address!r}, not an address")
        except Exception as error:
            self._registration_failures += 1
            self._retry_at = self._clock.now() + self._backoff
            logger.warning(
                "registering %r (owner %r) failed, next attempt in %s s: %s",
                self.service,
                self.owner,
                self._backoff,
                error,
            )
            return
        self._registrations += 1
        self._address = address
        self._probe_at = self._clock.now() + self._probe_interval
        await self._assert(address)

    async def _probe_and_assert(self, address: str) -> None:
        try:
            alive = await self._probe()
        except Exception as error:
            logger.warning("probing %r (owner %r) failed: %s", self.service, self.owner, error)
            alive = False
        self._probe_at = self._clock.now() + self._probe_interval
        if alive:
            self._probes += 1
            await self._assert(address, reassert=True)
        else:
            self._probe_failures += 1
            logger.warning(
                "%r (owner %r) is no longer served at %s; registering again",
                self.service,
                self.owner,
                address,
            )
            self._address = None

    async def _assert(self, address: str, *, reassert: bool = False) -> None:
        # read again now: readiness may have been withdrawn while register()/probe() suspended
        if not self._ready():
            return
        write = asyncio.ensure_future(self._store.report(self.service, True, self.owner, address))
        self._write = write
        try:
            await asyncio.shield(write)
        except Exception as error:
            self._report_failures += 1
            self._log_failed_write(error)
        else:
            self._reports += 1
            self._reasserts += reassert
        # left set only when the loop is cancelled during the write: deregister() waits for it
        self._write = None

    def _log_failed_write(self, error: BaseException | None) -> None:
        logger.warning(
            "reporting %r (owner %r) registered failed; the next probe reports again: %s",
            self.service,
            self.owner,
            error,
        )
