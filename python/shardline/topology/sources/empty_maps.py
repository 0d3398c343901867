"""The warning about a bucket map left empty: :class:`EmptyMapWatch`, which
:meth:`~shardline.topology.sources.TopologySource.run` keeps over its topology."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from shardline._core import Topology
from shardline.topology.sources.state import REPEAT_WARNING_INTERVAL

__all__ = ["EMPTY_MAP_WARNING_AFTER", "EmptyMapWatch"]

logger = logging.getLogger("shardline.topology.sources")

EMPTY_MAP_WARNING_AFTER = 30.0
"""Seconds a tier's map may stay empty, after having held ranges, before a source's ``run``
warns about it (its ``warn_empty_after`` argument)."""

_MAX_CHECK_PERIOD = 5.0


class EmptyMapWatch:
    """Warns on ``shardline.topology.sources`` about each tier of a topology whose bucket map
    has been empty for ``after`` seconds or more, after having held ranges (its keyed routes
    miss): once when it passes ``after``, again at most every
    :data:`~shardline.topology.sources.state.REPEAT_WARNING_INTERVAL` seconds while it stays
    empty, saying for how long; then INFO once it holds ranges again. ``name`` starts each line.

    A tier with buckets whose map has never held ranges ``after`` seconds or more after the
    source's first complete refresh is said once, at INFO, not warned about: before its buckets
    are bootstrapped (Picodata before its first rebalance) an empty map is the normal state, and
    the seed's rules create a new tier's map empty, to be filled by later bucket events. A tier
    without buckets (bucket count 0) is never mentioned.

    :meth:`check` looks once; :meth:`start` looks every ``min(after / 2, 5)`` seconds on the
    running loop until :meth:`stop`.

    Implementation notes:
        A look reads ``Topology.map_stats`` for each tier (its ``empty_since``, a wall-clock
        time), so the routing paths pay nothing for it; a timer rather than the sources'
        loops drives it, because a notification source waits without any periodic wake-up
        while nothing changes, which is when a cleared map stays empty.
    """

    def __init__(self, name: str, after: float) -> None:
        self._name = name
        self._after = after
        # tier -> (the empty_since its warnings are about, wall-clock time of the last one)
        self._warned: dict[str, tuple[float, float]] = {}
        self._timer: asyncio.TimerHandle | None = None
        # tiers said (at INFO) never to have been filled
        self._unfilled: set[str] = set()

    def check(self, topology: Topology, now: float, first_refresh: float | None = None) -> None:
        """Looks at each tier's map now (``now``: ``time.time()``), and logs what is due;
        ``first_refresh`` is the ``time.time()`` of the source's first complete refresh (None
        before it)."""
        for tier, bucket_count in topology.tiers.items():  # configured once: never leaves
            stats = topology.map_stats(tier)
            since = stats.empty_since
            if (
                since is None
                and stats.ranges == 0
                and bucket_count > 0
                and first_refresh is not None
                and now - first_refresh >= self._after
                and tier not in self._unfilled
            ):
                self._unfilled.add(tier)
                logger.info(
                    "%s: the map of tier %r has held no ranges %.1f s after the first complete"
                    " refresh (its buckets not bootstrapped yet?): keyed routes of the tier miss",
                    self._name,
                    tier,
                    now - first_refresh,
                )
            warned = self._warned.get(tier)
            if warned is not None and warned[0] != since:  # refilled since the last warning
                del self._warned[tier]
                warned = None
                logger.info("%s: the map of tier %r holds ranges again", self._name, tier)
            if since is None or now - since < self._after:
                continue
            if warned is not None and now - warned[1] < REPEAT_WARNING_INTERVAL:
                continue
            empty_for = now - since
            self._warned[tier] = (since, now)
            logger.warning(
                "%s: the map of tier %r has been empty for %.1f s (cleared and not refilled): "
                "keyed routes of the tier miss",
                self._name,
                tier,
                empty_for,
            )

    def start(
        self, topology: Topology, first_refresh: Callable[[], float | None] = lambda: None
    ) -> None:
        """Looks periodically on the running loop, until :meth:`stop`; ``first_refresh()``
        reads the time of the source's first complete refresh (see :meth:`check`)."""
        loop = asyncio.get_running_loop()
        period = min(self._after / 2, _MAX_CHECK_PERIOD)

        def tick() -> None:
            try:
                self.check(topology, time.time(), first_refresh())
            except Exception:  # a defect here must not stop the watch, nor the source
                logger.exception("%s: looking for empty bucket maps failed", self._name)
            self._timer = loop.call_later(period, tick)

        self._timer = loop.call_later(period, tick)

    def stop(self) -> None:
        """Stops the periodic look; idempotent."""
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
