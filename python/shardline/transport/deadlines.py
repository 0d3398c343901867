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

_SLACK = 64  # ended calls the heap may hold beyond twice the pending ones before a rebuild


class Deadlines(Generic[T]):
    """Calls ``expire(item)`` from ``loop`` once ``item``'s deadline (``loop.time()`` based)
    has passed, unless ``ended(item)`` is true by then.

    Implementation notes: a timeout scope or a timer per call costs more than a small call
    itself (with uvloop, about a third of a MessagePack-RPC echo's CPU), so the deadlines
    share one timer, armed for the earliest of them: a call adds a heap entry, and re-arms
    the timer only if its deadline is the earliest. A call that ends first leaves its entry
    behind; the heap is rebuilt without those once they outnumber the pending ones, so it
    stays within a constant factor of the calls in flight.
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
        self._heap: list[tuple[float, int, T]] = []
        self._order = itertools.count()  # ties broken by arrival, never by comparing items
        self._timer: asyncio.TimerHandle | None = None
        self._armed_for = math.inf

    def add(self, deadline: float, item: T) -> None:
        heap = self._heap
        heapq.heappush(heap, (deadline, next(self._order), item))
        if deadline < self._armed_for:
            self._arm(deadline)
        elif len(heap) > 2 * _SLACK and len(heap) % _SLACK == 0:
            self._compact()

    def close(self) -> None:
        """Forgets every deadline; nothing expires after this."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._armed_for = math.inf
        self._heap.clear()

    def _arm(self, deadline: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._armed_for = deadline
        self._timer = self._loop.call_at(deadline, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._armed_for = math.inf
        heap = self._heap
        now = self._loop.time()
        while heap and heap[0][0] <= now:
            _, _, item = heapq.heappop(heap)
            if not self._ended(item):
                self._expire(item)
        while heap and self._ended(heap[0][2]):
            heapq.heappop(heap)
        if heap:
            self._arm(heap[0][0])

    def _compact(self) -> None:
        pending = [entry for entry in self._heap if not self._ended(entry[2])]
        if 2 * len(pending) + _SLACK < len(self._heap):
            heapq.heapify(pending)
            self._heap = pending
