"""In-process stand-ins the tests feed by hand: discovery events (:class:`Stream`), connections
that record what they served (:class:`Harness`), topology events (:class:`Source`), and
:func:`drain` for a stream's ready events."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from shardline import DiscoveryEvent, WorkerMetadata
from shardline.discovery.topology import TopologyDiscovery
from support.workers import worker


class Stream:
    """Discovery events fed by the test: an async iterable that waits for more until closed."""

    def __init__(self, *events: DiscoveryEvent) -> None:
        self.queue: asyncio.Queue[DiscoveryEvent | None] = asyncio.Queue()
        for event in events:
            self.queue.put_nowait(event)

    def send(self, kind: str, metadata: WorkerMetadata) -> None:
        self.queue.put_nowait(DiscoveryEvent(kind, metadata))  # type: ignore[arg-type]

    async def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
        while (event := await self.queue.get()) is not None:
            yield event


class Connection:
    """A connection made by `connect`: records what it served, fails on demand."""

    def __init__(self, metadata: WorkerMetadata, log: list[tuple[str, Any]]) -> None:
        self.address = metadata.address
        self.log = log
        self.failure: BaseException | None = None

    async def dispatch(self, task: Any, *, timeout: float | None = None) -> str:
        self.log.append((self.address, task))
        if self.failure is not None:
            raise self.failure
        return self.address


class Harness:
    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []
        self.connections: dict[str, Connection] = {}

    def connect(self, metadata: WorkerMetadata) -> Connection:
        connection = Connection(metadata, self.log)
        self.connections[metadata.address] = connection
        return connection


async def settle() -> None:
    """Lets the sentinel drain what was queued."""
    for _ in range(10):
        await asyncio.sleep(0)


def added(n: int, **changes: Any) -> DiscoveryEvent:
    return DiscoveryEvent("worker-added", worker(n, **changes))


async def drain(discovery: TopologyDiscovery) -> list[DiscoveryEvent]:
    """Every event the stream has ready: it is driven until it waits (nothing here does I/O,
    so a stream with something to hand out does so within a few turns of the loop)."""
    events: list[DiscoveryEvent] = []
    while True:
        pending = asyncio.ensure_future(anext(discovery))
        for _ in range(20):
            if pending.done():
                break
            await asyncio.sleep(0)
        if not pending.done():
            pending.cancel()  # the subscription keeps the event being waited for
            await asyncio.gather(pending, return_exceptions=True)
            return events
        if isinstance(pending.exception(), StopAsyncIteration):
            return events
        events.append(pending.result())


class Source:
    """A source of topology events fed by the test; ``end()`` ends it, ``fail(e)`` raises."""

    def __init__(self, *events: Any) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.send(*events)

    def send(self, *events: Any) -> None:
        for event in events:
            self.queue.put_nowait(event)

    def end(self) -> None:
        self.queue.put_nowait(None)

    resyncs = 0

    def resync(self) -> None:
        """What a TopologySource does when its consumer's topology refused an item."""
        self.resyncs += 1

    def fail(self, error: BaseException) -> None:
        self.queue.put_nowait(error)

    async def __aiter__(self) -> AsyncIterator[Any]:
        while (item := await self.queue.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item
