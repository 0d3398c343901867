"""Sources stop when told: a run() cancelled at any turn of the loop around a trigger() ending
its pause ends cancelled, instead of polling on; an aclose() whose caller is cancelled ends
cancelled (``docs/architecture.md``: a loop must also be stoppable)."""

from __future__ import annotations

import asyncio

import pytest

from shardline import Topology
from shardline.topology.sources import PollingSource
from shardline.topology.sources.notification import NotificationSource
from support.cancellation import stop_cancelled, stops_when_cancelled
from support.fakes import Session, Transport
from support.notify_documents import snapshot_documents
from support.replicasets import add

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


async def test_a_notification_source_aclose_whose_caller_is_cancelled_ends_cancelled() -> None:
    reference = Topology()
    reference.apply_tiers({"default": 3000})
    for event in add(1):
        reference.apply(event)
    transport = Transport([Session(snapshot_documents(reference, 1, 2), [], hold=True)])
    source = NotificationSource(transport=transport)
    running = asyncio.create_task(source.run(Topology(), warn_empty_after=None))
    assert await source.refresh()  # connected: a task reads the session's documents now
    stopper = await stop_cancelled(source.aclose)
    assert stopper.cancelled()
    await asyncio.wait([running])  # the source, closed, ends its run too
    await source.aclose()
    assert transport.opened[0].closed
