"""``NotificationSource``: the topology pushed by the cluster as the documents of Picodata's
topology-notification ADR, applied in raft order.

Picodata has not shipped these notifications yet: its accepted ADR
(``doc/adr/2025-09-12-pgproto-topology-notifications.md``) specifies them, as ``NOTICE``
messages on a pgproto connection opened with ``picodata_catalog_cdc=1``. The transport is a
small adapter (:class:`NotificationTransport`): it connects, subscribes, reads the snapshot burst
and then hands over the documents pushed after it. :mod:`.pg_notify` is the PostgreSQL
``LISTEN``/``NOTIFY`` stand-in the tests use, carrying the ADR's documents; a Picodata one
replaces it once Picodata pushes them. Nothing here does I/O or imports a driver.

The document format is described in :mod:`.notification_documents` and docs/notifications.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from shardline._tasks import cancel_and_wait
from shardline.checks import check_count, check_seconds
from shardline.topology.events import BucketEvent
from shardline.topology.sources.changes import (
    BucketSnapshot,
    TopologyChange,
    TopologySnapshot,
)
from shardline.topology.sources.notification_documents import (
    DEFAULT_MAX_DOCUMENT,
    DEFAULT_MAX_SNAPSHOT,
    DocumentError,
    RaftPosition,
    TopologyEvent,
    parse_event_document,
    parse_snapshot,
)
from shardline.topology.sources.notification_transport import (
    NotificationSession,
    NotificationTransport,
    TransportError,
)
from shardline.topology.sources.source import TopologySource
from shardline.topology.sources.state import FailureReason

__all__ = [
    "DeliveryStats",
    "NotificationSession",
    "NotificationSource",
    "NotificationTransport",
    "TransportError",
]

logger = logging.getLogger("shardline.topology.sources")

_SEEN_LIMIT: Final = 4096
"""How many recently handed-out events are remembered to recognise a redelivery."""


# ---------------------------------------------------------------------------------------------
# the source


@dataclass(frozen=True, slots=True)
class DeliveryStats:
    """What happened to the documents a :class:`NotificationSource` received.

    ``received`` counts the documents of the stream; each ends as exactly one of
    ``handed_out`` (newer than everything before it, or part of the last raft entry),
    ``duplicates`` (a redelivery, or at or below the snapshot's position), ``stale`` (older
    than the last event handed out and never seen: ignored, and a re-read of the snapshot is
    scheduled), ``skipped`` (malformed, too large, or about a tier outside the tier
    configuration: also counted in :attr:`SourceState.failures`), ``ignored`` (well formed, of
    a ``map`` shardline does not follow: the ADR lets new event types appear; the snapshot's
    such documents count here too). ``snapshots`` counts snapshots handed out; ``position`` is
    the raft position of what was handed out last (``None`` before the first snapshot);
    ``last_event`` the wall-clock time an event was last handed out.
    """

    received: int
    handed_out: int
    duplicates: int
    stale: int
    skipped: int
    ignored: int
    snapshots: int
    position: RaftPosition | None
    last_event: float | None


@dataclass(slots=True)
class _Counters:
    received: int = 0
    handed_out: int = 0
    duplicates: int = 0
    stale: int = 0
    skipped: int = 0
    ignored: int = 0
    snapshots: int = 0
    last_event: float | None = None


class _End:
    """The session's stream ended."""


_WAKE: Final = object()
"""Put in a session's queue to make the stream loop look at its flags."""

_END: Final = _End()


@dataclass(slots=True)
class _Session:
    session: NotificationSession
    queue: asyncio.Queue[object]
    reader: asyncio.Task[None] | None = None
    started: float = 0.0
    timer: asyncio.TimerHandle | None = field(default=None)


class NotificationSource(TopologySource):
    """The topology of a cluster that pushes its changes as the documents of Picodata's
    topology-notification ADR (``doc/adr/2025-09-12-pgproto-topology-notifications.md`` in
    picodata/picodata).

    Picodata has not shipped these notifications yet. Until it does, the transport is the
    PostgreSQL ``LISTEN``/``NOTIFY`` stand-in (``dsn=``), which carries the ADR's documents
    unchanged; a transport of Picodata's ``picodata_catalog_cdc`` connection can be passed as
    ``transport=`` once there is one (docs/notifications.md).

    Each connection subscribes, reads the tiers' bucket counts and the snapshot burst (the
    ``replace`` documents of every replicaset, instance and bucket range) and hands it out as a
    :class:`TopologySnapshot`; then it hands out one event per document, in raft order. A
    document at or below the snapshot's position, or a redelivery of one already handed out, is
    ignored. A document older than the last one handed out (delivered out of order) is ignored
    too, and, since the view may now lack what it said, the snapshot is read again (not sooner
    than ``min_resync_interval`` after the last one). Several documents at the same raft
    position (one entry changing several things) are all handed out. A document of a ``map``
    other than replicaset, instance and bucket is ignored (counted in :attr:`deliveries`).

    A malformed or oversized document (or one the parser fails on in any way), or a bucket
    range of a tier the tier configuration lacks or beyond its bucket count, is skipped, logged
    and counted in :attr:`state` (and :attr:`deliveries`); it never ends the stream, and
    neither does a transport whose ``connect()`` raises something other than
    :class:`TransportError` (counted as ``connect``). A lost connection, a failed connect or an
    unusable snapshot is counted by reason and retried after ``retry`` seconds, doubling up to
    ``max_retry``. The tier configuration is the first connection's (a tier with a bucket count
    of 0, an arbiter tier, is followed for membership only: routing in it raises
    :class:`shardline.TierWithoutBuckets`, and a bucket range in it is skipped as beyond its
    bucket count); a tier that later appears
    (or changes its bucket count) is counted as ``unknown-tier`` and its buckets are not
    followed.

    Its snapshots are ``complete``: applying one (:meth:`run`, or :func:`apply_change` for a
    consumer iterating the source itself) clears the topology first, so after a reconnect
    nothing the previous connection left survives: the topology holds exactly the new
    snapshot. :meth:`refresh` reads the snapshot again now (a new connection) and waits until it
    is applied; :meth:`trigger` asks for that, not sooner than ``min_resync_interval`` after
    the current connection was made.

    Args:
        dsn: a libpq connection string or URI for the PostgreSQL ``LISTEN``/``NOTIFY``
            stand-in transport
            (:class:`~shardline.topology.sources.pg_notify.PgNotifyTransport`, which needs the
            ``pg`` extra); exclusive with ``transport``.
        transport: any :class:`NotificationTransport` (e.g. Picodata's, once it pushes).
        channel, snapshot_query, tiers_query, ping_interval, connect_kwargs: passed to the
            PostgreSQL transport (only with ``dsn``): the channel to ``LISTEN`` on (default
            ``shardline_topology``), the query returning the snapshot burst, one document per
            row (default ``SELECT shardline_topology_snapshot()``), the query returning each
            tier's name and bucket count (default ``SELECT name, bucket_count FROM
            _pico_tier``), the seconds of silence after which the connection is checked, and
            extra ``asyncpg.connect`` arguments.
        timeout: seconds a connection (subscribing and reading the snapshot) may take.
        retry, max_retry: seconds before the first retry of a failed connection, and the cap
            of its doubling.
        min_resync_interval: the least time between the starts of two connections that
            :meth:`trigger` or an out-of-order document asked for.
        max_document: the largest document accepted, in bytes.
        max_snapshot: the largest snapshot burst accepted, in bytes (all its documents).
        max_queue: how many received documents may wait to be handed out before the
            transport is paused.

    Raises ``ValueError`` naming the argument for an invalid one.

    Implementation notes:
        A reader task per connection moves documents from the transport into a bounded
        queue; the iteration takes them from there, so :meth:`trigger`, :meth:`refresh` and
        :meth:`aclose` can interrupt a quiet stream by queueing a wake-up. Order is decided
        on the decoded event: the position handed out last, the snapshot's position, and the
        last 4,096 ``(position, event)`` pairs handed out (an older pair that fell out of
        that window counts as stale, which costs a re-read, never a wrong view). A re-read
        is a new session — subscribe, then snapshot — so it cannot lose a document either.
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        transport: NotificationTransport | None = None,
        channel: str | None = None,
        snapshot_query: str | None = None,
        tiers_query: str | None = None,
        ping_interval: float | None = None,
        connect_kwargs: Mapping[str, Any] | None = None,
        timeout: float = 5.0,
        retry: float = 0.1,
        max_retry: float = 2.0,
        min_resync_interval: float = 1.0,
        max_document: int = DEFAULT_MAX_DOCUMENT,
        max_snapshot: int = DEFAULT_MAX_SNAPSHOT,
        max_queue: int = 10_000,
    ) -> None:
        self._timeout = check_seconds("timeout", timeout)
        self._retry = check_seconds("retry", retry)
        self._max_retry = check_seconds("max_retry", max_retry)
        if self._max_retry < self._retry:
            raise ValueError(f"max_retry ({max_retry!r}) must not be less than retry ({retry!r})")
        self._min_resync_interval = check_seconds(
            "min_resync_interval", min_resync_interval, zero=True
        )
        self._max_document = check_count("max_document", max_document)
        self._max_snapshot = check_count("max_snapshot", max_snapshot)
        self._max_queue = check_count("max_queue", max_queue)
        if transport is None:
            if dsn is None:
                raise ValueError("give a dsn or a transport")
            from shardline.topology.sources.pg_notify import PgNotifyTransport

            pg_options: dict[str, Any] = {
                "channel": channel,
                "snapshot_query": snapshot_query,
                "tiers_query": tiers_query,
                "ping_interval": ping_interval,
            }
            transport = PgNotifyTransport(
                dsn,
                timeout=timeout,
                max_queue=max_queue,
                connect_kwargs=connect_kwargs,
                **{key: value for key, value in pg_options.items() if value is not None},
            )
        else:
            given = [
                name
                for name, value in (
                    ("dsn", dsn),
                    ("channel", channel),
                    ("snapshot_query", snapshot_query),
                    ("tiers_query", tiers_query),
                    ("ping_interval", ping_interval),
                    ("connect_kwargs", connect_kwargs),
                )
                if value is not None
            ]
            if given:
                raise ValueError(
                    f"{', '.join(given)} configure the PostgreSQL transport: not with transport="
                )
            if not callable(getattr(transport, "connect", None)):
                raise ValueError(f"transport must have a connect() method, got {transport!r}")
        self._transport = transport
        super().__init__(f"NotificationSource({transport.name})")

        self._tier_config: dict[str, int] | None = None
        self._position: RaftPosition | None = None
        self._snapshot_position: RaftPosition | None = None
        self._seen: OrderedDict[tuple[RaftPosition, TopologyEvent], None] = OrderedDict()
        self._counters = _Counters()

        self._current: _Session | None = None
        self._connecting: asyncio.Task[NotificationSession] | None = None
        self._resync_now = False
        self._resync_wanted = False
        self._started = 0

    # what the source reports

    @property
    def position(self) -> RaftPosition | None:
        """The raft position of the last snapshot or event handed out (``None`` before the
        first snapshot): under :meth:`run`, how far the topology has caught up."""
        return self._position

    @property
    def deliveries(self) -> DeliveryStats:
        """What happened to the documents received (see :class:`DeliveryStats`)."""
        c = self._counters
        return DeliveryStats(
            received=c.received,
            handed_out=c.handed_out,
            duplicates=c.duplicates,
            stale=c.stale,
            skipped=c.skipped,
            ignored=c.ignored,
            snapshots=c.snapshots,
            position=self._position,
            last_event=c.last_event,
        )

    # the TopologySource interface

    async def refresh(self) -> bool:
        """Reads the snapshot again now (a new connection); returns once it has been handed
        out (under :meth:`run`: applied), True if it was read and accepted, False if that
        connection failed or the source closed. Raises RuntimeError if nothing iterates the
        source (a :meth:`run` task created just before is given the chance to start)."""
        self._check_open()
        target = self._started + 1  # the first connection to start after this call
        await self._require_consumer()
        future = self._waiter(target)
        if self._started < target:
            self._resync_now = self._urgent = True
            self._poke()
        return await future

    def trigger(self) -> None:
        """Asks for a re-read of the snapshot, not sooner than ``min_resync_interval`` after
        the current connection was made; returns at once."""
        self._resync_wanted = True
        self._poke()

    def resync(self) -> None:
        self._resync_now = True
        self._poke()

    async def aclose(self) -> None:
        self._closed = True
        self._poke()
        self._finish_waiters(None)
        if self._connecting is not None:
            self._connecting.cancel()
        current = self._current
        if current is not None:
            await _close_session(current)

    # the connection loop

    async def _changes(self) -> AsyncIterator[TopologyChange]:
        loop = asyncio.get_running_loop()
        failed = 0
        try:
            while not self._closed:
                if failed:
                    await self._pause(min(self._max_retry, self._retry * 2 ** (failed - 1)))
                    if self._closed:
                        return
                self._started += 1
                attempt = self._started
                self._resync_now = self._resync_wanted = self._urgent = False
                self._recorder.attempts += 1
                reading = loop.time()
                session = await self._connect()
                if session is None:
                    self._recorder.read(loop.time() - reading)
                    failed += 1
                    self._finish_waiters(attempt, False)
                    continue
                current = _Session(session, asyncio.Queue(self._max_queue), started=loop.time())
                self._current = current
                try:
                    snapshot = self._read_snapshot(session)
                    self._recorder.read(loop.time() - reading)
                    if snapshot is None:
                        failed += 1
                        self._finish_waiters(attempt, False)
                        continue
                    rejections = self._rejections
                    self._recorder.events_emitted += 1
                    yield snapshot
                    if self._closed:
                        return
                    if self._rejections != rejections:
                        failed += 1
                        self._finish_waiters(attempt, False)
                        continue
                    failed = 0
                    self._recorder.refreshed()
                    self._finish_waiters(attempt, True)
                    current.reader = asyncio.create_task(self._read(current))
                    while not self._closed and not self._resync_due(current):
                        item = await current.queue.get()
                        if item is _WAKE:
                            continue
                        if isinstance(item, TransportError):
                            self._recorder.failure(item.reason, str(item))
                            failed = 1
                            break
                        if isinstance(item, _End):
                            self._recorder.failure(
                                FailureReason.CONNECTION_LOST, "the notification stream ended"
                            )
                            failed = 1
                            break
                        assert isinstance(item, str | bytes)
                        change = self._accept(item)
                        if change is not None:
                            self._recorder.events_emitted += 1
                            yield change
                finally:
                    self._current = None
                    await _close_session(current)
                    self._recorder.disconnected()
        finally:
            self._iterating = False
            self._finish_waiters(None)

    async def _connect(self) -> NotificationSession | None:
        """A new session, or None (the failure counted); None too if the source closed."""
        connecting = asyncio.ensure_future(self._connect_in_time())
        self._connecting = connecting
        try:
            return await connecting
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._closed and connecting.cancelled() and not (task and task.cancelling()):
                return None
            raise
        except TransportError as error:
            self._recorder.failure(error.reason, str(error))
            return None
        except Exception as error:  # a transport's own bug must not end the stream
            self._recorder.failure(FailureReason.CONNECT, f"{type(error).__name__}: {error}")
            return None
        finally:
            self._connecting = None

    async def _connect_in_time(self) -> NotificationSession:
        try:
            async with asyncio.timeout(self._timeout):
                session = await self._transport.connect()
        except TimeoutError:
            raise TransportError(
                FailureReason.TIMEOUT,
                f"no connection and snapshot within {self._timeout} s",
            ) from None
        if self._closed:
            with contextlib.suppress(Exception):
                await session.aclose()
            raise asyncio.CancelledError
        self._recorder.connected(session.server)
        return session

    def _read_snapshot(self, session: NotificationSession) -> TopologySnapshot | None:
        """The session's snapshot as a change to hand out, or None (the failure counted)."""
        try:
            tiers = _checked_tiers(session.tiers)
            document = parse_snapshot(
                session.snapshot, max_document=self._max_document, max_size=self._max_snapshot
            )
        except DocumentError as error:
            self._recorder.failure(error.reason, f"unusable snapshot: {error}")
            return None
        except Exception as error:  # whatever the parse raises, the snapshot is unusable
            self._recorder.failure(
                FailureReason.MALFORMED_ROW, f"unusable snapshot: {type(error).__name__}: {error}"
            )
            return None
        if self._tier_config is None:
            self._tier_config = dict(tiers)
        config = self._tier_config
        followed = []
        for tier, ranges in sorted(document.buckets.items()):
            count = config.get(tier)
            if count is None or count != tiers.get(tier):
                self._recorder.failure(
                    FailureReason.UNKNOWN_TIER,
                    f"tier {tier!r} (bucket_count {tiers.get(tier)}) is not in the tier"
                    f" configuration set by the first connection ({count});"
                    " its buckets are not followed",
                )
            elif ranges[-1].end > count:
                self._recorder.failure(
                    FailureReason.MALFORMED_BUCKETS,
                    f"unusable snapshot: range [{ranges[-1].start}, {ranges[-1].end}] is beyond"
                    f" the bucket count {count} of tier {tier!r}",
                )
                return None
            else:
                followed.append(BucketSnapshot(tier, ranges))
        followed.extend(
            BucketSnapshot(tier, ()) for tier in sorted(set(config) - set(document.buckets))
        )
        if self._position is not None and document.position < self._position:
            logger.info(
                "%s: the new snapshot is at %s, behind %s handed out before: rebuilding from it",
                self._recorder.name,
                document.position,
                self._position,
            )
        self._position = self._snapshot_position = document.position
        self._seen.clear()
        self._counters.snapshots += 1
        self._counters.ignored += document.ignored
        return TopologySnapshot(
            tiers=dict(config),
            replicasets=document.replicasets,
            instances=document.instances,
            buckets=tuple(followed),
            complete=True,
        )

    def _accept(self, document: str | bytes) -> TopologyEvent | None:
        """The event to hand out for one received document, or None (counted why)."""
        counters = self._counters
        counters.received += 1
        try:
            decoded = parse_event_document(document, max_size=self._max_document)
        except DocumentError as error:
            counters.skipped += 1
            self._recorder.failure(error.reason, f"document skipped: {error}")
            return None
        except Exception as error:  # one document, whatever it holds, never ends the stream
            counters.skipped += 1
            self._recorder.failure(
                FailureReason.MALFORMED_ROW, f"document skipped: {type(error).__name__}: {error}"
            )
            return None
        position, event = decoded.position, decoded.event
        if event is None:
            counters.ignored += 1
            logger.debug(
                "%s: document at %s of map %r ignored", self._recorder.name, position, decoded.map
            )
            return None
        if isinstance(event, BucketEvent):
            count = (self._tier_config or {}).get(event.tier)
            if count is None or event.end > count:
                counters.skipped += 1
                reason, why = (
                    (FailureReason.UNKNOWN_TIER, "is not in the tier configuration")
                    if count is None
                    else (FailureReason.MALFORMED_BUCKETS, f"has bucket_count {count}")
                )
                self._recorder.failure(
                    reason,
                    f"document at {position} skipped: range [{event.start}, {event.end}]"
                    f" of tier {event.tier!r}, which {why}",
                )
                return None
        key = (position, event)
        assert self._position is not None
        assert self._snapshot_position is not None
        if position <= self._snapshot_position or key in self._seen:
            counters.duplicates += 1
            return None
        if position < self._position:
            counters.stale += 1
            logger.info(
                "%s: a document at %s arrived after %s: ignored, the snapshot will be read again",
                self._recorder.name,
                position,
                self._position,
            )
            self._resync_wanted = True
            return None
        self._seen[key] = None
        if len(self._seen) > _SEEN_LIMIT:
            self._seen.popitem(last=False)
        self._position = position
        counters.handed_out += 1
        counters.last_event = time.time()
        return event

    async def _read(self, current: _Session) -> None:
        """Moves the session's documents into its queue (the reader task)."""
        queue = current.queue
        try:
            async for document in current.session.documents():
                await queue.put(document)
            await queue.put(_END)
        except TransportError as error:
            await queue.put(error)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # a transport's own bug must not hang the stream
            await queue.put(
                TransportError(FailureReason.CONNECTION_LOST, f"{type(error).__name__}: {error}")
            )

    def _resync_due(self, current: _Session) -> bool:
        if self._resync_now:
            return True
        if not self._resync_wanted:
            return False
        loop = asyncio.get_running_loop()
        due = current.started + self._min_resync_interval
        if loop.time() >= due:
            return True
        if current.timer is None:
            current.timer = loop.call_at(due, self._poke)
        return False

    def _poke(self) -> None:
        """Wakes the loop wherever it waits."""
        self._wake.set()
        current = self._current
        if current is not None:
            with contextlib.suppress(asyncio.QueueFull):
                current.queue.put_nowait(_WAKE)


def _checked_tiers(tiers: Mapping[str, int]) -> dict[str, int]:
    """The session's tiers, checked: names, and bucket counts of 0..2**32-1."""
    checked: dict[str, int] = {}
    for name, count in dict(tiers).items():
        if (
            not isinstance(name, str)
            or not name
            or isinstance(count, bool)
            or not isinstance(count, int)
            or not 0 <= count < 2**32
        ):
            raise DocumentError(
                FailureReason.MALFORMED_ROW,
                f"tier {name!r} has bucket count {count!r}: a name and 0..4294967295 expected",
            )
        checked[name] = count
    return checked


async def _close_session(current: _Session) -> None:
    if current.timer is not None:
        current.timer.cancel()
    reader, current.reader = current.reader, None
    if reader is not None:
        # the reader hands its failures over in the queue: only its end matters here
        with contextlib.suppress(Exception):
            await cancel_and_wait(reader)
    with contextlib.suppress(Exception):
        await current.session.aclose()
