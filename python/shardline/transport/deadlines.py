"""``Deadlines``: the deadlines of many calls on one event loop, watched by a single timer."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Deadlines"]

T = TypeVar("T")

_SLACK = 64  # the fewest deadlines added between two sweeps


class Deadlines(Generic[T]):
    """Calls ``expire(item)`` from ``loop`` once ``item``'s deadline (``loop.time()`` based)
    has passed, unless ``ended(item)`` is true by then.

    Implementation notes: a timeout scope or a timer per call costs more than a small call
    itself (with uvloop, about a third of a MessagePack-RPC echo's CPU), so the deadlines
    share one timer, armed for the earliest of them. Most calls end long before their
    deadline, so adding one only appends it to a list (and re-arms the timer if it is the
    earliest): a sweep, once that list is as long as the heap (and at least ``_SLACK``), and
    the timer, move the entries of the calls not ended yet into a heap and drop the others.
    A call that ends before the next sweep never reaches the heap, and both stay within a
    constant factor of the calls in flight, each entry judged a constant number of times on
    average.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        expire: Callable[[T], None],
        ended: Callable[[T], bool],
    ) -> None:
        self._loop = loop
        self._expire = expire
        self._ended = ended
        self._added: list[tuple[float, T]] = []  # since the last sweep, in arrival order
        self._heap: list[tuple[float, int, T]] = []
        self._sweep_at = _SLACK
        self._order = itertools.count()  # ties broken by arrival, never by comparing items
        self._timer: asyncio.TimerHandle | None = None
        self._armed_for = math.inf

    def add(self, deadline: float, item: T) -> None:
        added = self._added
        added.append((deadline, item))
        if deadline < self._armed_for:
            self._arm(deadline)
        if len(added) >= self._sweep_at:
            self._sweep()

    def close(self) -> None:
        """Forgets every deadline; nothing expires after this."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._armed_for = math.inf
        self._added.clear()
        self._heap.clear()

    def _arm(self, deadline: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._armed_for = deadline
        self._timer = self._loop.call_at(deadline, self._fire)

    def _sweep(self) -> None:
        """Moves the pending entries added since the last sweep into the heap; drops the ended
        ones, there and in the heap."""
        ended = self._ended
        order = self._order
        heap = [entry for entry in self._heap if not ended(entry[2])]
        heap.extend((when, next(order), item) for when, item in self._added if not ended(item))
        heapq.heapify(heap)
        self._heap = heap
        self._added = []
        self._sweep_at = max(_SLACK, len(heap))

    def _fire(self) -> None:
        self._timer = None
        self._armed_for = math.inf
        ended = self._ended
        heap = self._heap
        order = self._order
        for when, item in self._added:
            if not ended(item):
                heapq.heappush(heap, (when, next(order), item))
        self._added = []
        now = self._loop.time()
        while heap and heap[0][0] <= now:
            _, _, item = heapq.heappop(heap)
            if not ended(item):
                self._expire(item)
        while heap and ended(heap[0][2]):
            heapq.heappop(heap)
        # (an expiry adds nothing at once, but an add would have armed the timer itself)
        if heap and heap[0][0] < self._armed_for:
            self._arm(heap[0][0])
