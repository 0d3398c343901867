"""Fixed-bucket histograms of durations that shardline's objects keep for their snapshots
(:class:`Histogram`, read as a :class:`HistogramSnapshot`), exported as Prometheus histograms by
:mod:`shardline.metrics` without the ``metrics`` extra being needed to keep them."""

from __future__ import annotations

import itertools
import math
from bisect import bisect_left
from dataclasses import dataclass

__all__ = ["DURATION_BUCKETS", "LAG_BUCKETS", "Histogram", "HistogramSnapshot"]

DURATION_BUCKETS: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
"""Upper bounds, in seconds, of a read or an apply: a millisecond to the longest timeouts."""

LAG_BUCKETS: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)
"""Upper bounds, in seconds, of a discovery record's way from its publisher to a pool: a watch
delivers in milliseconds, a lapsed lease or a reconnection takes up to minutes."""


@dataclass(frozen=True, slots=True)
class HistogramSnapshot:
    """Observations counted by bucket: ``counts[i]`` is the number of values ``v`` with
    ``bounds[i-1] < v <= bounds[i]``, and the last count (one more than there are bounds) those
    above every bound. ``sum`` is their total, ``count`` their number."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float

    @property
    def count(self) -> int:
        """The number of observations."""
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        """``(upper bound, observations at or below it)`` for each bound and ``"+Inf"``, the
        form of Prometheus buckets."""
        total = 0
        buckets = []
        for bound, count in zip((*map(repr, self.bounds), "+Inf"), self.counts, strict=True):
            total += count
            buckets.append((bound, total))
        return buckets


class Histogram:
    """A histogram over fixed, increasing, finite ``bounds``; one observation is a bisection
    and two additions.

    Raises ``ValueError`` for bounds that are empty, not finite or not strictly increasing.
    """

    __slots__ = ("_bounds", "_counts", "_sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        if not bounds or not all(math.isfinite(bound) for bound in bounds):
            raise ValueError(f"histogram bounds must be finite and at least one, not {bounds!r}")
        if any(low >= high for low, high in itertools.pairwise(bounds)):
            raise ValueError(f"histogram bounds must be strictly increasing, not {bounds!r}")
        self._bounds = bounds
        self._counts = [0] * (len(bounds) + 1)
        self._sum = 0.0

    def observe(self, value: float) -> None:
        """Counts ``value`` in the first bucket whose bound is at least ``value``."""
        self._counts[bisect_left(self._bounds, value)] += 1
        self._sum += value

    def snapshot(self) -> HistogramSnapshot:
        """The counts so far."""
        return HistogramSnapshot(self._bounds, tuple(self._counts), self._sum)
