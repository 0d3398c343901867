"""WorkerProxy stops when told: a stop() whose caller is cancelled ends cancelled, and a start()
cancelled at any turn of the loop around the quorum being reached ends cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from shardline import DiscoveryEvent, WorkerProxy
from support.cancellation import settled, steps, stop_cancelled, stops_when_cancelled
from support.fakes import Harness, Stream, added

pytestmark = pytest.mark.async_timeout(30)


async def test_a_stop_whose_caller_is_cancelled_ends_cancelled() -> None:
    stream = Stream(added(1))
    proxy = WorkerProxy(discovery=stream, connect=Harness().connect, quorum=1)
    await proxy.start()
    stopper = await stop_cancelled(proxy.stop)
    assert stopper.cancelled()
    assert not await settled()  # the discovery follower ended too
    stream.send("worker-added", added(2).metadata)
    await steps(5)
    assert len(proxy.workers) == 1


@pytest.mark.parametrize("turns", range(12))
async def test_a_start_cancelled_as_the_quorum_is_reached_ends_cancelled(turns: int) -> None:
    stream = Stream()
    proxy = WorkerProxy(discovery=stream, connect=Harness().connect, quorum=1)
    starting = asyncio.create_task(proxy.start())
    await steps(3)
    assert not starting.done()
    stream.send("worker-added", added(1).metadata)
    assert await stops_when_cancelled(starting, turns)
    await proxy.stop()


async def test_a_stop_raises_the_error_that_ended_the_discovery_follower() -> None:
    async def failing() -> AsyncIterator[DiscoveryEvent]:
        yield added(1)
        raise ConnectionError("discovery lost")

    proxy = WorkerProxy(discovery=failing(), connect=Harness().connect, quorum=1)
    await proxy.start()
    await steps(3)
    with pytest.raises(ConnectionError, match="discovery lost"):
        await proxy.stop()
