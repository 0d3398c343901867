"""The interface every topology source implements: :class:`TopologySource`."""

from __future__ import annotations

import asyncio
import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator

from shardline._closing import AsyncClosing
from shardline._core import Topology
from shardline.checks import check_seconds
from shardline.errors import InvalidEvent, UnknownTier
from shardline.topology.sources.changes import TopologyChange, apply_change
from shardline.topology.sources.empty_maps import EMPTY_MAP_WARNING_AFTER, EmptyMapWatch
from shardline.topology.sources.state import FailureReason, SourceState, StateRecorder

__all__ = ["TopologySource"]


class TopologySource(AsyncClosing, ABC):
    """Where a :class:`shardline.Topology` learns the cluster from.

    A source is an async iterable of :data:`~shardline.topology.sources.TopologyChange`:
    iterating it connects, reads the cluster and hands out what changed, in the order the
    topology must apply it (replicasets, then instances, then bucket maps), until
    :meth:`aclose`. The first item after each (re)connection is a
    :class:`~shardline.topology.sources.TopologySnapshot` that rebuilds the view from scratch;
    items after it are incremental. Only one consumer may iterate a source at a time.

    :meth:`run` is that consumer for one topology: it applies every item with
    :func:`~shardline.topology.sources.apply_change`. :meth:`refresh` reads the cluster now and
    returns once what it read has been handed out — under :meth:`run`, applied; :meth:`trigger`
    only asks for an early read. :attr:`state` reports how the source is doing.

    No failure ends the iteration, and no document or row, whatever it holds, does either:
    each is counted in :attr:`state` by :class:`~shardline.topology.sources.FailureReason`,
    logged on ``shardline.topology.sources``, and retried or skipped; only :meth:`aclose` (or
    cancelling the consumer) ends it. A source never clears a bucket map on its own; a map is
    cleared only by the topology's rules, applying what the cluster said.

    Use a source on one event loop; ``async with source:`` closes it on exit.
    """

    def __init__(self, name: str) -> None:
        self._recorder = StateRecorder(name)
        self._rejections = 0
        self._closed = False
        self._iterating = False
        # _pause: set to cut a wait short and look again; _urgent ends it (a refresh asked)
        self._wake = asyncio.Event()
        self._urgent = False
        # refresh() calls waiting: (the number of the read that answers them, their future)
        self._waiters: list[tuple[int, asyncio.Future[bool]]] = []

    @property
    def state(self) -> SourceState:
        """A snapshot of the source's health and counters."""
        return self._recorder.snapshot()

    def __aiter__(self) -> AsyncIterator[TopologyChange]:
        """The changes, from a fresh snapshot on; raises RuntimeError if the source is already
        being iterated or is closed."""
        self._check_open()
        if self._iterating:
            raise RuntimeError(f"{self._recorder.name} is already being iterated")
        self._iterating = True
        return self._changes()

    @abstractmethod
    def _changes(self) -> AsyncIterator[TopologyChange]:
        """The iteration itself; it sets ``_iterating`` back to False when it ends."""

    @abstractmethod
    async def refresh(self) -> bool:
        """Reads the cluster now; returns once the result has been handed out (under
        :meth:`run`: applied), True if everything was read and accepted. Raises RuntimeError
        if nothing iterates the source."""

    @abstractmethod
    def trigger(self) -> None:
        """Asks for an early read of the cluster (e.g. after a routing miss); returns at once."""

    @abstractmethod
    def resync(self) -> None:
        """Makes the next item handed out a full :class:`TopologySnapshot`, for a consumer
        whose topology no longer holds what the source handed out."""

    @abstractmethod
    async def aclose(self) -> None:
        """Stops the source: an iteration in progress ends, :meth:`refresh` calls waiting
        return False, and the connection is closed. Idempotent."""

    async def _pause(self, delay: float) -> None:
        """Waits ``delay`` seconds, or less if :meth:`_due` moves the end closer, and not at
        all once the source is closed or a refresh is asked for."""
        loop = asyncio.get_running_loop()
        planned = loop.time() + delay
        while not (self._closed or self._urgent):
            now = loop.time()
            due = self._due(planned)
            if now >= due:
                return
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(due - now):
                    await self._wake.wait()

    def _due(self, planned: float) -> float:
        """When a pause planned to end at loop time ``planned`` ends (a source that can be
        triggered ends it sooner)."""
        return planned

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self._recorder.name} is closed")

    async def _require_consumer(self) -> None:
        """Raises RuntimeError if nothing iterates the source (a :meth:`run` task created just
        before is given the chance to start)."""
        if not self._iterating:
            await asyncio.sleep(0)
        if not self._iterating:
            raise RuntimeError(
                f"nothing runs {self._recorder.name}: call run(topology) or iterate it first"
            )

    def _waiter(self, read: int) -> asyncio.Future[bool]:
        """A future :meth:`_finish_waiters` resolves once read number ``read`` is handed out."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiters.append((read, future))
        return future

    def _finish_waiters(self, read: int | None, ok: bool = False) -> None:
        """Resolves the :meth:`refresh` calls that read number ``read`` answers (all of them,
        with False, for None)."""
        waiting = []
        for target, future in self._waiters:
            if read is None or target <= read:
                if not future.done():
                    future.set_result(ok)
            else:
                waiting.append((target, future))
        self._waiters = waiting

    async def run(
        self, topology: Topology, *, warn_empty_after: float | None = EMPTY_MAP_WARNING_AFTER
    ) -> None:
        """Applies every change this source hands out to ``topology``, until the source is
        closed (or the task running this is cancelled).

        A change the topology refuses (``InvalidEvent``, ``UnknownTier``), or any other
        exception raised while applying one, is counted as ``rejected`` and logged; the source
        then hands out a full snapshot at its next read, so the topology converges again. Only
        closing the source or cancelling the task ends the loop. The time each change took to
        apply is in ``state.apply_durations``.

        While it runs, a tier's map left empty (after having held ranges) for
        ``warn_empty_after`` seconds or more is logged as a WARNING on
        ``shardline.topology.sources``, repeated at most once a minute while it stays empty,
        and as INFO once it holds ranges again; a tier whose map has held no ranges at all
        ``warn_empty_after`` seconds after the source's first complete refresh (its buckets
        not bootstrapped yet) is said once, at INFO (see
        :class:`~shardline.topology.sources.empty_maps.EmptyMapWatch`); ``None`` turns both
        off. ``ValueError`` for a ``warn_empty_after`` that is not a positive, finite number.
        """
        watch = (
            None
            if warn_empty_after is None
            else EmptyMapWatch(
                self._recorder.name, check_seconds("warn_empty_after", warn_empty_after)
            )
        )
        changes = self.__aiter__()
        if watch is not None:
            recorder = self._recorder
            watch.start(topology, lambda: recorder.first_refresh)
        try:
            async for change in changes:
                started = time.perf_counter()
                try:
                    applied = apply_change(topology, change)
                except Exception as error:
                    # one change that cannot be applied must not end the stream
                    why = (
                        str(error)
                        if isinstance(error, InvalidEvent | UnknownTier)
                        else f"{type(error).__name__}: {error}"
                    )
                    self._rejections += 1
                    self._recorder.failure(
                        FailureReason.REJECTED, f"{type(change).__name__} refused: {why}"
                    )
                    self.resync()
                else:
                    self._recorder.events_applied += applied
                finally:
                    self._recorder.apply_durations.observe(time.perf_counter() - started)
        finally:
            if watch is not None:
                watch.stop()
            close = getattr(changes, "aclose", None)
            if close is not None:
                await close()
