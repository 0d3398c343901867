"""The INFO lines of a proxy's pool on the paths `test_worker_proxy`'s log test does not take:
a re-announced worker refreshed, an eviction after a first candidate failed transiently
(through ``select``), an eviction through ``delegate``; and nothing for an event that changes
nothing."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from shardline import (
    NoWorkersAvailable,
    RpcError,
    TransientRpcError,
    WorkerMetadata,
    WorkerProxy,
)
from shardline.workers import DiscoveryEvent, DiscoveryEventType
from support.delegate_balancers import InAdmissionOrder

LOGGER = "shardline.proxy"


def worker(n: int, address: str | None = None) -> WorkerMetadata:
    return WorkerMetadata(
        uid=uuid.UUID(int=n), address=address or f"127.0.0.1:{5000 + n}", pid=n, version="1"
    )


class Stream:
    """Discovery events the test sends; waits for more until the proxy stops."""

    def __init__(self, *events: tuple[DiscoveryEventType, WorkerMetadata]) -> None:
        self.queue: asyncio.Queue[DiscoveryEvent] = asyncio.Queue()
        for kind, metadata in events:
            self.send(kind, metadata)

    def send(self, kind: DiscoveryEventType, metadata: WorkerMetadata) -> None:
        self.queue.put_nowait(DiscoveryEvent(kind, metadata))

    async def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
        while True:
            yield await self.queue.get()


class Failing:
    """A connection that raises ``failure`` (when set) on every dispatch."""

    def __init__(self, failures: dict[str, Exception], address: str) -> None:
        self.failures = failures
        self.address = address

    async def dispatch(self, task: Any, *, timeout: float | None = None) -> str:
        failure = self.failures.get(self.address)
        if failure is not None:
            raise failure
        return self.address


async def settle(stream: Stream) -> None:
    """Waits until the proxy has taken every event sent."""
    async with asyncio.timeout(10):
        while not stream.queue.empty():
            await asyncio.sleep(0)
    for _ in range(5):
        await asyncio.sleep(0)


def logged(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == LOGGER]


async def test_a_re_announced_worker_is_logged_as_refreshed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    stream = Stream(("worker-added", worker(1)))
    async with WorkerProxy(discovery=stream, connect=lambda m: Failing({}, m.address)):
        stream.send("worker-added", worker(1, address="127.0.0.1:6001"))
        stream.send("worker-updated", worker(2))  # not pooled: changes nothing
        stream.send("worker-dropped", worker(3))  # not pooled: changes nothing
        await settle(stream)
    assert logged(caplog) == [
        (logging.INFO, f"worker {worker(1).uid} at 127.0.0.1:5001 admitted"),
        (logging.INFO, f"worker {worker(1).uid} refreshed: now at 127.0.0.1:6001"),
    ]


@pytest.mark.parametrize("balancer", ["round-robin", "delegate"])
async def test_an_eviction_after_a_transient_failure_is_logged_with_its_error(
    balancer: str, caplog: pytest.LogCaptureFixture
) -> None:
    failures: dict[str, Exception] = {
        "127.0.0.1:5001": TransientRpcError("busy"),
        "127.0.0.1:5002": RpcError("speaks another protocol"),
    }
    caplog.set_level(logging.INFO, logger=LOGGER)
    stream = Stream(("worker-added", worker(1)), ("worker-added", worker(2)))
    proxy = WorkerProxy(
        discovery=stream,
        connect=lambda m: Failing(failures, m.address),
        loadbalancer="round-robin" if balancer == "round-robin" else InAdmissionOrder(),
        quorum=2,
    )
    async with proxy:
        with pytest.raises(NoWorkersAvailable):
            await proxy.dispatch("task")
        assert [m.uid for m in proxy.workers] == [worker(1).uid]
    assert logged(caplog)[2:] == [
        (logging.INFO, f"worker {worker(2).uid} at 127.0.0.1:5002 evicted: speaks another protocol")
    ]
