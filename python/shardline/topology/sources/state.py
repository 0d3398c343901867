"""How a topology source is doing: :class:`SourceState`, and the reasons it counts failures by."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from time import monotonic
from types import MappingProxyType

from shardline._histogram import DURATION_BUCKETS, Histogram, HistogramSnapshot

__all__ = [
    "REPEAT_WARNING_INTERVAL",
    "CountedFailure",
    "FailureReason",
    "SourceState",
    "StateRecorder",
]

logger = logging.getLogger("shardline.topology.sources")


class FailureReason(StrEnum):
    """Why a refresh (or part of one) failed; :attr:`SourceState.failures` counts by these."""

    CONNECT = "connect"
    """No connection could be made (refused, unreachable, authentication, TLS)."""
    CONNECTION_LOST = "connection-lost"
    """The connection broke during a refresh (the server went away, the session was killed)."""
    TIMEOUT = "timeout"
    """The server did not answer within the source's timeout."""
    QUERY = "query-error"
    """The server answered a catalog query with an error."""
    BUCKETS = "bucket-error"
    """``_pico_bucket(tier)`` raised, e.g. while a rebalance is in progress."""
    MALFORMED_ROW = "malformed-row"
    """A catalog row is not in the expected shape (type, uuid, duplicate, missing column)."""
    MALFORMED_BUCKETS = "malformed-buckets"
    """A tier's bucket map is unusable (not JSON, not an array, bad ranges, overlaps)."""
    TOO_LARGE = "too-large"
    """A result is over the source's bounds (rows per table, payload size, text length)."""
    UNKNOWN_TIER = "unknown-tier"
    """The catalog's tiers changed after the topology's tier configuration was set, or a tier
    asked for is not in the catalog."""
    REJECTED = "rejected"
    """The topology refused a change the source handed out, or raised while applying it."""
    UNEXPECTED = "unexpected-error"
    """A read raised an error the source has no check for (a defect, or input no check
    anticipated); what that read brought was dropped and the source went on."""


class CountedFailure(Exception):
    """A failure a source counts in :attr:`SourceState.failures`, by its ``reason``
    (``unexpected-error`` when the raiser did not say: ``CountedFailure()`` is an empty one,
    as a builtin error can be)."""

    def __init__(
        self, reason: FailureReason = FailureReason.UNEXPECTED, message: str | None = None
    ) -> None:
        super().__init__(*(() if message is None else (message,)))
        self.reason = reason


@dataclass(frozen=True, slots=True)
class SourceState:
    """A snapshot of a source's health, for a status display and for metrics.

    ``last_refresh`` is the wall-clock time (``time.time()``) of the last refresh that read and
    handed out everything (``None`` before the first); ``refreshes`` counts such refreshes and
    ``attempts`` every one. ``failures`` counts failures by :class:`FailureReason` value (a
    refresh that fails in two ways counts twice); ``last_failure`` describes the latest.
    ``tier_failures`` counts by tier name the failures that concern one tier alone (its bucket
    map could not be read, was unusable, or was not applied), so one tier whose buckets fail
    (not bootstrapped yet, rebalancing) is told from the others; each is in ``failures`` too.
    ``events_emitted`` counts what the source handed out, ``events_applied`` the changes
    :meth:`~shardline.topology.sources.TopologySource.run` made to its topology (a change that
    the topology already held is not counted). ``server`` names the server the source is
    connected to (``None`` when it is not), ``connects`` counts the connections made.
    ``read_durations`` is the time each of the ``attempts`` took to read (monotonic clock), by
    bucket (bounds :data:`~shardline._histogram.DURATION_BUCKETS`) and summed: a poll's connect
    and catalog queries, a notification session's connect and snapshot; not the time the
    topology took to apply what they handed out.
    ``apply_durations`` the time :meth:`~shardline.topology.sources.TopologySource.run` took to
    apply each change (a snapshot, an event, a bucket map), refused ones included.
    """

    connected: bool
    server: str | None
    last_refresh: float | None
    refreshes: int
    attempts: int
    failures: Mapping[str, int]
    tier_failures: Mapping[str, int]
    last_failure: str | None
    events_emitted: int
    events_applied: int
    connects: int
    read_durations: HistogramSnapshot
    apply_durations: HistogramSnapshot


REPEAT_WARNING_INTERVAL = 60.0
"""Seconds between two warnings about a reason that keeps failing."""


class StateRecorder:
    """The mutable counters behind :class:`SourceState`, kept by a source.

    Failures are logged on ``shardline.topology.sources``: a warning when a reason starts
    failing, debug while it keeps failing, with a warning again at most every
    :data:`REPEAT_WARNING_INTERVAL` seconds saying how many failures and for how long (so a
    long outage is never silent, and never a line per poll), and info once a refresh succeeds
    again.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.server: str | None = None
        self.last_refresh: float | None = None
        # the time of the first complete refresh: when the view first held the whole cluster
        self.first_refresh: float | None = None
        self.refreshes = 0
        self.attempts = 0
        self.failures: Counter[str] = Counter()
        self.tier_failures: Counter[str] = Counter()
        self.last_failure: str | None = None
        self.events_emitted = 0
        self.events_applied = 0
        self.connects = 0
        self.read_durations = Histogram(DURATION_BUCKETS)
        self.apply_durations = Histogram(DURATION_BUCKETS)
        # reason -> (monotonic time it started failing, failures since, last warning's time)
        self._failing: dict[str, tuple[float, int, float]] = {}

    def snapshot(self) -> SourceState:
        return SourceState(
            connected=self.server is not None,
            server=self.server,
            last_refresh=self.last_refresh,
            refreshes=self.refreshes,
            attempts=self.attempts,
            failures=MappingProxyType(dict(self.failures)),
            tier_failures=MappingProxyType(dict(self.tier_failures)),
            last_failure=self.last_failure,
            events_emitted=self.events_emitted,
            events_applied=self.events_applied,
            connects=self.connects,
            read_durations=self.read_durations.snapshot(),
            apply_durations=self.apply_durations.snapshot(),
        )

    def read(self, seconds: float) -> None:
        """An attempt took ``seconds`` to read."""
        self.read_durations.observe(seconds)

    def connected(self, server: str) -> None:
        self.server = server
        self.connects += 1
        logger.info("%s: connected to %s", self.name, server)

    def disconnected(self) -> None:
        self.server = None

    def failure(self, reason: FailureReason, message: str, *, tier: str | None = None) -> None:
        """Counts a failure by reason, and by ``tier`` when it concerns that tier alone."""
        self.failures[reason.value] += 1
        if tier is not None:
            self.tier_failures[tier] += 1
        self.last_failure = f"{reason.value}: {message}"
        now = monotonic()
        failing = self._failing.get(reason.value)
        if failing is None:
            self._failing[reason.value] = (now, 1, now)
            logger.warning("%s: %s", self.name, self.last_failure)
            return
        since, count, warned = failing
        count += 1
        if now - warned >= REPEAT_WARNING_INTERVAL:
            warned = now
            logger.warning(
                "%s: still failing (%d failures in %.0f s): %s",
                self.name,
                count,
                now - since,
                self.last_failure,
            )
        else:
            logger.debug("%s: %s (still failing)", self.name, self.last_failure)
        self._failing[reason.value] = (since, count, warned)

    def refreshed(self) -> None:
        self.refreshes += 1
        self.last_refresh = time.time()
        if self.first_refresh is None:
            self.first_refresh = self.last_refresh
        if self._failing:
            logger.info("%s: refreshed again after %s", self.name, ", ".join(sorted(self._failing)))
            self._failing.clear()
