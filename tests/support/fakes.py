"""In-process stand-ins the tests feed by hand: discovery events (:class:`Stream`), connections
that record what they served (:class:`Harness`), topology events (:class:`Source`),
:func:`drain` for a stream's ready events, and a notification transport held in memory
(:class:`Transport`, whose connections are :class:`Session` objects)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from shardline import DiscoveryEvent, WorkerMetadata, WorkerProxy
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

    def proxy(self, *workers: int, **options: Any) -> WorkerProxy:
        """A proxy over this harness's connections to ``workers`` (each the ``n`` of
        :func:`support.workers.worker`), all of them its quorum; ``options`` its other
        arguments."""
        return WorkerProxy(
            discovery=Stream(*(added(n) for n in workers)),
            connect=self.connect,
            quorum=len(workers),
            **options,
        )


async def settle() -> None:
    """Lets the sentinel drain what was queued."""
    for _ in range(10):
        await asyncio.sleep(0)


def added(n: int, **changes: Any) -> DiscoveryEvent:
    return DiscoveryEvent("worker-added", worker(n, **changes))


async def drain(discovery: TopologyDiscovery, limit: int | None = None) -> list[DiscoveryEvent]:
    """Every event the stream has ready, or the first ``limit`` of them: it is driven until it
    waits (nothing here does I/O, so a stream with something to hand out does so within a few
    turns of the loop)."""
    events: list[DiscoveryEvent] = []
    while limit is None or len(events) < limit:
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
    return events


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


class Session:
    """A notification session held in memory: the tiers, the snapshot burst, then
    ``documents`` in order (an exception among them is raised there); with ``hold`` the stream
    stays open after the last one, as a live connection would."""

    def __init__(
        self, snapshot: list[str], documents: list[str | Exception], *, hold: bool = False
    ) -> None:
        self.server = "memory"
        self.tiers = {"default": 3000}
        self.snapshot = snapshot
        self._documents = documents
        self._hold = hold
        self.closed = False

    async def documents(self) -> AsyncIterator[str | bytes]:
        for document in self._documents:
            if isinstance(document, Exception):
                raise document
            yield document
        if self._hold:
            await asyncio.Event().wait()

    async def aclose(self) -> None:
        self.closed = True


class Transport:
    """A notification transport of one's own: each ``connect`` opens the next of ``sessions``
    (an exception among them is raised there), and waits without end once none are left."""

    name = "memory"

    def __init__(self, sessions: list[Session | Exception]) -> None:
        self.sessions = sessions
        self.opened: list[Session] = []

    async def connect(self) -> Session:
        if not self.sessions:
            await asyncio.get_running_loop().create_future()  # never done: waits to be cancelled
        session = self.sessions.pop(0)
        if isinstance(session, Exception):
            raise session
        self.opened.append(session)
        return session
