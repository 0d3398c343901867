"""The discovery contract, once for every backend.

A backend's test module subclasses :class:`DiscoveryContract` as ``Test…`` and implements
``make(namespace)``, returning a new handle on that namespace (a new handle has its own
publisher, as another process would). Every test gets a fresh namespace.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from shardline.discovery import Discovery, DiscoveryEvent, Subscription
from shardline.workers import WorkerMetadata
from support.workers import worker

WAIT = 20.0
_namespaces = itertools.count()


async def take(subscription: Subscription, count: int) -> list[DiscoveryEvent]:
    """The next ``count`` events, failing the test if they do not come within WAIT seconds."""
    return [await asyncio.wait_for(anext(subscription), WAIT) for _ in range(count)]


async def quiet(subscription: Subscription, seconds: float = 0.3) -> bool:
    """True when no event arrives within ``seconds``."""
    try:
        event = await asyncio.wait_for(anext(subscription), seconds)
    except TimeoutError:
        return True
    raise AssertionError(f"unexpected event {event}")


def kinds(events: list[DiscoveryEvent]) -> list[tuple[str, uuid.UUID, str]]:
    return [(event.type, event.metadata.uid, event.metadata.address) for event in events]


class DiscoveryContract:
    """Tests every backend must pass; subclasses provide ``make``."""

    async def make(self, namespace: str) -> Discovery:
        raise NotImplementedError

    async def run(
        self, scenario: Callable[[Callable[[], Awaitable[Discovery]]], Awaitable[Any]]
    ) -> Any:
        """Runs ``scenario(make)``, ``make()`` opening a handle on one fresh namespace; closes
        every handle afterwards."""
        namespace = f"contract-{next(_namespaces)}-{uuid.uuid4().hex[:8]}"
        handles: list[Discovery] = []

        async def make() -> Discovery:
            handle = await self.make(namespace)
            handles.append(handle)
            return handle

        try:
            return await scenario(make)
        finally:
            for handle in handles:
                await handle.aclose()

    async def test_a_subscriber_first_sees_every_registered_worker_as_added(self) -> None:
        async def scenario(make: Callable[[], Awaitable[Discovery]]) -> None:
            publisher = (await make()).publisher
            for n in range(3):
                await publisher.publish("worker-added", worker(n))
            subscription = (await make()).subscribe()
            events = await take(subscription, 3)
            assert sorted(kinds(events)) == sorted(
                ("worker-added", worker(n).uid, worker(n).address) for n in range(3)
            )
            assert await quiet(subscription)

        await self.run(scenario)

    async def test_changes_stream_as_added_updated_and_dropped_with_the_last_record(self) -> None:
        async def scenario(make: Callable[[], Awaitable[Discovery]]) -> None:
            subscription = (await make()).subscribe()
            publisher = (await make()).publisher
            # a first change seen: the subscription's starting point is behind it, so each
            # change below is streamed as one, not folded into its first listing
            await publisher.publish("worker-added", worker(0))
            assert kinds(await take(subscription, 1)) == [
                ("worker-added", worker(0).uid, worker(0).address)
            ]
            moved = worker(1, address="10.0.0.9:1")
            await publisher.publish("worker-added", worker(1))
            await publisher.publish("worker-updated", moved)
            await publisher.publish("worker-dropped", worker(1))
            events = await take(subscription, 3)
            assert kinds(events) == [
                ("worker-added", worker(1).uid, worker(1).address),
                ("worker-updated", moved.uid, moved.address),
                ("worker-dropped", moved.uid, moved.address),
            ]

        await self.run(scenario)

    async def test_an_identical_record_republished_produces_no_event(self) -> None:
        async def scenario(make: Callable[[], Awaitable[Discovery]]) -> None:
            discovery = await make()
            subscription = discovery.subscribe()
            await discovery.publisher.publish("worker-added", worker(1))
            await discovery.publisher.publish("worker-updated", worker(1))
            await discovery.publisher.publish("worker-added", worker(1))
            await discovery.publisher.publish("worker-added", worker(2))
            assert kinds(await take(subscription, 2)) == [
                ("worker-added", worker(1).uid, worker(1).address),
                ("worker-added", worker(2).uid, worker(2).address),
            ]

        await self.run(scenario)

    async def test_subscribers_are_independent(self) -> None:
        async def scenario(make: Callable[[], Awaitable[Discovery]]) -> None:
            discovery = await make()
            first, second = discovery.subscribe(), discovery.subscribe()
            await discovery.publisher.publish("worker-added", worker(1))
            assert kinds(await take(first, 1)) == kinds(await take(second, 1))
            await first.aclose()
            await discovery.publisher.publish("worker-dropped", worker(1))
            assert kinds(await take(second, 1)) == [
                ("worker-dropped", worker(1).uid, worker(1).address)
            ]

        await self.run(scenario)

    async def test_a_filter_turns_records_entering_and_leaving_it_into_added_and_dropped(
        self,
    ) -> None:
        async def scenario(make: Callable[[], Awaitable[Discovery]]) -> None:
            discovery = await make()
            subscription = discovery.subscribe(lambda metadata: "gpu" in metadata.tags)
            publisher = discovery.publisher
            await publisher.publish("worker-added", worker(1))
            await publisher.publish("worker-updated", worker(1, tags=frozenset({"gpu"})))
            await publisher.publish("worker-updated", worker(1, tags=frozenset({"gpu", "eu"})))
            await publisher.publish("worker-updated", worker(1))
            events = await take(subscription, 3)
            assert [(event.type, event.metadata.tags) for event in events] == [
                ("worker-added", frozenset({"gpu"})),
                ("worker-updated", frozenset({"gpu", "eu"})),
                ("worker-dropped", frozenset({"gpu", "eu"})),
            ]
            assert await quiet(subscription)

        await self.run(scenario)

    async def test_per_uid_publication_order_is_kept(self) -> None:
        async def scenario(make: Callable[[], Awaitable[Discovery]]) -> None:
            discovery = await make()
            subscription = discovery.subscribe()
            versions = [worker(1, pid=n) for n in range(1, 30)]
            for metadata in versions:
                await discovery.publisher.publish("worker-updated", metadata)
            seen: list[WorkerMetadata] = []
            while not seen or seen[-1] != versions[-1]:
                seen.extend(event.metadata for event in await take(subscription, 1))
            pids = [metadata.pid for metadata in seen]
            # a backend may coalesce intermediate versions, never reorder them
            assert pids == sorted(pids)
            assert pids[-1] == versions[-1].pid

        await self.run(scenario)

    async def test_closing_a_publisher_withdraws_only_the_records_it_still_owns(self) -> None:
        async def scenario(make: Callable[[], Awaitable[Discovery]]) -> None:
            leaving, taking_over = await make(), await make()
            subscription = (await make()).subscribe()
            await leaving.publisher.publish("worker-added", worker(1))
            await leaving.publisher.publish("worker-added", worker(2))
            moved = worker(2, address="10.0.0.9:2")
            await taking_over.publisher.publish("worker-updated", moved)
            await take(subscription, 3)
            await leaving.publisher.aclose()
            assert kinds(await take(subscription, 1)) == [
                ("worker-dropped", worker(1).uid, worker(1).address)
            ]
            assert await quiet(subscription)

        await self.run(scenario)

    async def test_a_drop_published_by_anyone_withdraws_the_record(self) -> None:
        async def scenario(make: Callable[[], Awaitable[Discovery]]) -> None:
            owner, other = await make(), await make()
            subscription = other.subscribe()
            await owner.publisher.publish("worker-added", worker(1))
            await take(subscription, 1)
            await other.publisher.publish("worker-dropped", worker(1))
            assert kinds(await take(subscription, 1)) == [
                ("worker-dropped", worker(1).uid, worker(1).address)
            ]

        await self.run(scenario)

    async def test_namespaces_never_see_each_other(self) -> None:
        async def scenario(make: Callable[[], Awaitable[Discovery]]) -> None:
            ours = await make()
            theirs = await self.make(f"other-{uuid.uuid4().hex[:8]}")
            try:
                subscription = ours.subscribe()
                await theirs.publisher.publish("worker-added", worker(1))
                await ours.publisher.publish("worker-added", worker(2))
                assert kinds(await take(subscription, 1)) == [
                    ("worker-added", worker(2).uid, worker(2).address)
                ]
                assert await quiet(subscription)
            finally:
                await theirs.aclose()

        await self.run(scenario)
