"""The MessagePack-RPC transport on real sockets: `serve_msgpack` workers in this process and in
worker processes the tests start and kill, `MsgpackConnection`, raw peers that break the
protocol, and a `WorkerProxy` over LocalDiscovery."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgpack  # type: ignore[import-untyped]
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardline import RpcError, TransientRpcError, WorkerMetadata, WorkerProxy
from shardline.discovery import InProcessDiscovery
from shardline.discovery.local import LocalDiscovery
from shardline.discovery.record import decode_record
from shardline.errors import WorkerError
from shardline.transport import Handler, Task
from shardline.transport.demo_handlers import DEMO_HANDLERS
from shardline.transport.msgpack import server as msgpack_server
from shardline.transport.msgpack import wire
from shardline.transport.msgpack.connection import MsgpackConnection
from shardline.transport.msgpack.server import MsgpackWorkerServer, serve_msgpack
from support.held import Held, HeldThread
from support.transport_servers import WAIT, at, new_namespace
from support.waiting import until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.async_timeout(WAIT),
]  # each async test, start to finish

WORKER_SCRIPT = Path(__file__).with_name("msgpack_worker.py")
READY = 15.0


@asynccontextmanager
async def worker(
    handlers: Any = DEMO_HANDLERS, address: str = "127.0.0.1:0", **options: Any
) -> AsyncIterator[MsgpackWorkerServer]:
    server = await serve_msgpack(handlers, address, InProcessDiscovery(new_namespace()), **options)
    try:
        yield server
    finally:
        await server.stop(0)


@asynccontextmanager
async def connection(
    server: MsgpackWorkerServer, **options: Any
) -> AsyncIterator[MsgpackConnection]:
    opened = MsgpackConnection(server.metadata, **options)
    try:
        yield opened
    finally:
        opened.close()


def tracked(started: asyncio.Event, cancelled: asyncio.Event) -> Handler:
    """A handler that says when it started and when it was cancelled, and never returns."""

    async def handler(payload: Any) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    return handler


@pytest.fixture
def unix_path() -> Iterator[str]:
    """A socket path (short: a Unix socket's path is limited to about 100 bytes), removed
    after the test if a killed worker left it behind."""
    path = f"/tmp/shardline-test-{uuid.uuid4().hex[:12]}.sock"
    yield path
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


@pytest.fixture(params=["tcp", "unix"])
def address(request: pytest.FixtureRequest, unix_path: str) -> str:
    return "127.0.0.1:0" if request.param == "tcp" else unix_path


# --- round trips --------------------------------------------------------------------------

PAYLOADS = [None, 0, -1.5, 2**63, "naïve ✓", b"\x00\xff", [1, [2, {"k": None}]], {"b": True}]


async def test_echo_returns_every_msgpack_value_over_tcp_and_unix(address: str) -> None:
    async def scenario() -> tuple[list[Any], str]:
        async with worker(address=address) as server, connection(server) as opened:
            return [await opened.dispatch(Task("echo", p)) for p in PAYLOADS], server.address

    echoed, published = await scenario()
    assert echoed == PAYLOADS
    if address.startswith("/"):
        assert published == f"msgpack+unix://{address}"
        assert not os.path.exists(address), "the socket file is removed at stop"
    else:
        host, _, port = published.removeprefix("msgpack+tcp://").rpartition(":")
        assert (host, port != "0") == ("127.0.0.1", True)


async def test_the_published_record_carries_the_given_fields() -> None:

    uid = uuid.uuid4()
    options = {"uid": uid, "version": "2.1", "tags": {"gpu"}, "extra": {"weight": 3}}
    async with worker(**options) as server:
        record = server.metadata
        assert (record.uid, record.version, record.pid) == (uid, "2.1", os.getpid())
        assert (record.tags, dict(record.extra)) == ({"gpu"}, {"weight": 3})


async def test_a_hundred_concurrent_calls_share_one_socket() -> None:

    everyone = asyncio.Event()
    arrived = 0

    async def gather(payload: Any) -> Any:
        nonlocal arrived
        arrived += 1
        if arrived == 100:
            everyone.set()
        await everyone.wait()  # all 100 are in flight at once, or none returns
        return payload

    async with worker({"gather": gather}) as server, connection(server) as opened:
        second = MsgpackConnection(server.metadata)
        calls = [(opened if n % 2 else second).dispatch(Task("gather", n)) for n in range(100)]
        assert await asyncio.gather(*calls) == list(range(100))
        assert len(server._state.links) == 1
        second.close()


async def test_a_sync_handler_runs_in_a_thread_and_does_not_block_other_calls() -> None:
    held = HeldThread()  # blocks its thread on purpose, until the other call is answered

    async def scenario() -> list[str]:
        async with (
            worker({**DEMO_HANDLERS, "blocking": held.handler}) as server,
            connection(server) as opened,
        ):
            slow = asyncio.ensure_future(opened.dispatch(Task("blocking")))
            await held.begun()
            fast = await opened.dispatch(Task("echo", "fast"))
            held.release()
            return [fast, await slow]

    assert await scenario() == ["fast", "blocking"]


async def test_an_async_handler_returning_an_awaitable_that_is_no_coroutine_is_awaited(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What inspect.markcoroutinefunction (Python 3.12) makes of a plain function: a handler
    # said to be async that returns another awaitable (here a future, done or not yet).
    def later(payload: Any) -> asyncio.Future[str]:
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        if payload == "now":
            future.set_result("now")
        else:
            asyncio.get_running_loop().call_soon(future.set_result, f"later {payload}")
        return future

    monkeypatch.setattr(
        msgpack_server,
        "check_handlers",
        lambda handlers: {name: (handler, True) for name, handler in handlers.items()},
    )
    async with worker({"later": later}) as server, connection(server) as opened:
        assert await opened.dispatch(Task("later", "now"), timeout=WAIT) == "now"
        assert await opened.dispatch(Task("later", 1), timeout=WAIT) == "later 1"


async def test_a_handler_said_async_whose_call_raises_is_answered_with_its_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a plain function marked a coroutine function raises before any coroutine exists: even a
    # StopIteration is its error, never a result of None
    def stops(payload: Any) -> Any:
        raise StopIteration(payload)

    def fails(payload: Any) -> Any:
        raise ValueError(f"bad {payload}")

    monkeypatch.setattr(
        msgpack_server,
        "check_handlers",
        lambda handlers: {name: (handler, True) for name, handler in handlers.items()},
    )
    async with (
        worker({"stops": stops, "fails": fails}) as server,
        connection(server) as opened,
    ):
        with pytest.raises(WorkerError) as stopped:
            await opened.dispatch(Task("stops", 1), timeout=WAIT)
        assert stopped.value.remote_type == "StopIteration"
        with pytest.raises(WorkerError) as failed:
            await opened.dispatch(Task("fails", 2), timeout=WAIT)
        assert (failed.value.remote_type, failed.value.remote_message) == ("ValueError", "bad 2")


# --- errors -------------------------------------------------------------------------------


async def test_handler_errors_and_unknown_handlers_are_worker_errors() -> None:

    async with worker() as server, connection(server) as opened:
        with pytest.raises(WorkerError) as failed:
            await opened.dispatch(Task("fail", 7))
        assert failed.value.remote_type == "RuntimeError"
        assert failed.value.remote_message == "asked to fail (payload 7)"
        assert (failed.value.handler, failed.value.address) == ("fail", server.address)
        with pytest.raises(WorkerError) as unknown:
            await opened.dispatch(Task("nope"))
        assert unknown.value.remote_type == "shardline.UnknownHandler"
        assert "no handler named 'nope'" in unknown.value.remote_message
        assert await opened.dispatch(Task("echo", 1)) == 1


@pytest.mark.parametrize(
    ("payload", "kind"), [(None, "unavailable"), ("resource-exhausted", "busy")]
)
async def test_retry_elsewhere_is_transient(payload: Any, kind: str) -> None:

    async with worker() as server, connection(server) as opened:
        with pytest.raises(
            TransientRpcError, match=f": {kind}: .*asked to fail transiently"
        ) as caught:
            await opened.dispatch(Task("fail-transiently", payload))
        assert (caught.value.reason, caught.value.address) == (kind, server.address)


async def test_payloads_msgpack_cannot_carry_are_refused_before_sending() -> None:

    async with worker() as server, connection(server, max_frame_bytes=1000) as opened:
        with pytest.raises(TypeError, match="the payload for handler 'echo' is not msgpack"):
            await opened.dispatch(Task("echo", object()))
        with pytest.raises(ValueError, match="not msgpack"):
            await opened.dispatch(Task("echo", "\ud800"))
        with pytest.raises(ValueError, match="over the limit of 1000"):
            await opened.dispatch(Task("echo", b"x" * 2000))
        with pytest.raises(ValueError, match="surrogate"):
            await opened.dispatch(Task("\ud800"))
        with pytest.raises(TypeError, match="Task objects"):
            await opened.dispatch({"handler": "echo"})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "payload",
    [{1: "int key"}, msgpack.ExtType(5, b"x"), [msgpack.Timestamp(1, 0)]],
    ids=["int-key", "ext", "timestamp"],
)
async def test_a_payload_the_worker_cannot_read_fails_that_call_alone(payload: Any) -> None:

    async with worker() as server, connection(server) as opened:
        with pytest.raises(WorkerError) as refused:
            await opened.dispatch(Task("echo", payload))
        assert refused.value.remote_type == "shardline.BadRequest"
        assert await opened.dispatch(Task("echo", 1)) == 1


@pytest.mark.parametrize(
    "result",
    [{1: "int key"}, msgpack.ExtType(5, b"x"), [msgpack.Timestamp(1, 0)]],
    ids=["int-key", "ext", "timestamp"],
)
async def test_a_result_the_client_cannot_read_fails_that_call_alone_as_a_bad_result(
    result: Any,
) -> None:
    async def unreadable(payload: Any) -> Any:
        return result

    handlers = {**DEMO_HANDLERS, "unreadable": unreadable}
    async with worker(handlers) as server, connection(server) as opened:
        with pytest.raises(WorkerError, match="the result is unreadable") as refused:
            await opened.dispatch(Task("unreadable"))
        assert refused.value.remote_type == "shardline.BadResult"
        assert refused.value.handler == "unreadable"
        assert await opened.dispatch(Task("echo", 1)) == 1


async def test_a_result_msgpack_cannot_carry_or_over_the_limit_is_a_bad_result() -> None:
    async def unpackable(payload: Any) -> Any:
        return object()

    async def big(payload: Any) -> bytes:
        return b"x" * payload

    handlers = {"unpackable": unpackable, "big": big}
    async with worker(handlers, max_frame_bytes=1000) as server, connection(server) as opened:
        for task in (Task("unpackable"), Task("big", 2000)):
            with pytest.raises(WorkerError) as refused:
                await opened.dispatch(task)
            assert refused.value.remote_type == "shardline.BadResult"
        assert len(await opened.dispatch(Task("big", 900))) == 900


# --- deadlines and cancellation -------------------------------------------------------------


async def test_a_deadline_is_transient_and_cancels_the_handler_on_the_worker() -> None:
    async def scenario() -> float:
        started, cancelled = asyncio.Event(), asyncio.Event()
        async with (
            worker({"wait": tracked(started, cancelled)}) as server,
            connection(server) as opened,
        ):
            begun = time.monotonic()
            with pytest.raises(TransientRpcError, match="deadline") as caught:
                await opened.dispatch(Task("wait"), timeout=0.2)
            took = time.monotonic() - begun
            assert (caught.value.reason, caught.value.address) == ("deadline", server.address)
            await cancelled.wait()
            return took

    assert 0.2 <= await scenario() < 5


async def test_the_worker_cancels_a_handler_at_the_deadline_it_was_sent() -> None:
    """The worker's own deadline: a raw client sends a 0.1 s timeout and never cancels."""

    async def scenario() -> Any:
        started, cancelled = asyncio.Event(), asyncio.Event()
        async with worker({"wait": tracked(started, cancelled)}) as server:
            reader, writer = await raw_client(server)
            writer.write(wire.request(7, "wait", msgpack.packb(None), 0.1))
            answer = await read_messages(reader, 1)
            writer.close()
            assert cancelled.is_set()
            return answer

    ((kind, msgid, error, result),) = await scenario()
    assert (kind, msgid, error["kind"], result) == (1, 7, "deadline", None)


async def test_cancelling_a_dispatch_cancels_the_handler_on_the_worker() -> None:

    started, cancelled = asyncio.Event(), asyncio.Event()
    async with (
        worker({**DEMO_HANDLERS, "wait": tracked(started, cancelled)}) as server,
        connection(server) as opened,
    ):
        call = asyncio.ensure_future(opened.dispatch(Task("wait")))
        await started.wait()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await cancelled.wait()
        assert await opened.dispatch(Task("echo", "after")) == "after"


async def test_calls_beyond_the_in_flight_bound_are_busy() -> None:
    wait = Held()
    async with (
        worker({"wait": wait.handler}, max_in_flight=2) as server,
        connection(server) as opened,
    ):
        held = [asyncio.ensure_future(opened.dispatch(Task("wait", n))) for n in range(2)]
        await until(lambda: wait.calls == 2, "two calls in flight")
        with pytest.raises(TransientRpcError, match="busy") as caught:
            await opened.dispatch(Task("wait", 3))
        assert (caught.value.reason, caught.value.address) == ("busy", server.address)
        wait.release()
        assert await asyncio.gather(*held) == [0, 1]
        assert await opened.dispatch(Task("wait", 4)) == 4


async def test_stopping_refuses_new_calls_as_shutting_down_and_lets_calls_in_flight_finish():

    release, started = asyncio.Event(), asyncio.Event()

    async def wait(payload: Any) -> str:
        started.set()
        await release.wait()
        return "finished"

    server = await serve_msgpack({"wait": wait}, "127.0.0.1:0", InProcessDiscovery(new_namespace()))
    async with connection(server) as opened:
        held = asyncio.ensure_future(opened.dispatch(Task("wait")))
        await started.wait()
        stopping = asyncio.ensure_future(server.stop(10))
        await until(lambda: server._state.stopping, "the worker stopping")
        with pytest.raises(TransientRpcError, match="shutting_down") as caught:
            await opened.dispatch(Task("wait"))
        assert (caught.value.reason, caught.value.address) == ("shutting-down", server.address)
        release.set()
        assert await held == "finished"
        await stopping


# --- raw peers: bad frames, garbage, versions ------------------------------------------------


async def raw_client(
    server: MsgpackWorkerServer, receive_buffer: int | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TCP socket to the worker that has said hello and read its hello."""
    where = wire.record_address(server.address)
    assert not isinstance(where, str)
    sock = socket.socket()
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, where)
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(wire.hello(1 << 30))
    (hello,) = await read_messages(reader, 1)
    assert hello[:2] == [2, "shardline.hello"]
    assert hello[2]["version"] == wire.PROTOCOL_VERSION
    return reader, writer


async def read_messages(reader: asyncio.StreamReader, count: int) -> list[Any]:
    """The next ``count`` messages, fewer if the worker closes the socket first."""
    unpacker = msgpack.Unpacker(raw=False)
    messages: list[Any] = []
    while len(messages) < count:
        data = await reader.read(65536)
        if not data:
            break
        unpacker.feed(data)
        messages.extend(unpacker)
    return messages


@pytest.mark.parametrize(
    "garbage",
    [b"\xc1" * 16, b"\x05", msgpack.packb({"not": "an array"}), msgpack.packb([0, 1, "x"])],
    ids=["never-used-byte", "an-int", "a-map", "a-short-request"],
)
async def test_garbage_closes_only_that_connection(
    garbage: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        async with worker() as server, connection(server) as opened:
            assert await opened.dispatch(Task("echo", 1)) == 1
            reader, writer = await raw_client(server)
            writer.write(garbage)
            assert await read_messages(reader, 1) == [], "the worker closes the socket"
            writer.close()
            assert await opened.dispatch(Task("echo", 2)) == 2

    with caplog.at_level(logging.ERROR, "shardline.transport.msgpack.server"):
        await scenario()
    assert "closing the connection of the client at" in caplog.text


async def test_an_oversized_frame_from_a_client_closes_only_its_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        async with worker(max_frame_bytes=10_000) as server, connection(server) as opened:
            reader, writer = await raw_client(server)
            request = wire.request(1, "echo", msgpack.packb(b"x" * 20_000), None)
            writer.write(request)
            assert await read_messages(reader, 1) == []
            writer.close()
            assert await opened.dispatch(Task("echo", b"y" * 9_000)) == b"y" * 9_000
            # a connection knowing the worker's limit refuses before sending
            big = MsgpackConnection(server.metadata, max_frame_bytes=100_000)
            with pytest.raises(ValueError, match="over the limit of 10000"):
                await big.dispatch(Task("echo", b"x" * 20_000))
            big.close()

    with caplog.at_level(logging.ERROR, "shardline.transport.msgpack.server"):
        await scenario()
    assert "a frame over the limit of 10000 bytes" in caplog.text


async def test_a_frame_of_exactly_the_limit_is_read() -> None:

    probe = wire.request(1, "echo", msgpack.packb(b""), None)
    limit = 10_000
    payload = msgpack.packb(b"x" * (limit - len(probe) - 2))  # 2 bin16 headers: 2 more bytes
    request = wire.request(1, "echo", payload, None)
    assert len(request) == limit
    async with worker(max_frame_bytes=limit) as server:
        reader, writer = await raw_client(server)
        writer.write(request)
        ((_, msgid, error, _),) = await read_messages(reader, 1)
        assert (msgid, error) == (1, None)
        writer.close()


async def test_a_result_over_the_limit_the_caller_announced_is_a_bad_result() -> None:
    async def big(payload: Any) -> bytes:
        return b"x" * payload

    async with (
        worker({"big": big}) as server,
        connection(server, max_frame_bytes=5_000) as opened,
    ):
        with pytest.raises(WorkerError, match="over the limit of 5000") as refused:
            await opened.dispatch(Task("big", 6_000))
        assert refused.value.remote_type == "shardline.BadResult"
        assert len(await opened.dispatch(Task("big", 4_000))) == 4_000


async def test_a_worker_sending_a_frame_over_the_limit_fails_the_calls_in_flight_with_rpc_error():

    async def talk(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(wire.hello(1 << 20))
        requests = await read_messages(reader, 3)  # the hello and two requests
        _, msgid, _, _ = requests[1]
        writer.write(wire.result(msgid, msgpack.packb(b"x" * 6_000)))
        await reader.read()

    listener = await asyncio.start_server(talk, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    address = f"msgpack+tcp://127.0.0.1:{port}"
    opened = MsgpackConnection(at(address), max_frame_bytes=5_000)
    calls = [asyncio.ensure_future(opened.dispatch(Task("echo", n))) for n in range(2)]
    for call in calls:
        with pytest.raises(RpcError, match="a frame over the limit of 5000 bytes") as failed:
            await call
        assert not isinstance(failed.value, TransientRpcError)
        assert (failed.value.reason, failed.value.address) == ("oversized", address)
    opened.close()
    listener.close()


async def test_a_worker_of_another_version_is_refused_with_rpc_error() -> None:

    async def talk(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(msgpack.packb([2, "shardline.hello", {"version": 2, "max_frame_bytes": 9}]))
        await reader.read()

    listener = await asyncio.start_server(talk, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    address = f"msgpack+tcp://127.0.0.1:{port}"
    opened = MsgpackConnection(at(address))
    with pytest.raises(RpcError, match="speaks shardline msgpack-rpc version 2") as refused:
        await opened.dispatch(Task("echo"))
    assert not isinstance(refused.value, TransientRpcError)
    assert (refused.value.reason, refused.value.address) == ("protocol-version", address)
    opened.close()
    listener.close()


Talk = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def raw_worker(talk: Talk) -> AsyncIterator[str]:
    """A TCP listener on loopback whose every connection ``talk`` serves; yields its
    ``msgpack+tcp://`` address."""
    listener = await asyncio.start_server(talk, "127.0.0.1", 0)
    try:
        yield f"msgpack+tcp://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
    finally:
        listener.close()


async def says_hello_then_answers(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answer: Callable[[int], bytes]
) -> None:
    writer.write(wire.hello(1 << 20))
    requests = await read_messages(reader, 2)  # the hello and the request
    writer.write(answer(requests[1][1]))
    await reader.read()


def answering(answer: Callable[[int], bytes]) -> Talk:
    return lambda reader, writer: says_hello_then_answers(reader, writer, answer)


async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.read()


async def greets_then_silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(wire.hello(1 << 20))
    await reader.read()


@pytest.mark.parametrize(
    ("talk", "options", "timeout", "error", "reason", "match"),
    [
        (
            answering(lambda msgid: wire.error(msgid, wire.DEADLINE, "TimeoutError", "late")),
            {},
            None,
            TransientRpcError,
            "deadline",
            ": deadline: TimeoutError: late",
        ),
        (greets_then_silent, {}, 0.1, TransientRpcError, "deadline", "deadline: 0.1 s passed"),
        (silent, {}, 0.1, TransientRpcError, "deadline", "deadline: 0.1 s passed"),
        (
            silent,
            {"connect_timeout": 0.1},
            None,
            TransientRpcError,
            "cannot-connect",
            "no connection and hello within 0.1 s",
        ),
        (
            answering(lambda msgid: msgpack.packb([1, msgid, {"kind": "odd"}, None])),
            {},
            None,
            RpcError,
            "protocol",
            "carries an error this side cannot read",
        ),
        (
            answering(lambda msgid: msgpack.packb([0, msgid, "x", []])),
            {},
            None,
            RpcError,
            "protocol",
            "not a response",
        ),
    ],
    ids=[
        "worker-deadline",
        "own-deadline",
        "deadline-before-hello",
        "no-hello",
        "unreadable-error",
        "not-a-response",
    ],
)
async def test_each_failure_of_a_raw_worker_names_its_reason_and_address(
    talk: Talk,
    options: dict[str, Any],
    timeout: float | None,
    error: type[RpcError],
    reason: str,
    match: str,
) -> None:

    async with raw_worker(talk) as address:
        opened = MsgpackConnection(at(address), **options)
        with pytest.raises(error, match=match) as caught:
            await opened.dispatch(Task("echo"), timeout=timeout)
        opened.close()
    assert isinstance(caught.value, TransientRpcError) == (error is TransientRpcError)
    assert (caught.value.reason, caught.value.address) == (reason, address)


async def test_a_call_waiting_for_a_full_socket_fails_as_connection_lost_when_it_breaks() -> None:
    """A worker that reads nothing: the socket fills, the next call waits for it to take
    writes, and fails with the others when the worker closes it."""
    hung_up = asyncio.Event()

    async def deaf(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(wire.hello(1 << 30))
        await hung_up.wait()
        writer.transport.abort()

    async with raw_worker(deaf) as address:
        opened = MsgpackConnection(at(address), max_frame_bytes=1 << 30)
        calls = [asyncio.ensure_future(opened.dispatch(Task("echo", b"x" * (1 << 20))))]
        while (link := opened._shared.link) is None or not link.paused:
            assert len(calls) < 64, "the socket took 64 MiB without pausing"
            calls.append(asyncio.ensure_future(opened.dispatch(Task("echo", b"x" * (1 << 20)))))
            await asyncio.sleep(0.001)
        waiting = asyncio.ensure_future(opened.dispatch(Task("echo", 1)))
        await until(lambda: link._writable is not None, "the call waiting for the socket")
        hung_up.set()
        for call in [*calls, waiting]:
            with pytest.raises(TransientRpcError, match="connection lost") as caught:
                await call
            assert (caught.value.reason, caught.value.address) == ("connection-lost", address)
        opened.close()


async def test_a_client_of_another_version_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async with worker() as server:
            where = wire.record_address(server.address)
            assert not isinstance(where, str)
            reader, writer = await asyncio.open_connection(*where)
            writer.write(
                msgpack.packb([2, "shardline.hello", {"version": 2, "max_frame_bytes": 9}])
            )
            writer.write(wire.request(1, "echo", msgpack.packb(1), None))
            messages = await read_messages(reader, 2)
            assert [message[1] for message in messages] == ["shardline.hello"], "then closed"
            writer.close()

    with caplog.at_level(logging.ERROR, "shardline.transport.msgpack.server"):
        await scenario()
    assert "speaks shardline msgpack-rpc version 2, this side speaks version 1" in caplog.text


# --- faults with real worker processes ------------------------------------------------------


class WorkerProcess:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    async def line(self) -> bytes:
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), READY)
        assert line, "the worker exited"
        return line.rstrip(b"\n")

    async def ready(self) -> WorkerMetadata:
        return decode_record(await self.line())


@asynccontextmanager
async def worker_process(
    directory: Path, namespace: str, address: str
) -> AsyncIterator[WorkerProcess]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(WORKER_SCRIPT),
        str(directory),
        namespace,
        address,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        yield WorkerProcess(process)
    finally:
        if process.returncode is None:
            process.kill()
        # read to the end, so its pipe and transport close on this loop, not in a finalizer
        await process.communicate()


async def test_a_worker_killed_mid_call_fails_at_once_and_its_restart_is_dialled_again(
    tmp_path: Path, address: str
) -> None:
    async def scenario() -> float:
        namespace = new_namespace()
        async with worker_process(tmp_path, namespace, address) as first:
            record = await first.ready()
            opened = MsgpackConnection(record)
            assert await opened.dispatch(Task("echo", 1)) == 1
            calls = [
                asyncio.ensure_future(opened.dispatch(Task("hold", n), timeout=60))
                for n in range(3)
            ]
            assert sorted([await first.line() for _ in calls]) == [
                b"holding 0",
                b"holding 1",
                b"holding 2",
            ]
            killed = time.monotonic()
            first.process.send_signal(signal.SIGKILL)
            for call in calls:
                with pytest.raises(TransientRpcError, match="connection lost") as caught:
                    await call
                lost = (caught.value.reason, caught.value.address)
                assert lost == ("connection-lost", record.address)
            took = time.monotonic() - killed
            await first.process.wait()
        # the same address: the port bound, or the socket file the dead worker left behind
        same = record.address.removeprefix("msgpack+tcp://").removeprefix("msgpack+unix://")
        async with worker_process(tmp_path, namespace, same) as second:
            again = await second.ready()
            assert again.address == record.address
            who = await opened.dispatch(Task("whoami"))
            assert who["pid"] == second.process.pid
        opened.close()
        return took

    assert await scenario() < 5, "the calls failed at the kill, not at their 60 s deadline"


async def test_an_unresponsive_worker_is_found_by_ping(tmp_path: Path) -> None:
    """A stopped process: its kernel keeps the socket open, only a ping finds it silent."""

    async def scenario() -> float:
        async with worker_process(tmp_path, new_namespace(), "127.0.0.1:0") as stuck:
            record = await stuck.ready()
            opened = MsgpackConnection(record, ping_interval=0.2, ping_timeout=0.5)
            assert await opened.dispatch(Task("echo", 1)) == 1
            sock = opened._shared.link._transport.get_extra_info("socket")
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            stuck.process.send_signal(signal.SIGSTOP)
            try:
                begun = time.monotonic()
                with pytest.raises(TransientRpcError, match="no answer to a ping") as caught:
                    await opened.dispatch(Task("echo", 2))
                took = time.monotonic() - begun
                silent = (caught.value.reason, caught.value.address)
                assert silent == ("unresponsive", record.address)
                return took
            finally:
                stuck.process.send_signal(signal.SIGCONT)
                opened.close()

    assert await scenario() < 5


async def test_a_dispatch_to_no_worker_is_transient(tmp_path: Path) -> None:

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        for address in (
            f"msgpack+tcp://127.0.0.1:{port}",
            f"msgpack+unix://{tmp_path}/none.sock",
        ):
            opened = MsgpackConnection(at(address))
            with pytest.raises(TransientRpcError, match="cannot connect") as caught:
                await opened.dispatch(Task("echo"))
            assert (caught.value.reason, caught.value.address) == ("cannot-connect", address)
            opened.close()
            with pytest.raises(TransientRpcError, match="is closed") as caught:
                await opened.dispatch(Task("echo"))
            assert (caught.value.reason, caught.value.address) == ("closed", address)


async def test_a_proxy_over_local_discovery_spreads_tasks_over_two_worker_processes(
    tmp_path: Path, unix_path: str
) -> None:
    async def scenario() -> Counter[int]:
        namespace = new_namespace()
        async with (
            worker_process(tmp_path, namespace, "127.0.0.1:0") as a,
            worker_process(tmp_path, namespace, unix_path) as b,
        ):
            await a.ready()
            await b.ready()
            discovery = LocalDiscovery(namespace, directory=tmp_path, poll_interval=0.01)
            try:
                proxy = WorkerProxy(
                    discovery=discovery.subscribe(), connect=MsgpackConnection, quorum=2
                )
                async with proxy:
                    served = Counter(
                        [(await proxy.dispatch(Task("whoami")))["pid"] for _ in range(6)]
                    )
                    with pytest.raises(WorkerError, match="asked to fail"):
                        await proxy.dispatch(Task("fail"))
                    assert len(proxy.workers) == 2
                    assert served == Counter({a.process.pid: 3, b.process.pid: 3})
                    return served
            finally:
                await discovery.aclose()

    await scenario()


async def test_bad_addresses_are_value_errors(tmp_path: Path, unix_path: str) -> None:

    for address in (
        "grpc://127.0.0.1:1",
        "127.0.0.1:1",
        "msgpack+tcp://h:0",
        "msgpack+unix://x",
    ):
        with pytest.raises(ValueError, match="msgpack\\+tcp://host:port"):
            MsgpackConnection(at(address))
    discovery = InProcessDiscovery(new_namespace())
    for address in ("nohost", "unix://relative", "h:99999"):
        with pytest.raises(ValueError, match="address"):
            await serve_msgpack(DEMO_HANDLERS, address, discovery)
    not_a_socket = tmp_path / "file"
    not_a_socket.write_text("")
    with pytest.raises(OSError, match="not a socket"):
        await serve_msgpack(DEMO_HANDLERS, str(not_a_socket), discovery)
    async with worker(address=unix_path) as live:
        path = live.address.removeprefix("msgpack+unix://")
        with pytest.raises(OSError, match="a live server listens there"):
            await serve_msgpack(DEMO_HANDLERS, path, discovery)


# --- the frame decoder ----------------------------------------------------------------------

VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(VALUES, min_size=1, max_size=6), st.data())
def test_the_frame_decoder_reads_the_same_messages_however_the_bytes_are_split(
    messages: list[Any], data: st.DataObject
) -> None:
    stream = b"".join(wire.pack(message) for message in messages)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    limit = max(len(wire.pack(message)) for message in messages)
    decoder = wire.FrameDecoder(limit)
    decoded: list[Any] = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        decoded.extend(decoder.feed(stream[start:end]))
    assert decoded == messages


@settings(max_examples=100, deadline=None)
@given(
    st.one_of(st.binary(min_size=1, max_size=300), st.lists(st.none(), min_size=1, max_size=300)),
    st.integers(1, 64),
)
def test_the_frame_decoder_refuses_a_frame_one_byte_over_the_limit(body: Any, chunk: int) -> None:
    """Also a frame of many small parts, which msgpack's own buffer bound lets through."""
    frame = wire.pack(body)
    decoder = wire.FrameDecoder(len(frame) - 1)

    def feed_in_chunks() -> None:
        for start in range(0, len(frame), chunk):
            decoder.feed(frame[start : start + chunk])

    with pytest.raises(wire.FrameTooLarge):
        feed_in_chunks()


async def test_a_client_that_does_not_read_its_answers_is_not_read_from_until_it_does() -> None:
    async def big(payload: Any) -> bytes:
        return b"x" * 1_000_000

    async with worker({"big": big}) as server:
        # a small receive buffer: the kernel must not absorb the answers
        reader, writer = await raw_client(server, receive_buffer=4096)
        (link,) = server._state.links
        transport = link._transport
        for msgid in range(20):
            writer.write(wire.request(msgid, "big", msgpack.packb(None), None))
        await until(lambda: not transport.is_reading())
        answers = await read_messages(reader, 20)
        assert sorted(answer[1] for answer in answers) == list(range(20))
        await until(transport.is_reading)
        writer.close()


async def test_the_socket_closes_after_the_last_connection_and_its_last_call() -> None:
    release, started = asyncio.Event(), asyncio.Event()

    async def wait(payload: Any) -> str:
        started.set()
        await release.wait()
        return "finished"

    async with worker({**DEMO_HANDLERS, "wait": wait}) as server:
        links = server._state.links
        first, second = MsgpackConnection(server.metadata), MsgpackConnection(server.metadata)
        held = asyncio.ensure_future(first.dispatch(Task("wait")))
        await started.wait()
        assert await second.dispatch(Task("echo", 1)) == 1
        assert len(links) == 1
        second.close()
        first.close()
        release.set()
        assert await held == "finished"
        await until(lambda: not links)
        # one collected unclosed releases its share too
        third = MsgpackConnection(server.metadata)
        assert await third.dispatch(Task("echo", 2)) == 2
        del third
        gc.collect()
        await until(lambda: not links)


# --- the packer each thread reuses ----------------------------------------------------------


@given(
    st.recursive(
        st.none() | st.integers(-(2**63), 2**64 - 1) | st.text() | st.binary(),
        lambda inner: st.lists(inner, max_size=4),
        max_leaves=12,
    )
)
def test_a_message_that_cannot_be_packed_leaves_nothing_behind_for_the_next(value: Any) -> None:
    for unpackable in ([1, object()], ["\udc80"], [2**70]):
        with pytest.raises((TypeError, ValueError, OverflowError)):
            wire.pack([value, unpackable])
        assert wire.pack(value) == msgpack.packb(value, use_bin_type=True)
