"""The proxy explain tests' stand-ins: worker records by number (:func:`uid`, :func:`record`), a
discovery stream the test feeds (:class:`Feed`), connections that log each dispatch
(:class:`Workers`), and :func:`offered`, the workers a dispatch tries by an explanation."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from types import MappingProxyType
from typing import Any

from shardline import DiscoveryEvent, DispatchExplanation, TransientRpcError, WorkerMetadata


def uid(n: int) -> uuid.UUID:
    return uuid.UUID(int=n)


def record(n: int, weight: int = 1) -> WorkerMetadata:
    """Worker n at 10.0.0.n:5000, with ``weight`` in its extra."""
    return WorkerMetadata(
        uid(n), f"10.0.0.{n}:5000", n, "1", extra=MappingProxyType({"weight": weight})
    )


class Feed:
    """A discovery stream the test feeds; ``send`` returns once the proxy has applied the
    event (the proxy asks for the next one only after applying the last)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[DiscoveryEvent] = asyncio.Queue()

    async def events(self) -> AsyncIterator[DiscoveryEvent]:
        while True:
            event = await self.queue.get()
            yield event
            self.queue.task_done()

    async def send(self, kind: Any, metadata: WorkerMetadata) -> None:
        self.queue.put_nowait(DiscoveryEvent(kind, metadata))
        await self.queue.join()


class Workers:
    """Connections that log each dispatch and fail transiently while their uid is failing."""

    def __init__(self) -> None:
        self.log: list[uuid.UUID] = []
        self.failing: set[uuid.UUID] = set()

    def connect(self, metadata: WorkerMetadata) -> Any:
        workers = self

        class Connection:
            async def dispatch(self, task: Any, *, timeout: float | None = None) -> Any:
                workers.log.append(metadata.uid)
                if metadata.uid in workers.failing:
                    raise TransientRpcError(f"{metadata.uid} busy")
                return metadata.uid

        return Connection()


def offered(explanation: DispatchExplanation, failing: set[uuid.UUID]) -> list[uuid.UUID]:
    """The uids a dispatch tries by the explanation: its pooled candidates up to and
    including the first that does not fail."""
    tried = []
    for candidate in explanation.candidates:
        if candidate.pooled:
            tried.append(candidate.uid)
            if candidate.uid not in failing:
                break
    return tried
