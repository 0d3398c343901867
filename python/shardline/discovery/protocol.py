"""The discovery contract every backend implements: a publisher and independent subscriptions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from shardline.discovery.subscription import Subscription
from shardline.workers import DiscoveryEventType, WorkerMetadata

__all__ = ["Discovery", "DiscoveryPublisher", "RecordFilter"]

RecordFilter = Callable[[WorkerMetadata], bool]
"""Chooses the records a subscriber sees (by namespace, tags, version…)."""


@runtime_checkable
class DiscoveryPublisher(Protocol):
    """Announces workers.

    ``publish("worker-added" | "worker-updated", metadata)`` registers or replaces the record of
    ``metadata.uid``, and this publisher becomes its owner: the record lives as long as the
    owner does. ``publish("worker-dropped", metadata)`` withdraws the record, whoever owns it.
    ``aclose()`` withdraws the records this publisher still owns; a record another publisher
    has since replaced stays. A publisher that dies without closing loses its records within
    the backend's liveness bound.
    """

    async def publish(self, type: DiscoveryEventType, metadata: WorkerMetadata) -> None: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class Discovery(Protocol):
    """Where workers are announced and followed.

    ``subscribe(filter)`` returns a :class:`Subscription`: it first replays every registered
    worker the filter accepts as ``worker-added``, then streams changes. For each uid, events
    arrive in publication order; a replaced record arrives as one ``worker-updated`` (never as
    a drop and an add), and a record replaced by an identical one produces no event. A record
    entering the filter arrives as ``worker-added``, one leaving it as ``worker-dropped``. A
    record this subscriber cannot read (see :mod:`shardline.discovery.record`) is skipped,
    logged and counted, and counts as absent: a worker shown before is dropped.
    Subscriptions are independent of each other.
    """

    @property
    def publisher(self) -> DiscoveryPublisher: ...

    def subscribe(self, filter: RecordFilter | None = None) -> Subscription: ...

    async def aclose(self) -> None: ...
