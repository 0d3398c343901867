"""The ``sent`` of the failures ``GrpcConnection`` raises, as far as gRPC tells: workers made
by ``serve_grpc`` on loopback, a port nobody listens on, and raw gRPC servers."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import grpc
import grpc.aio
import pytest

from shardline import TransientRpcError
from shardline.errors import RpcError
from shardline.transport import RetryElsewhere, Task
from shardline.transport.grpc.connection import GrpcConnection
from support.transport_servers import WAIT, at, raw_server, worker

pytestmark = [pytest.mark.integration, pytest.mark.async_timeout(WAIT)]


async def refuse(payload: Any) -> None:
    raise RetryElsewhere("not here")


async def overloaded(payload: Any) -> None:
    raise RetryElsewhere("too much", overloaded=True)


holding: list[asyncio.Event] = []


async def hold(payload: Any) -> None:
    for started in holding:
        started.set()
    await asyncio.Event().wait()


HANDLERS = {"refuse": refuse, "overloaded": overloaded, "hold": hold}


async def failure(connection: GrpcConnection, task: Task, timeout: float | None) -> RpcError:
    with pytest.raises(RpcError) as failed:
        await connection.dispatch(task, timeout=timeout)
    return failed.value


async def test_a_worker_that_cannot_be_reached_was_not_sent_the_task() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    connection = GrpcConnection(at(f"grpc://127.0.0.1:{port}"))
    failed = await failure(connection, Task("echo"), 5.0)
    connection.close()
    assert isinstance(failed, TransientRpcError)
    assert (failed.reason, failed.sent) == ("unavailable", False)
    closed = await failure(connection, Task("echo"), 5.0)
    assert (closed.reason, closed.sent) == ("closed", False)


@pytest.mark.parametrize(("handler", "reason"), [("refuse", "unavailable"), ("overloaded", "busy")])
async def test_a_handler_that_asks_to_retry_elsewhere_was_not_sent_the_task(
    handler: str, reason: str
) -> None:
    async with worker(handlers=HANDLERS) as server:
        connection = GrpcConnection(server.metadata)
        failed = await failure(connection, Task(handler), 5.0)
        connection.close()
    assert (failed.reason, failed.sent) == (reason, False)


async def test_a_deadline_with_the_call_on_the_worker_may_have_run_it() -> None:
    async with worker(handlers=HANDLERS) as server:
        connection = GrpcConnection(server.metadata)
        failed = await failure(connection, Task("hold"), 0.2)
        connection.close()
    assert (failed.reason, failed.sent) == ("deadline", True)


async def test_a_status_the_worker_did_not_mark_may_have_run_it() -> None:
    async def unavailable(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await context.abort(grpc.StatusCode.UNAVAILABLE, "went away")
        raise AssertionError("not reached")

    async with raw_server(unavailable) as address:
        connection = GrpcConnection(at(f"grpc://{address}"))
        failed = await failure(connection, Task("echo"), 5.0)
        connection.close()
    assert (failed.reason, failed.sent) == ("unavailable", True)


async def test_a_call_the_stopping_worker_cut_short_may_have_run() -> None:
    async with worker(handlers=HANDLERS) as server:
        connection = GrpcConnection(server.metadata)
        started = asyncio.Event()
        holding.append(started)
        try:
            running = asyncio.ensure_future(connection.dispatch(Task("hold"), timeout=10.0))
            await started.wait()
        finally:
            holding.remove(started)
        await server.stop(0.1)
        with pytest.raises(TransientRpcError) as cut:
            await running
        connection.close()
    assert cut.value.sent is True
