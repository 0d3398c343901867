"""`InProcessDiscovery`: discovery inside one process, for tests and single-process services."""

from __future__ import annotations

import asyncio
import uuid
import weakref
from collections.abc import AsyncGenerator
from typing import ClassVar

from shardline.discovery.protocol import RecordFilter
from shardline.discovery.record import encode_record, stamped
from shardline.discovery.subscription import RecordFeed, Subscription
from shardline.workers import DiscoveryEvent, DiscoveryEventType, WorkerMetadata

__all__ = ["InProcessDiscovery"]

# A change as subscribers receive it: the uid's new record, or None when it is gone.
_Change = tuple[uuid.UUID, WorkerMetadata | None]


class _Registry:
    """The records of one namespace and the queues of its subscribers."""

    def __init__(self) -> None:
        self.records: dict[uuid.UUID, tuple[WorkerMetadata, _Publisher]] = {}
        # weak: a subscription dropped without being closed must not keep receiving changes
        self.queues: weakref.WeakSet[asyncio.Queue[_Change]] = weakref.WeakSet()

    def change(self, uid: uuid.UUID, record: tuple[WorkerMetadata, _Publisher] | None) -> None:
        if record is None:
            if self.records.pop(uid, None) is None:
                return
        else:
            self.records[uid] = record
        for queue in list(self.queues):
            queue.put_nowait((uid, None if record is None else record[0]))


class _Publisher:
    def __init__(self, registry: _Registry) -> None:
        self._registry = registry

    async def publish(self, type: DiscoveryEventType, metadata: WorkerMetadata) -> None:
        if type == "worker-dropped":
            self._registry.change(metadata.uid, None)
        elif type in ("worker-added", "worker-updated"):
            record = stamped(metadata)
            encode_record(record)  # the same limits as the backends that do encode
            self._registry.change(metadata.uid, (record, self))
        else:
            raise ValueError(f"unknown discovery event type {type!r}")

    async def aclose(self) -> None:
        owned = [uid for uid, (_, owner) in self._registry.records.items() if owner is self]
        for uid in owned:
            self._registry.change(uid, None)


class InProcessDiscovery:
    """Discovery within one process: every instance created with the same ``namespace`` shares
    the same records (while any of them is alive), and each has its own publisher.

    Records are checked against the wire schema's limits on publish, as the other backends do,
    but are handed to subscribers as objects. Each subscription's queue is unbounded: a
    subscriber that stops reading holds every later change in memory until it is closed.
    """

    _registries: ClassVar[weakref.WeakValueDictionary[str, _Registry]] = (
        weakref.WeakValueDictionary()
    )

    def __init__(self, namespace: str = "default") -> None:
        registry = self._registries.get(namespace)
        if registry is None:
            registry = self._registries[namespace] = _Registry()
        self.namespace = namespace
        self._registry = registry
        self._publisher = _Publisher(registry)

    @property
    def publisher(self) -> _Publisher:
        return self._publisher

    def subscribe(self, filter: RecordFilter | None = None) -> Subscription:
        queue: asyncio.Queue[_Change] = asyncio.Queue()
        for uid, (metadata, _) in self._registry.records.items():
            queue.put_nowait((uid, metadata))
        self._registry.queues.add(queue)
        feed = RecordFeed(filter)
        return Subscription(self._follow(queue, feed), feed)

    async def _follow(
        self, queue: asyncio.Queue[_Change], feed: RecordFeed
    ) -> AsyncGenerator[DiscoveryEvent, None]:
        try:
            while True:
                uid, metadata = await queue.get()
                for event in feed.remove(uid) if metadata is None else feed.put(metadata):
                    yield event
        finally:
            self._registry.queues.discard(queue)

    async def aclose(self) -> None:
        """Withdraws the records this instance's publisher owns."""
        await self._publisher.aclose()
