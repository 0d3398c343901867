"""A source's run() cancelled at any turn of the loop around a trigger() ending its pause ends
cancelled, instead of polling on (``docs/architecture.md``: a loop must also be stoppable)."""

from __future__ import annotations

import asyncio

import pytest

from shardline import Topology
from shardline.topology.sources import PollingSource
from support.cancellation import stops_when_cancelled

pytestmark = pytest.mark.async_timeout(30)

# nothing listens there: each poll fails at once (connection refused), and the source then
# pauses for a minute, which only trigger() cuts short
NOWHERE = "postgresql://127.0.0.1:1/nowhere"


@pytest.mark.parametrize("turns", range(12))
async def test_a_run_cancelled_around_a_trigger_ends_cancelled(turns: int) -> None:
    source = PollingSource(NOWHERE, interval=60.0, retry=60.0, min_interval=0.0)
    running = asyncio.create_task(source.run(Topology(), warn_empty_after=None))
    try:
        assert await source.refresh() is False  # polled, failed; pausing now
        source.trigger()
        assert await stops_when_cancelled(running, turns)
    finally:
        running.cancel()
        await asyncio.wait([running])
        await source.aclose()
