"""A ``TopologySource`` that hands out what the test queues, for the tests of what consumes a
source (``run``, ``TopologyDiscovery``) without a cluster behind it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from shardline.topology.sources import TopologyChange, TopologySource

__all__ = ["QueuedSource"]


class QueuedSource(TopologySource):
    """Hands out ``changes``, then whatever the test puts in ``queue``, until ``aclose()``
    (which queues the end: what was queued before it is still handed out). ``refresh()``
    answers True at once, ``trigger()`` does nothing, ``resync()`` is counted in ``resyncs``."""

    def __init__(self, *changes: Any, name: str = "scripted") -> None:
        super().__init__(name)
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.resyncs = 0
        for change in changes:
            self.queue.put_nowait(change)

    async def _changes(self) -> AsyncIterator[TopologyChange]:
        try:
            while (change := await self.queue.get()) is not None:
                self._handing_out(change)
                yield change
        finally:
            self._iterating = False

    def _handing_out(self, change: TopologyChange) -> None:
        """Called with each change as it is handed out; a subclass records what it needs."""

    async def refresh(self) -> bool:
        return True

    def trigger(self) -> None:
        pass

    def resync(self) -> None:
        self.resyncs += 1

    async def aclose(self) -> None:
        self.queue.put_nowait(None)
