"""InProcessDiscovery: the discovery contract within one process."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncGenerator

import pytest

from shardline.discovery import Discovery, DiscoveryEvent, InProcessDiscovery, Subscription
from shardline.discovery.subscription import RecordFeed
from support.discovery_contract import DiscoveryContract, take
from support.workers import worker


class TestInProcessDiscovery(DiscoveryContract):
    async def make(self, namespace: str) -> Discovery:
        return InProcessDiscovery(namespace)


async def test_a_subscription_dropped_unclosed_stops_receiving_changes() -> None:
    async def scenario() -> int:
        discovery = InProcessDiscovery("dropped-unclosed")
        discovery.subscribe()
        gc.collect()
        await discovery.publisher.publish("worker-added", worker(1))
        return len(discovery._registry.queues)

    assert await scenario() == 0


async def test_a_bad_event_type_is_refused_by_name() -> None:

    discovery = InProcessDiscovery("bad-type")
    subscription = discovery.subscribe()
    with pytest.raises(ValueError, match="'worker-moved'"):
        await discovery.publisher.publish("worker-moved", worker(1))  # type: ignore[arg-type]
    await discovery.publisher.publish("worker-added", worker(2))
    assert [event.metadata.uid for event in await take(subscription, 1)] == [worker(2).uid]


async def test_a_cancelled_wait_loses_no_event_and_keeps_the_subscription() -> None:
    async def scenario() -> list[str]:
        discovery = InProcessDiscovery("cancelled-wait")
        subscription = discovery.subscribe()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(anext(subscription), 0.05)
        await discovery.publisher.publish("worker-added", worker(1))
        await discovery.publisher.publish("worker-dropped", worker(1))
        events = await take(subscription, 2)
        await subscription.aclose()
        with pytest.raises(StopAsyncIteration):
            await anext(subscription)
        return [event.type for event in events]

    assert await scenario() == ["worker-added", "worker-dropped"]


async def test_a_stream_ending_under_a_cancelled_wait_reports_nothing_unretrieved(
    caplog: pytest.LogCaptureFixture,
) -> None:

    ended = asyncio.Event()

    async def stream() -> AsyncGenerator[DiscoveryEvent, None]:
        await ended.wait()
        return
        yield  # an async generator that ends without an event

    subscription = Subscription(stream(), RecordFeed())
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(anext(subscription), 0.05)
    ended.set()  # the stream ends while nobody waits for it
    for _ in range(3):
        await asyncio.sleep(0)
    del subscription
    gc.collect()
    gc.collect()
    assert "never retrieved" not in caplog.text
