"""`Subscription`: one subscriber's stream of discovery events, derived from record changes.

Every backend reports raw changes (this uid's record is now X; this uid's record is gone; here
is the full current set) to a :class:`RecordFeed`, which decides what the subscriber sees. The
event types, the filter and the suppression of no-op updates are therefore the same for every
backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from shardline._histogram import LAG_BUCKETS, Histogram, HistogramSnapshot
from shardline._tasks import cancel_and_wait
from shardline.discovery.record import decode_record
from shardline.errors import InvalidRecord
from shardline.workers import DiscoveryEvent, WorkerMetadata

__all__ = ["DiscoveryStats", "RecordFeed", "Subscription"]

logger = logging.getLogger("shardline.discovery")


class RecordFeed:
    """The records one subscriber has been shown, and the events that keep it current.

    Each method returns the events the change produces for this subscriber, possibly none;
    none of them raises because of what a record holds. ``skipped`` counts the records that
    could not be read, by :class:`InvalidRecord` reason, and under ``"filter-error"`` the
    records on which the filter raised (each such record is absent for this subscriber).
    """

    def __init__(self, filter: Callable[[WorkerMetadata], bool] | None = None) -> None:
        self._filter = filter
        self._shown: dict[uuid.UUID, WorkerMetadata] = {}
        self.skipped: Counter[str] = Counter()

    @property
    def shown(self) -> Mapping[uuid.UUID, WorkerMetadata]:
        """The records the subscriber currently knows, by uid."""
        return self._shown

    def decode(
        self, data: bytes, *, origin: str, uid: uuid.UUID | None = None
    ) -> WorkerMetadata | None:
        """The record in ``data``, or ``None`` (logged and counted) when it cannot be read.

        ``origin`` names where it came from (a key, a file) for the warning; ``uid``, when the
        location already names one, must match the record's.
        """
        try:
            metadata = decode_record(data)
            if uid is not None and metadata.uid != uid:
                raise InvalidRecord("malformed", f"record of {metadata.uid} stored under {uid}")
        except InvalidRecord as error:
            self.skipped[error.reason] += 1
            logger.warning("skipped the discovery record at %s: %s", origin, error)
            return None
        return metadata

    def put(self, metadata: WorkerMetadata) -> list[DiscoveryEvent]:
        """The record of ``metadata.uid`` is now ``metadata``."""
        before = self._shown.get(metadata.uid)
        if self._filter is not None and not _accepts(self._filter, metadata, self.skipped):
            return self.remove(metadata.uid)
        self._shown[metadata.uid] = metadata
        if before is None:
            return [DiscoveryEvent("worker-added", metadata)]
        if before == metadata:
            return []
        return [DiscoveryEvent("worker-updated", metadata)]

    def remove(self, uid: uuid.UUID) -> list[DiscoveryEvent]:
        """The record of ``uid`` is gone; a dropped event carries the last record shown."""
        before = self._shown.pop(uid, None)
        return [] if before is None else [DiscoveryEvent("worker-dropped", before)]

    def resync(self, current: Mapping[uuid.UUID, WorkerMetadata]) -> list[DiscoveryEvent]:
        """``current`` is the complete set of records now: exactly the differences."""
        events = [
            event for uid in list(self._shown) if uid not in current for event in self.remove(uid)
        ]
        for metadata in current.values():
            events.extend(self.put(metadata))
        return events


@dataclass(frozen=True, slots=True)
class DiscoveryStats:
    """A snapshot of what a :class:`Subscription` handed out (:attr:`Subscription.stats`).

    ``events`` counts the events taken from the subscription by type (``worker-added``,
    ``worker-updated``, ``worker-dropped``; a :class:`~shardline.WorkerProxy` applies each to
    its pool as it takes it); ``skipped`` is :attr:`Subscription.skipped`.

    ``lag`` times, for each ``worker-added`` and ``worker-updated`` event whose record carries
    its publish time (:attr:`~shardline.workers.WorkerMetadata.published`) and was published
    after the subscription was made, the seconds from the publish to the event being taken:
    records that were already there when the subscription began are counted as events, not
    timed (their age is not a delay), nor are drops (their record is the last one shown).
    Publish times come from the publisher's wall clock and are read against this host's, so the
    lag means something only between hosts whose clocks are synchronised (NTP: a few
    milliseconds); a publish time later than the event's taking (the publisher's clock ahead)
    is counted as a lag of 0 and in ``clock_ahead``.
    """

    events: Mapping[str, int]
    skipped: Mapping[str, int]
    lag: HistogramSnapshot
    clock_ahead: int


class Subscription(AsyncIterator[DiscoveryEvent]):
    """An async iterator of :class:`DiscoveryEvent` that a backend feeds; ``aclose()`` ends it.

    Waiting for the next event may be cancelled (``anext(subscription)`` under
    ``asyncio.timeout``, a proxy stopping) without losing anything: the event being waited for
    is returned by the next call. ``aclose()`` waits for the step it cancels to end; if
    ``aclose()`` itself is cancelled meanwhile, it raises ``CancelledError`` at once.
    ``skipped`` counts the records skipped, by reason: unreadable (``"oversized"``,
    ``"malformed"``, ``"unknown-schema"``), or refused by a filter that raised on them
    (``"filter-error"``). No record ends the subscription. :attr:`stats` counts the events
    taken and times their way from the publisher (see :class:`DiscoveryStats`).

    Implementation notes:
        The backend's async generator is advanced in a task that a cancelled caller leaves
        running (``asyncio.shield``); cancelling it would throw into the generator and end
        the subscription.
    """

    def __init__(self, events: AsyncGenerator[DiscoveryEvent, None], feed: RecordFeed) -> None:
        self._events = events
        self._feed = feed
        self._next: asyncio.Future[DiscoveryEvent] | None = None
        self._since = time.time()
        self._events_taken: Counter[str] = Counter()
        self._lag = Histogram(LAG_BUCKETS)
        self._clock_ahead = 0

    @property
    def skipped(self) -> Mapping[str, int]:
        return self._feed.skipped

    @property
    def stats(self) -> DiscoveryStats:
        """A snapshot of the events taken, the records skipped and the publish lag."""
        return DiscoveryStats(
            events=MappingProxyType(dict(self._events_taken)),
            skipped=MappingProxyType(dict(self.skipped)),
            lag=self._lag.snapshot(),
            clock_ahead=self._clock_ahead,
        )

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> DiscoveryEvent:
        if self._next is None:
            self._next = asyncio.ensure_future(self._events.__anext__())
            self._next.add_done_callback(_observed)
        pending = self._next
        try:
            event = await asyncio.shield(pending)
        except asyncio.CancelledError:
            # the step stays for the next call, even when it ended in the same turn of the
            # loop as this wait was cancelled: its event is not lost
            if pending.cancelled():
                self._next = None
            raise
        except BaseException:
            self._next = None
            raise
        self._next = None
        self._taken(event)
        return event

    def _taken(self, event: DiscoveryEvent) -> None:
        self._events_taken[event.type] += 1
        published = event.metadata.published
        if published is None or event.type == "worker-dropped" or published < self._since:
            return
        lag = time.time() - published
        if lag < 0:
            self._clock_ahead += 1
            lag = 0.0
        self._lag.observe(lag)

    async def aclose(self) -> None:
        pending, self._next = self._next, None
        if pending is not None:
            # the stream's end (StopAsyncIteration) is no error of aclose()
            with contextlib.suppress(StopAsyncIteration):
                await cancel_and_wait(pending)
        await self._events.aclose()


def _accepts(
    filter: Callable[[WorkerMetadata], bool], metadata: WorkerMetadata, skipped: Counter[str]
) -> bool:
    """The filter's verdict; a filter that raises refuses the record (counted, logged): one
    record it cannot judge must not end the subscriber's stream."""
    try:
        return bool(filter(metadata))
    except Exception:
        skipped["filter-error"] += 1
        logger.warning(
            "skipped the discovery record of %s: the subscription's filter raised",
            metadata.uid,
            exc_info=True,
        )
        return False


def _observed(step: asyncio.Future[DiscoveryEvent]) -> None:
    """Marks the step's outcome as seen: a step whose waiter was cancelled may end (the stream
    closing) with nobody awaiting it, which asyncio would report as never retrieved."""
    if not step.cancelled():
        step.exception()
