"""WorkerProxy closes the connections the pool lets go, and only those."""

from __future__ import annotations

from typing import Any

import pytest

from shardline import RpcError, TransientRpcError, WorkerMetadata, WorkerProxy
from support.fakes import Stream, added, settle
from support.workers import worker


class Closable:
    def __init__(self, metadata: WorkerMetadata, failure: BaseException | None = None) -> None:
        self.address = metadata.address
        self.failure = failure
        self.closed = 0

    async def dispatch(self, task: Any, *, timeout: float | None = None) -> str:
        if self.failure is not None:
            raise self.failure
        return self.address

    def close(self) -> None:
        self.closed += 1


class Connector:
    def __init__(self) -> None:
        self.made: list[Closable] = []
        self.failure: dict[str, BaseException] = {}

    def __call__(self, metadata: WorkerMetadata) -> Closable:
        self.made.append(Closable(metadata, self.failure.get(metadata.address)))
        return self.made[-1]

    def closed(self) -> list[tuple[str, int]]:
        return [(connection.address, connection.closed) for connection in self.made]


async def test_a_refresh_closes_the_replaced_connection_and_a_drop_the_last_one() -> None:
    async def scenario() -> list[tuple[str, int]]:
        connect, stream = Connector(), Stream(added(1), added(2))
        async with WorkerProxy(discovery=stream, connect=connect, quorum=2):
            stream.send("worker-updated", worker(1, address="moved"))
            await settle()
            stream.send("worker-dropped", worker(1))
            await settle()
        return connect.closed()

    assert await scenario() == [
        (worker(1).address, 1),
        (worker(2).address, 0),
        ("moved", 1),
    ]


async def test_a_connect_that_returns_the_same_connection_again_keeps_it_open() -> None:
    async def scenario() -> int:
        shared = Closable(worker(1))
        stream = Stream(added(1))
        async with WorkerProxy(discovery=stream, connect=lambda _: shared):
            stream.send("worker-updated", worker(1, pid=7))
            await settle()
        return shared.closed

    assert await scenario() == 0


@pytest.mark.parametrize(
    ("error", "closed"), [(RpcError("gone"), 1), (TransientRpcError("busy"), 0)]
)
async def test_an_eviction_closes_the_connection_a_transient_failure_does_not(
    error: RpcError, closed: int
) -> None:
    async def scenario() -> list[tuple[str, int]]:
        connect, stream = Connector(), Stream(added(1), added(2))
        connect.failure[worker(1).address] = error
        async with WorkerProxy(discovery=stream, connect=connect, quorum=2) as proxy:
            assert await proxy.dispatch("task") == worker(2).address
        return connect.closed()

    assert await scenario() == [(worker(1).address, closed), (worker(2).address, 0)]


async def test_a_failing_close_is_logged_and_discovery_is_still_followed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Breaks(Closable):
        def close(self) -> None:
            raise OSError("socket already gone")

    async def scenario() -> list[WorkerMetadata]:
        stream = Stream(added(1))
        async with WorkerProxy(discovery=stream, connect=Breaks) as proxy:
            stream.send("worker-dropped", worker(1))
            stream.send("worker-added", worker(2))
            await settle()
            return proxy.workers

    assert await scenario() == [worker(2)]
    assert "closing the connection" in caplog.text
