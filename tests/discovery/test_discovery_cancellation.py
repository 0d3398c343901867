"""Discovery streams stop when told: an aclose() whose caller is cancelled ends cancelled, and
a subscription closed at any turn of the loop around a wake-up (a publish, a topology change)
ends there instead of waiting on (``docs/architecture.md``: a loop must also be stoppable)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from pathlib import Path

import pytest

from shardline import DiscoveryEvent, WorkerMetadata
from shardline.discovery.local import LocalDiscovery
from shardline.discovery.subscription import RecordFeed, Subscription
from shardline.discovery.topology import TopologyDiscovery
from support.cancellation import STEPS, settled, steps, stop_cancelled
from support.fakes import Source
from support.replicasets import buckets, replicaset_events
from support.workers import worker

pytestmark = pytest.mark.async_timeout(30)

# a handle that, unless woken, looks at the log only every minute: a wait that was not ended
# by the close is seen as one, not as a poll that happened to come
SELDOM = {"poll_interval": 60.0, "heartbeat": 60.0, "liveness_timeout": 120.0}


def refuses(metadata: WorkerMetadata) -> bool:
    """A filter that cannot judge any record: each is skipped and counted, none is handed out,
    so the subscription reads the change and goes back to waiting."""
    raise ValueError(f"no verdict on {metadata.uid}")


async def closes_within(close: asyncio.Task[None], bound: int = STEPS) -> bool:
    for _ in range(bound):
        if close.done():
            close.result()
            return True
        await asyncio.sleep(0)
    return False


async def test_a_publisher_aclose_whose_caller_is_cancelled_ends_cancelled(
    tmp_path: Path,
) -> None:
    discovery = LocalDiscovery("cancel", directory=tmp_path, **SELDOM)
    try:
        publisher = discovery.publisher
        await publisher.publish("worker-added", worker(1))  # starts its heartbeats
        stopper = await stop_cancelled(publisher.aclose)
        assert stopper.cancelled()
        assert not await settled()  # the heartbeats ended too
    finally:
        await discovery.aclose()


async def test_a_local_subscription_aclose_whose_caller_is_cancelled_ends_cancelled(
    tmp_path: Path,
) -> None:
    discovery = LocalDiscovery("cancel", directory=tmp_path, **SELDOM)
    try:
        subscription = discovery.subscribe()
        taking = asyncio.create_task(anext(subscription))
        await asyncio.sleep(0)  # the subscription's step runs in a task of its own now
        stopper = await stop_cancelled(subscription.aclose)
        assert stopper.cancelled()
        assert not await settled()  # the step ended too, and with it the waiting caller
        assert taking.cancelled()
    finally:
        await discovery.aclose()


@pytest.mark.parametrize("turns", range(16))
async def test_a_local_subscription_closed_around_a_doorbell_ends_at_once(
    tmp_path: Path, turns: int
) -> None:
    discovery = LocalDiscovery("cancel", directory=tmp_path, **SELDOM)
    publisher = discovery.publisher
    try:
        subscription = discovery.subscribe(filter=refuses)
        taking = asyncio.create_task(anext(subscription))
        await publisher.publish("worker-added", worker(1))
        while subscription.skipped.get("filter-error", 0) < 1:
            await asyncio.sleep(0)  # read (on the executor) and skipped: it waits again
        await publisher.publish("worker-added", worker(2))  # rings the doorbell
        await steps(turns)
        closing = asyncio.create_task(subscription.aclose())
        assert await closes_within(closing)
        await asyncio.wait([taking])
        assert taking.cancelled()
    finally:
        await publisher.aclose()
        await discovery.aclose()


async def following(source: Source) -> TopologyDiscovery:
    """A discovery following ``source`` that has handed out replicaset 1's master and waits,
    with a re-read timer running, in a step of its own."""
    discovery = TopologyDiscovery(source, interval=60.0)
    source.send(*replicaset_events(1))
    event = await anext(discovery)
    assert event.type == "worker-added"
    taking = asyncio.create_task(anext(discovery))
    await steps(10)
    assert not taking.done()
    return discovery


async def test_a_topology_discovery_aclose_whose_caller_is_cancelled_ends_cancelled() -> None:
    discovery = await following(Source())
    stopper = await stop_cancelled(discovery.aclose)
    assert stopper.cancelled()
    assert not await settled()  # the stream's step and the task iterating the source ended


@pytest.mark.parametrize("turns", range(16))
async def test_a_topology_discovery_closed_around_a_change_ends_at_once(turns: int) -> None:
    source = Source()
    discovery = await following(source)
    source.send(*buckets((1, 3000, 1)))  # wakes the stream; no member changes
    await steps(turns)
    closing = asyncio.create_task(discovery.aclose())
    assert await closes_within(closing)
    assert not await settled()


async def test_an_event_that_arrives_as_its_wait_is_cancelled_is_handed_to_the_next_wait() -> None:
    """The step ends (its event ready) in the turn of the loop in which the waiting caller is
    cancelled, before the caller resumes: the event must not be lost with the wait."""
    gate, produced = asyncio.Event(), asyncio.Event()
    event = DiscoveryEvent("worker-added", worker(1))

    async def stream() -> AsyncGenerator[DiscoveryEvent, None]:
        await gate.wait()
        produced.set()  # in the same turn as the step ends, on the yield below
        yield event

    subscription = Subscription(stream(), RecordFeed())
    try:
        waiter = asyncio.ensure_future(anext(subscription))
        await asyncio.sleep(0)
        gate.set()
        await produced.wait()  # the step has ended; the waiter resumes a turn later
        assert not waiter.done()
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert await asyncio.wait_for(anext(subscription), 5) is event
    finally:
        await subscription.aclose()
