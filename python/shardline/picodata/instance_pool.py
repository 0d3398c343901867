"""``InstancePool``: the Picodata client's bounded pool of asyncpg connections to one instance."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from shardline.errors import InstanceUnavailable, PoolTimeout
from shardline.host_port import split_host_port
from shardline.picodata.pipeline import Pipeline
from shardline.picodata.stats import PoolStats
from shardline.pool.health import WorkerHealth
from shardline.topology.sources import pg_connect

__all__ = ["InstancePool"]

logger = logging.getLogger("shardline.picodata")

Connect = Callable[[str, int], Awaitable[Any]]
"""Opens one asyncpg connection to ``(host, port)`` with the client's credentials and TLS."""

BACKOFF_FIRST = 0.1
"""Seconds an instance is left alone after its first failed connect (then doubling)."""
BACKOFF_MAX = 5.0
"""The longest an instance is left alone between two connect attempts."""


class InstancePool:
    """At most ``size`` asyncpg connections to the instance ``uuid`` at ``address``
    (``host:port``, an IPv6 host in brackets; :class:`~shardline.errors.InvalidAddress`
    otherwise).

    :meth:`take` hands out an idle connection at once (the most recently used first) or
    ``None``; :meth:`acquire` also opens a new one while fewer than ``size`` are open, and
    otherwise waits up to ``acquire_timeout`` for one to be released (counted in ``waits``;
    :class:`~shardline.errors.PoolTimeout` after it). Every connection handed out goes back
    with :meth:`release`, ``broken=True`` if it must not be reused. A connection found closed
    when taken is discarded.

    A failed connect raises :class:`~shardline.errors.InstanceUnavailable` (the driver's error
    as its cause) and puts the instance in a backoff: until it ends (0.1 s after the first
    failure, doubling up to 5 s), :meth:`acquire` raises at once without dialling, unless
    ``redial=True``. The next connect that succeeds ends the backoff; :meth:`probe` tries one
    in the background once the backoff is over.

    Logs on ``shardline.picodata``: INFO at the first connection to the instance (and the
    first after an outage) and when the pool closes, WARNING once when the instance becomes
    unreachable; never per query.

    :meth:`aclose` stops handing out connections, closes the idle ones, makes waiting
    acquisitions raise ``InstanceUnavailable``, and returns once every connection lent out
    has come back and been closed.

    Implementation notes:
        asyncpg's own ``Pool`` runs a reset query (``RESET ALL``, unlisten, unlock, close
        portals) at every release, a round trip that costs about a third of the throughput of
        a trivial query (issue 11's measurements: 12k against 18k calls/s without it). This
        pool resets nothing: a connection goes back as it is, so session state a caller sets
        with ``SET`` stays on it; one released inside a transaction, or released ``broken``
        (the client does so when a query failed other than by a server error, e.g. timed out
        or cancelled mid-operation), is discarded instead, and one closed while idle is
        discarded when taken. Idle connections are a LIFO list (the warmest one is
        reused, the others may age out server-side); a released connection goes straight to
        the oldest waiter. A waiter is woken with ``None`` when a slot frees up without a
        connection (one was discarded or failed to open), and opens one itself.

        The client's query methods pop from ``idle`` and append to it themselves (no call of
        Python on the hot path, see ``client._query_method``), within this contract: they
        pop the last connection only if it is open, count it in ``queries``, and append it
        back only while no one waits, the pool is not closing and the connection is not in a
        transaction, i.e. exactly when :meth:`take` and :meth:`release` would do no more.
    """

    def __init__(
        self,
        uuid: str,
        address: str,
        *,
        connect: Connect,
        size: int,
        acquire_timeout: float,
        name: str | None = None,
    ) -> None:
        self.uuid = uuid
        self.uid = _uid_of(uuid)
        """The instance's uuid as a ``uuid.UUID``: its key in the client's health registry."""
        self.address = address
        self.name = name
        self.watched = False
        """True while the client reports this instance's queries to its health registry (see
        ``Client``'s notes on health); the hot path serves only instances not watched."""
        self._host, self._port = split_host_port(address)
        self._connect = connect
        self._size = size
        self._acquire_timeout = acquire_timeout
        self.idle: list[Any] = []
        """The idle connections, the warmest last (read-only but for the client's hot path)."""
        self._open = 0  # connections open or being opened
        self._opening = 0
        self.lent: dict[Any, int | None] = {}
        """Connection -> the client's deadline tick when it was last lent for a query (None:
        a query the driver bounds itself); written by the client, entries dropped here when
        the connection closes."""
        self.expired: set[Any] = set()
        """Connections the client closed because their query passed its deadline."""
        self.waiters: collections.deque[asyncio.Future[Any]] = collections.deque()
        """The acquisitions waiting for a connection, the oldest first (read-only)."""
        self.closing = False
        """True once :meth:`aclose` was called (read-only)."""
        self._drained: asyncio.Event | None = None
        # connections discarded and being closed politely in the background
        self._closing_tasks: set[asyncio.Task[None]] = set()
        self._failures_in_a_row = 0
        self._retry_at = -math.inf
        self._last_error: str | None = None
        self.waits = 0
        self.timeouts = 0
        self.connects = 0
        self.connect_failures = 0
        self.discarded = 0
        self.queries = 0
        self.pipeline: Pipeline | None = None
        """The instance's pipelined connection (see :meth:`start_pipeline`), None until it
        opens; a closed one stays until the next opens."""
        self._pipeline_task: asyncio.Task[None] | None = None
        self._pipeline_retry_at = -math.inf

    @property
    def label(self) -> str:
        """The instance as messages name it: its name and uuid when the name is known."""
        return f"{self.name} ({self.uuid})" if self.name else self.uuid

    @property
    def down(self) -> bool:
        """True while the instance is in its backoff after a failed connect."""
        return self._failures_in_a_row > 0 and time.monotonic() < self._retry_at

    def stats(self, health: WorkerHealth | None = None) -> PoolStats:
        """The pool's counters now, with ``health`` (the client's view of the instance)."""
        return PoolStats(
            uuid=self.uuid,
            address=self.address,
            size=self._size,
            open=self._open,
            idle=len(self.idle),
            in_use=self._open - self._opening - len(self.idle),
            waits=self.waits,
            timeouts=self.timeouts,
            connects=self.connects,
            connect_failures=self.connect_failures,
            discarded=self.discarded,
            down=self.down,
            queries=self.queries,
            health=health,
        )

    # taking and giving back

    def take(self) -> Any:
        """An idle connection, or None if none is idle (or the pool is closing)."""
        idle = self.idle
        while idle:
            connection = idle.pop()
            if not connection.is_closed():
                self.queries += 1
                return connection
            self._discard(connection, terminate=True)
        return None

    async def acquire(self, *, redial: bool = False) -> Any:
        """A connection of this instance: idle, newly opened, or released by another query
        within ``acquire_timeout``. Raises :class:`~shardline.errors.InstanceUnavailable` if
        none can be opened (or the pool is closing; at once during the backoff unless
        ``redial``), :class:`~shardline.errors.PoolTimeout` if all stay busy."""
        deadline: float | None = None  # of the wait for a busy pool, set when it starts
        while True:
            if self.closing:
                raise self._closed_error()
            connection = self.take()  # counts the query itself
            if connection is not None:
                return connection
            if self._open < self._size:
                connection = await self._open_one(redial=redial)
                self.queries += 1
                return connection
            if deadline is None:
                self.waits += 1
                deadline = asyncio.get_running_loop().time() + self._acquire_timeout
            connection = await self._wait(deadline)
            if connection is not None:
                if not connection.is_closed():
                    self.queries += 1
                    return connection
                self._discard(connection, terminate=True)
            # woken for a freed slot: loop, and open a connection in it unless another
            # query took it first

    def release(self, connection: Any, *, broken: bool = False) -> None:
        """Gives back a connection :meth:`take` or :meth:`acquire` handed out. A connection
        that is ``broken`` or still in a transaction is closed instead of reused."""
        # a connection closed meanwhile is found out by take(), not on every release
        if connection in self.lent:
            self.lent[connection] = None  # no query runs on it until one is lent it again
        if broken or self.closing or connection.is_in_transaction():
            self._discard(connection, terminate=broken)
            return
        waiters = self.waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(connection)
                return
        self.idle.append(connection)

    async def probe(self) -> bool:
        """If the instance is unreachable and its backoff is over, tries to open a connection
        and keeps it idle; True if the instance is (or was found) reachable. Meant for a
        background task, so that an instance that comes back has a connection waiting."""
        if self.closing or not self._failures_in_a_row:
            return not self.closing
        if self.down or self._open >= self._size:
            return False
        try:
            connection = await self._open_one(redial=False)
        except InstanceUnavailable:
            return False
        self.release(connection)
        return True

    # the pipelined connection

    def start_pipeline(self) -> None:
        """Opens ``pipeline`` (or a new one for a closed one) in the background, unless
        one is opening, the pool is closing or in its backoff, or the last attempt failed less
        than ``BACKOFF_MAX`` ago. The connection is not one of the ``size``: it is opened
        once, and carries the queries of many callers, at most ``size`` of them sent and
        unanswered at once (``Pipeline.limit``)."""
        if (
            self._pipeline_task is not None
            or self.closing
            or self.down
            or time.monotonic() < self._pipeline_retry_at
        ):
            return
        self._pipeline_task = asyncio.get_running_loop().create_task(self._open_pipeline())

    async def _open_pipeline(self) -> None:
        try:
            connection = await self._connect(self._host, self._port)
        except Exception as error:
            self._pipeline_retry_at = time.monotonic() + BACKOFF_MAX
            logger.info(
                "cannot open the pipelined connection to instance %s at %s: %s",
                self.label,
                self.address,
                pg_connect.message(error),
            )
            return
        finally:
            self._pipeline_task = None
        if (
            self.closing
            or connection._protocol.is_ssl
            # asyncpg writes UTF-8 when a server names no client_encoding
            or getattr(connection.get_settings(), "client_encoding", "UTF8") != "UTF8"
        ):
            # TLS connections are not taken over (not measured), and the pipeline encodes text
            # as UTF-8: their queries stay pooled
            self._pipeline_retry_at = math.inf
            connection.terminate()
            return
        # as many queries unanswered as the pool lends connections (see Pipeline)
        self.pipeline = Pipeline(connection, self._size)

    # closing

    async def aclose(self) -> None:
        """Closes the pool once the queries using it have finished (see the class)."""
        if not self.closing:
            self.closing = True
            if self._pipeline_task is not None:
                opening = self._pipeline_task
                opening.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await opening
            idle, self.idle = self.idle, []
            for connection in idle:
                self._forget(connection)
            await asyncio.gather(*(_close(connection) for connection in idle))
            error = self._closed_error()
            while self.waiters:
                waiter = self.waiters.popleft()
                if not waiter.done():
                    waiter.set_exception(error)
            if self.connects:
                logger.info("closing the pool of instance %s at %s", self.label, self.address)
        if self.pipeline is not None:
            await self.pipeline.aclose()
        if self._open:
            if self._drained is None:
                self._drained = asyncio.Event()
            await self._drained.wait()
        if self._closing_tasks:
            await asyncio.gather(*self._closing_tasks)

    # internals

    async def _open_one(self, *, redial: bool) -> Any:
        if not redial and self.down:
            raise InstanceUnavailable(
                f"instance {self.label} at {self.address} is unreachable ({self._last_error});"
                " not dialled again before its backoff ends",
                instance=self.uuid,
                address=self.address,
            )
        self._open += 1
        self._opening += 1
        try:
            connection = await self._connect(self._host, self._port)
        except BaseException as error:
            self._open -= 1
            self._opening -= 1
            self._wake_for_slot()
            if not isinstance(error, Exception):
                raise
            self.connect_failures += 1
            self._failures_in_a_row += 1
            delay = min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** (self._failures_in_a_row - 1))
            self._retry_at = time.monotonic() + delay
            self._last_error = f"{type(error).__name__}: {pg_connect.message(error)}"
            if self._failures_in_a_row == 1:  # once per outage, not per attempt
                logger.warning(
                    "cannot connect to instance %s at %s: %s",
                    self.label,
                    self.address,
                    self._last_error,
                )
            raise InstanceUnavailable(
                f"cannot connect to instance {self.label} at {self.address}: {self._last_error}",
                instance=self.uuid,
                address=self.address,
            ) from error
        if self._failures_in_a_row or not self.connects:
            logger.info("connected to instance %s at %s", self.label, self.address)
        self.connects += 1
        self._opening -= 1
        self._failures_in_a_row = 0
        if self.closing:
            self.release(connection)
            raise self._closed_error()
        return connection

    async def _wait(self, deadline: float) -> Any:
        """Waits until the loop time ``deadline`` for a released connection (or None: a freed
        slot)."""
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        try:
            async with asyncio.timeout_at(deadline):
                return await waiter
        except TimeoutError:
            self._give_back(waiter)
            self.timeouts += 1
            raise PoolTimeout(
                f"all {self._size} connections to instance {self.label} at {self.address}"
                f" stayed busy for acquire_timeout={self._acquire_timeout} s"
            ) from None
        except BaseException:
            self._give_back(waiter)
            raise

    def _give_back(self, waiter: asyncio.Future[Any]) -> None:
        """A waiter that gave up may have been handed a connection (or woken for a slot) in
        the same instant: pass that on, so it is not lost."""
        with contextlib.suppress(ValueError):
            self.waiters.remove(waiter)
        if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
            connection = waiter.result()
            if connection is not None:
                self.release(connection)
            else:
                self._wake_for_slot()
        elif not waiter.done():
            waiter.cancel()

    def _wake_for_slot(self) -> None:
        """A slot freed up without a connection to hand over: the oldest waiter opens one."""
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _discard(self, connection: Any, *, terminate: bool) -> None:
        if not self.closing:
            self.discarded += 1
        self._forget(connection)
        if terminate or connection.is_closed():
            connection.terminate()
        else:
            task = asyncio.get_running_loop().create_task(_close(connection))
            self._closing_tasks.add(task)
            task.add_done_callback(self._closing_tasks.discard)
        if not self.closing:
            self._wake_for_slot()

    def _forget(self, connection: Any) -> None:
        """One connection fewer is open (it was closed, or is being closed)."""
        self.lent.pop(connection, None)
        self.expired.discard(connection)
        self._open -= 1
        if self.closing and not self._open and self._drained is not None:
            self._drained.set()

    def _closed_error(self) -> InstanceUnavailable:
        return InstanceUnavailable(
            f"the pool of instance {self.label} at {self.address} is closed (the instance left"
            " the topology or changed address)",
            instance=self.uuid,
            address=self.address,
        )


def _uid_of(instance_uuid: str) -> uuid.UUID:
    """The instance's uuid as a ``uuid.UUID``; one derived from the text (uuid5) if the
    catalog's is not a uuid, so that any instance has a key."""
    try:
        return uuid.UUID(instance_uuid)
    except ValueError:
        return uuid.uuid5(uuid.NAMESPACE_OID, instance_uuid)


async def _close(connection: Any) -> None:
    """Closes a connection politely (Terminate message), bounded; forcibly if that fails."""
    try:
        await connection.close(timeout=1.0)
    except Exception:
        connection.terminate()
