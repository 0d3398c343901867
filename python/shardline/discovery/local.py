"""`LocalDiscovery`: discovery among processes on one machine, with no server to run."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import logging
import os
import re
import sqlite3
import stat
import tempfile
import threading
import uuid
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import TypeVar

from shardline.checks import check_seconds, refusal
from shardline.discovery.local_doorbell import Doorbell
from shardline.discovery.local_store import Batch, LocalStore, Registration, connect, head
from shardline.discovery.protocol import RecordFilter
from shardline.discovery.record import encode_record, stamped
from shardline.discovery.subscription import RecordFeed, Subscription
from shardline.errors import InvalidArgumentType
from shardline.workers import DiscoveryEvent, DiscoveryEventType, WorkerMetadata

__all__ = ["LocalDiscovery"]

logger = logging.getLogger("shardline.discovery.local")

_T = TypeVar("_T")
_BATCH = 512


class LocalDiscovery:
    """Discovery among processes on one machine: every handle opened on the same
    ``namespace`` and ``directory``, in any process of the same user, shares the same records,
    and each handle has its own publisher. Namespaces never see each other.

    ``directory`` defaults to ``$XDG_RUNTIME_DIR/shardline``, or else
    ``<tempdir>/shardline-<uid>``; a default directory is created private to the user and
    refused (``PermissionError``) if another user owns it or can write to it.

    Subscribers are woken as soon as a change is committed (on platforms with named pipes);
    ``poll_interval`` bounds the delay where they are not, or when a wake-up is lost. A
    subscriber that falls more than ``log_retention`` changes behind (it stopped reading)
    catches up by re-reading every record and receives exactly the differences, intermediate
    versions coalesced. A stored record a subscriber cannot read is skipped and counted in
    ``Subscription.skipped``; for that subscriber the worker is then absent (dropped, if it
    was shown).

    Liveness: a publisher that has published heartbeats every ``heartbeat`` seconds, from a
    thread of its own, so a handler that blocks the event loop (a ``time.sleep`` in an async
    handler) does not cost its worker the membership. One that stops (killed, or its whole
    process stalled) for longer than its ``liveness_timeout`` is presumed dead, and
    its records are withdrawn by the first handle on the namespace that notices, checking
    every ``heartbeat`` while it publishes or a subscription of it is being read: with the
    same settings everywhere, subscribers see the records dropped at most
    ``liveness_timeout + heartbeat`` seconds after the last heartbeat. A publisher that was
    only stalled gets back, at its next heartbeat, the records nobody replaced or withdrew
    meanwhile, and subscribers see them added again. ``liveness_timeout`` must be at least
    twice ``heartbeat``.

    The constructor opens (creating if needed) the namespace's database, a short blocking
    call; ``aclose()`` withdraws the records this handle's publisher owns, ends its
    subscriptions and closes the database. A handle belongs to one event loop.

    Implementation notes
    --------------------
    The store is one SQLite database per namespace in WAL mode, described in
    :mod:`shardline.discovery.local_store`: a ``records`` table, an append-only ``changes`` log
    and a ``publishers`` table of heartbeats. SQLite gives transactions between processes
    without a server, lets readers run beside a writer, and ships with Python. A change costs
    one small write transaction; a subscriber remembers its position in the log and reads only
    the entries after it, so its work per change does not depend on the number of workers, and
    it re-reads all records only when it subscribes or has fallen behind the trimmed log.

    Each handle that subscribes listens on a doorbell, a named pipe that writers poke after
    each commit that logged a change (:mod:`shardline.discovery.local_doorbell`). Woken, or
    every ``poll_interval`` in any case, a subscription compares the log's last position with
    its own, on a connection of the handle's own that never waits for a lock (one indexed
    read, tens of microseconds), and reads the log on the worker thread only when it moved;
    heartbeats, which do not touch the log, wake nobody. Every other SQLite call runs on one
    worker thread per handle, which also keeps a handle's operations in the order they were
    made.
    """

    def __init__(
        self,
        namespace: str,
        *,
        directory: str | os.PathLike[str] | None = None,
        heartbeat: float = 1.0,
        liveness_timeout: float = 5.0,
        poll_interval: float = 0.1,
        log_retention: int = 10_000,
    ) -> None:
        if not isinstance(namespace, str) or not namespace:
            raise refusal(namespace, str)(f"namespace must be a non-empty str, not {namespace!r}")
        self._heartbeat = check_seconds("heartbeat", heartbeat)
        timeout = check_seconds("liveness_timeout", liveness_timeout)
        if timeout < 2 * self._heartbeat:
            raise ValueError(
                f"liveness_timeout={liveness_timeout!r} must be at least twice"
                f" heartbeat={heartbeat!r}"
            )
        self._poll_interval = check_seconds("poll_interval", poll_interval)
        if isinstance(log_retention, bool) or not isinstance(log_retention, int):
            raise InvalidArgumentType(f"log_retention must be an int, not {log_retention!r}")
        if log_retention < 1:
            raise ValueError(f"log_retention must be at least 1, not {log_retention!r}")
        if directory is None:
            folder = _private_directory(_default_directory())
        else:
            folder = Path(directory)
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.namespace = namespace
        self._store = LocalStore(
            folder / _file_name(namespace), namespace, log_retention=log_retention
        )
        # never used by the worker thread: polled on the event loop, and never waits for a lock
        self._watch = connect(self._store.path, busy_timeout=0)
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"shardline-local-{namespace}"
        )
        self._closed = False
        self._doorbell: Doorbell | None = None
        self._polling = False
        self._next_reap = 0.0
        self._publisher = _LocalPublisher(self, Registration(timeout))

    @property
    def path(self) -> Path:
        """The database file of this namespace."""
        return self._store.path

    @property
    def publisher(self) -> _LocalPublisher:
        return self._publisher

    def subscribe(self, filter: RecordFilter | None = None) -> Subscription:
        """A subscription that replays the records present now, then streams changes."""
        self._check_open()
        # submitted now, so it precedes this handle's later publishes on the worker thread
        snapshot = self._executor.submit(self._store.snapshot)
        feed = RecordFeed(filter)
        return Subscription(self._follow(snapshot, feed), feed)

    async def aclose(self) -> None:
        """Withdraws the records this handle's publisher owns, then closes the handle."""
        if self._closed:
            return
        await self._publisher.aclose()
        self._closed = True
        if self._doorbell is not None:
            self._doorbell.close()
        await asyncio.get_running_loop().run_in_executor(self._executor, self._store.close)
        self._executor.shutdown(wait=False)
        self._watch.close()

    async def _follow(
        self, snapshot: concurrent.futures.Future[Batch], feed: RecordFeed
    ) -> AsyncGenerator[DiscoveryEvent, None]:
        batch = await asyncio.wrap_future(snapshot)
        if self._closed:
            return
        doorbell = self._listen()
        for event in self._events(batch, feed):
            yield event
        position = batch.head
        while not self._closed:
            await self._reap_if_due()
            if self._closed:
                return
            try:
                batch = await self._call(self._store.read, position, _BATCH)
            except sqlite3.OperationalError as error:
                if not _busy(error):
                    raise
                logger.warning("could not read %s, will retry: %s", self.path, error)
            else:
                position = batch.head
                for event in self._events(batch, feed):
                    yield event
                if len(batch.changes) == _BATCH:
                    continue
            await self._changed(position, doorbell)

    def _events(self, batch: Batch, feed: RecordFeed) -> list[DiscoveryEvent]:
        events: list[DiscoveryEvent] = []
        if batch.records is not None:
            current = {}
            for key, record in batch.records:
                uid = uuid.UUID(bytes=key)
                metadata = feed.decode(record, origin=f"{self.path} record {uid}", uid=uid)
                if metadata is not None:
                    current[uid] = metadata
            events.extend(feed.resync(current))
        for seq, key, data in batch.changes:
            uid = uuid.UUID(bytes=key)
            # a record replaced by one this reader cannot read is gone for it, as in a resync
            found = (
                None
                if data is None
                else feed.decode(data, origin=f"{self.path} change {seq}", uid=uid)
            )
            events.extend(feed.remove(uid) if found is None else feed.put(found))
        return events

    async def _changed(self, position: int, doorbell: Doorbell | None) -> None:
        """Returns once the log may have moved past ``position``, or a reap is due."""
        loop = asyncio.get_running_loop()
        while not self._closed:
            # taken before looking, so that a change committed after the look still wakes us
            rung = None if doorbell is None else doorbell.rung
            head = self._head()
            if head is None or head != position:
                return
            delay = min(self._poll_interval, self._next_reap - loop.time())
            if delay <= 0:
                return
            if rung is None:
                await asyncio.sleep(delay)
            else:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await rung.wait()

    def _listen(self) -> Doorbell | None:
        """This handle's doorbell, opened by its first subscription."""
        if self._doorbell is None and not self._polling:
            try:
                self._doorbell = Doorbell(self._store.doorbells)
            except (OSError, NotImplementedError) as error:
                self._polling = True
                logger.info(
                    "no doorbell for %s (%s): changes are noticed every %s s",
                    self.path,
                    error,
                    self._poll_interval,
                )
        return self._doorbell

    def _head(self) -> int | None:
        """The position of the log's last entry; ``None`` when it cannot be read at once."""
        try:
            return head(self._watch)
        except sqlite3.OperationalError as error:
            if not _busy(error):
                raise
            return None

    async def _reap_if_due(self) -> None:
        now = asyncio.get_running_loop().time()
        if now >= self._next_reap:
            self._next_reap = now + self._heartbeat
            await self._call(self._store.reap)

    async def _call(self, function: Callable[..., _T], *args: object) -> _T:
        self._check_open()
        return await asyncio.get_running_loop().run_in_executor(self._executor, function, *args)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"LocalDiscovery({self.namespace!r}) is closed")


class _LocalPublisher:
    """The :class:`~shardline.discovery.protocol.DiscoveryPublisher` of a LocalDiscovery."""

    def __init__(self, discovery: LocalDiscovery, registration: Registration) -> None:
        self._discovery = discovery
        self._registration = registration
        self._heartbeats: threading.Event | None = None  # set to stop them

    async def publish(self, type: DiscoveryEventType, metadata: WorkerMetadata) -> None:
        store = self._discovery._store
        if type == "worker-dropped":
            await self._discovery._call(store.drop, metadata.uid.bytes)
        elif type in ("worker-added", "worker-updated"):
            data = encode_record(stamped(metadata))
            if self._heartbeats is None:
                # Beating before the record can be seen: once it is, a caller may reach the
                # worker, and a handler that blocks the loop before this coroutine resumes
                # would keep a thread started after the put from starting (a flap). Until
                # the put registers this publisher, its beats do nothing.
                self._heartbeats = threading.Event()
                threading.Thread(
                    target=self._beat,
                    args=(self._heartbeats,),
                    name=f"shardline-heartbeat-{self._discovery.namespace}",
                    daemon=True,
                ).start()
            await self._discovery._call(store.put, self._registration, metadata.uid.bytes, data)
        else:
            raise ValueError(f"unknown discovery event type {type!r}")

    async def aclose(self) -> None:
        """Withdraws the records this publisher still owns; it may publish again afterwards.
        Cancelled while it stops the heartbeats, it raises ``CancelledError`` at once and
        withdraws nothing."""
        heartbeats, self._heartbeats = self._heartbeats, None
        if heartbeats is not None:
            # A beat already queued runs before the withdrawal below (one SQLite thread, in
            # order); one queued after it finds the registration withdrawn and does nothing.
            heartbeats.set()
        await self._discovery._call(self._discovery._store.withdraw, self._registration)

    def _beat(self, stopped: threading.Event) -> None:
        """The heartbeat thread: a beat, and a reap of the publishers that lapsed, every
        ``heartbeat`` seconds until ``stopped``.

        Implementation notes: a thread, not a task of the event loop, which a handler that
        blocks it would stall, so its worker would be presumed dead and added again when the
        loop came back (a flap). The SQLite calls still run on the handle's SQLite thread,
        the only one that uses its connection; this thread only queues them there."""
        discovery = self._discovery
        store = discovery._store
        while not stopped.wait(discovery._heartbeat):
            try:
                beat = discovery._executor.submit(_beat_and_reap, store, self._registration)
            except RuntimeError:
                return  # the handle closed
            try:
                beat.result()
            except sqlite3.Error as error:
                # keep beating: a publisher that gives up here would be presumed dead
                logger.warning("heartbeat in %s failed: %s", discovery.path, error)
            except concurrent.futures.CancelledError:
                return  # the handle closed


def _beat_and_reap(store: LocalStore, registration: Registration) -> None:
    store.beat(registration)
    store.reap()


def _busy(error: sqlite3.OperationalError) -> bool:
    return error.sqlite_errorcode & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _file_name(namespace: str) -> str:
    """A file name per namespace: readable, and distinct even where the readable part is not."""
    readable = re.sub(r"[^A-Za-z0-9_.-]", "_", namespace)[:48]
    digest = hashlib.sha256(namespace.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{readable}-{digest}.sqlite3"


def _default_directory() -> Path:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "shardline"
    user = os.getuid() if hasattr(os, "getuid") else os.getlogin()
    return Path(tempfile.gettempdir()) / f"shardline-{user}"


def _private_directory(path: Path) -> Path:
    """``path``, created private to this user; refused if someone else could plant files."""
    path.mkdir(mode=0o700, exist_ok=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise PermissionError(f"{path} is not a directory")
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise PermissionError(f"{path} belongs to uid {info.st_uid}, not to this user")
    if info.st_mode & 0o022:
        raise PermissionError(f"{path} is writable by other users (mode {info.st_mode:o})")
    return path
