"""Workers that cost nothing, for timing a ``WorkerProxy``'s own dispatch overhead: a connection
that answers at once and a discovery stream announcing a fixed set of workers.

It uses only what every build has, as ``build_worker.py`` needs to compare any two commits.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

from shardline import DiscoveryEvent, WorkerMetadata


class Immediate:
    """A connection that answers at once with the task."""

    async def dispatch(self, task: Any, *, timeout: float | None = None) -> Any:
        return task


async def announced(size: int) -> AsyncIterator[DiscoveryEvent]:
    """Announces ``size`` workers (uids 1 to ``size``), then stays open, announcing nothing more."""
    for n in range(size):
        record = WorkerMetadata(
            uid=uuid.UUID(int=n + 1), address=f"127.0.0.1:{10000 + n}", pid=1, version="1"
        )
        yield DiscoveryEvent("worker-added", record)
    await asyncio.Event().wait()
