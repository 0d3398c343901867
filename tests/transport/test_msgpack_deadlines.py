"""The deadline a msgpack dispatch carries to the worker (the 4th param, on the client's clock
its hello announced), peers of the first release (no clock, three params), and the ``sent``
of every failure ``MsgpackConnection`` raises; real sockets, in-process workers and raw
peers."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import msgpack  # type: ignore[import-untyped]
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardline import RpcError, TransientRpcError
from shardline.discovery import InProcessDiscovery
from shardline.transport import Task
from shardline.transport.msgpack import wire
from shardline.transport.msgpack.connection import MsgpackConnection
from shardline.transport.msgpack.server import MsgpackWorkerServer, serve_msgpack
from support import msgpack_reference as reference
from support.raw_peer import RawPeer
from support.transport_servers import WAIT, at, new_namespace
from support.waiting import until

pytestmark = [pytest.mark.integration, pytest.mark.async_timeout(WAIT)]


ran: list[Any] = []


async def record(payload: Any) -> Any:
    ran.append(payload)
    return payload


async def hold(payload: Any) -> None:
    await asyncio.Event().wait()


@asynccontextmanager
async def worker(**options: Any) -> AsyncIterator[MsgpackWorkerServer]:
    handlers = {"record": record, "hold": hold, **options.pop("handlers", {})}
    server = await serve_msgpack(
        handlers, "127.0.0.1:0", InProcessDiscovery(new_namespace()), **options
    )
    try:
        yield server
    finally:
        await server.stop(0)


@asynccontextmanager
async def raw_client(server: MsgpackWorkerServer, clock: float | None) -> AsyncIterator[RawPeer]:
    """A client connection that sends its hello (with ``clock``, or none as the first release
    did) and has read the worker's."""
    where = wire.record_address(server.address)
    assert not isinstance(where, str)
    reader, writer = await asyncio.open_connection(*where)
    peer = RawPeer(reader, writer)
    writer.write(wire.hello(1 << 20, clock))
    hello = await peer.read()
    assert hello[1] == wire.HELLO
    try:
        yield peer
    finally:
        writer.close()


def dispatch(msgid: int, handler: str, payload: Any, *params: Any) -> bytes:
    frame: bytes = msgpack.packb(
        [0, msgid, wire.DISPATCH, [handler, msgpack.packb(payload), *params]]
    )
    return frame


async def test_the_worker_announces_its_clock_and_reads_a_clients() -> None:
    async with worker() as server:
        where = wire.record_address(server.address)
        assert not isinstance(where, str)
        reader, writer = await asyncio.open_connection(*where)
        before = time.monotonic()
        hello = await RawPeer(reader, writer).read()
        writer.close()
    clock = hello[2]["clock"]
    assert isinstance(clock, float)
    assert wire.read_hello(hello, "the worker") == wire.Hello(server_limit(hello), clock)
    assert abs(clock - before) < 5.0  # its loop's clock, monotonic like this one's


def server_limit(hello: Any) -> int:
    limit: int = hello[2]["max_frame_bytes"]
    return limit


async def test_a_request_read_after_its_deadline_is_answered_not_started_and_never_run() -> None:
    ran.clear()
    async with worker() as server:
        # a client whose clock is an hour ahead of the worker's: only the offset counts
        skew = 3600.0
        async with raw_client(server, time.monotonic() + skew) as peer:
            now = time.monotonic() + skew
            peer.writer.write(dispatch(1, "record", "late", 10.0, now - 0.5))
            peer.writer.write(dispatch(2, "record", "in time", 10.0, now + 10.0))
            late, in_time = await peer.read(), await peer.read()
    assert late[1] == 1
    assert late[3] is None
    assert late[2]["kind"] == wire.DEADLINE
    assert late[2]["started"] is False
    assert "not started" in late[2]["message"]
    assert in_time[1:3] == [2, None]
    assert ran == ["in time"]


async def test_a_hello_read_late_is_corrected_by_the_requests_that_follow() -> None:
    """A hello that reached the worker 10 s after it was written would place every deadline
    10 s late; a request written and read at once tells the worker the clocks' true offset."""
    ran.clear()
    async with worker() as server, raw_client(server, time.monotonic() - 10.0) as peer:
        now = time.monotonic()
        peer.writer.write(dispatch(1, "record", "prompt", 10.0, now + 10.0))
        prompt = await peer.read()
        # written 10.5 s ago, its caller gone 0.5 s ago: dropped
        now = time.monotonic()
        peer.writer.write(dispatch(2, "record", "stale", 10.0, now - 0.5))
        stale = await peer.read()
    assert prompt[1:3] == [1, None]
    assert stale[2]["kind"] == wire.DEADLINE
    assert stale[2]["started"] is False
    assert ran == ["prompt"]


async def test_a_running_handler_is_cancelled_at_the_earlier_of_its_timeout_and_deadline() -> None:
    async with worker() as server, raw_client(server, time.monotonic()) as peer:
        loop = asyncio.get_running_loop()
        sent_at = loop.time()
        # the deadline first, then the timeout first
        peer.writer.write(dispatch(1, "hold", None, 30.0, time.monotonic() + 0.2))
        peer.writer.write(dispatch(2, "hold", None, 0.2, time.monotonic() + 30.0))
        answers = {}
        for _ in range(2):
            answer = await peer.read()
            answers[answer[1]] = answer[2]
        took = loop.time() - sent_at
    for msgid in (1, 2):
        assert answers[msgid]["kind"] == wire.DEADLINE
        assert answers[msgid]["started"] is True
    assert took < 10.0  # neither waited for its 30 s


@pytest.mark.parametrize(
    ("clock", "params"),
    [
        (None, (10.0,)),  # a client of the first release: no clock, three params
        (None, (10.0, 0.0)),  # a deadline without a clock to place it: not read as one
        ("now", (10.0,)),  # a clock and three params
        ("now", (10.0, None)),  # nil: no deadline
    ],
)
async def test_requests_without_a_deadline_the_worker_can_place_run(
    clock: str | None, params: tuple[Any, ...]
) -> None:
    ran.clear()
    async with (
        worker() as server,
        raw_client(server, None if clock is None else time.monotonic()) as peer,
    ):
        peer.writer.write(dispatch(7, "record", "ran", *params))
        answer = await peer.read()
    assert answer[1:3] == [7, None]
    assert msgpack.unpackb(answer[3]) == "ran"
    assert ran == ["ran"]


@pytest.mark.parametrize("deadline", ["soon", float("nan"), float("inf"), True, [1.0]])
async def test_a_deadline_that_is_not_a_finite_number_is_a_bad_request(deadline: Any) -> None:
    async with worker() as server, raw_client(server, time.monotonic()) as peer:
        peer.writer.write(dispatch(3, "record", None, 10.0, deadline))
        answer = await peer.read()
    assert answer[2]["kind"] == wire.BAD_REQUEST


Talk = Callable[[RawPeer], Awaitable[None]]


@asynccontextmanager
async def raw_worker(talk: Talk) -> AsyncIterator[str]:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await talk(RawPeer(reader, writer))
        finally:
            writer.close()

    listener = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"msgpack+tcp://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
    finally:
        listener.close()


@pytest.mark.parametrize("worker_clock", [None, 12.5])
async def test_the_client_sends_a_deadline_only_to_a_worker_that_announced_its_clock(
    worker_clock: float | None,
) -> None:
    requests: list[Any] = []

    async def talk(peer: RawPeer) -> None:
        peer.writer.write(wire.hello(1 << 20, worker_clock))
        hello = await peer.read()
        requests.append(hello)
        request = await peer.read()
        requests.append(request)
        peer.writer.write(wire.result(request[1], msgpack.packb("ok")))
        await peer.reader.read()

    async with raw_worker(talk) as address:
        connection = MsgpackConnection(at(address))
        loop = asyncio.get_running_loop()
        before = loop.time()
        assert await connection.dispatch(Task("echo", 1), timeout=5.0) == "ok"
        after = loop.time()
        connection.close()
    hello, request = requests
    assert before - 60 < hello[2]["clock"] <= after  # the client's loop clock
    params = request[3]
    if worker_clock is None:
        assert len(params) == 3  # what a worker of the first release reads
    else:
        assert len(params) == 4
        assert before + 5.0 <= params[3] <= after + 5.0


async def silent_after_hello(peer: RawPeer) -> None:
    peer.writer.write(wire.hello(1 << 20, 0.0))
    await peer.reader.read()


async def closes_after_the_request(peer: RawPeer) -> None:
    peer.writer.write(wire.hello(1 << 20, 0.0))
    await peer.read()  # the hello
    await peer.read()  # the request
    peer.writer.transport.abort()


async def closes_at_once(peer: RawPeer) -> None:
    peer.writer.transport.abort()


def answering(**error: Any) -> Talk:
    async def talk(peer: RawPeer) -> None:
        peer.writer.write(wire.hello(1 << 20, 0.0))
        await peer.read()
        request = await peer.read()
        peer.writer.write(msgpack.packb([1, request[1], error, None]))
        await peer.reader.read()

    return talk


def error(kind: str, **more: Any) -> dict[str, Any]:
    return {"kind": kind, "type": "T", "message": "m", **more}


@pytest.mark.parametrize(
    ("talk", "options", "timeout", "reason", "sent"),
    [
        (answering(**error(wire.BUSY)), {}, None, "busy", False),
        (answering(**error(wire.UNAVAILABLE)), {}, None, "unavailable", False),
        (answering(**error(wire.SHUTTING_DOWN, started=False)), {}, None, "shutting-down", False),
        (answering(**error(wire.SHUTTING_DOWN, started=True)), {}, None, "shutting-down", True),
        (answering(**error(wire.SHUTTING_DOWN)), {}, None, "shutting-down", True),
        (answering(**error(wire.DEADLINE, started=False)), {}, None, "deadline", False),
        (answering(**error(wire.DEADLINE, started=True)), {}, None, "deadline", True),
        (answering(**error(wire.DEADLINE)), {}, None, "deadline", True),
        (answering(kind=wire.DEADLINE, started="no"), {}, None, "protocol", True),
        (silent_after_hello, {}, 0.1, "deadline", True),
        (closes_after_the_request, {}, None, "connection-lost", True),
        (closes_at_once, {}, None, "connection-lost", False),
        (
            silent_after_hello,
            {"ping_interval": 0.05, "ping_timeout": 0.05},
            None,
            "unresponsive",
            True,
        ),
    ],
    ids=[
        "busy",
        "unavailable",
        "stopping-not-started",
        "stopping-started",
        "stopping-unsaid",
        "dropped-unstarted",
        "deadline-started",
        "deadline-unsaid",
        "started-not-a-bool",
        "own-deadline",
        "lost-after-writing",
        "lost-before-hello",
        "unresponsive",
    ],
)
async def test_each_failure_says_whether_the_task_may_have_started(
    talk: Talk, options: dict[str, Any], timeout: float | None, reason: str, sent: bool
) -> None:
    async with raw_worker(talk) as address:
        connection = MsgpackConnection(at(address), **options)
        with pytest.raises(RpcError) as failed:
            await connection.dispatch(Task("echo"), timeout=timeout)
        connection.close()
    assert (failed.value.reason, failed.value.sent) == (reason, sent)


async def test_failures_before_sending_are_not_sent() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    connection = MsgpackConnection(at(f"msgpack+tcp://127.0.0.1:{port}"))
    with pytest.raises(TransientRpcError) as refused:
        await connection.dispatch(Task("echo"))
    assert (refused.value.reason, refused.value.sent) == ("cannot-connect", False)
    connection.close()
    with pytest.raises(TransientRpcError) as closed:
        await connection.dispatch(Task("echo"))
    assert (closed.value.reason, closed.value.sent) == ("closed", False)

    async def no_hello(peer: RawPeer) -> None:
        await peer.reader.read()

    async with raw_worker(no_hello) as address:
        connection = MsgpackConnection(at(address))
        with pytest.raises(TransientRpcError, match="before the call was sent") as waited:
            await connection.dispatch(Task("echo"), timeout=0.1)
        connection.close()
    assert (waited.value.reason, waited.value.sent) == ("deadline", False)


async def test_a_stopping_worker_says_whether_it_had_started_the_call() -> None:
    async with worker() as server:
        connection = MsgpackConnection(at(server.address))
        running = asyncio.ensure_future(connection.dispatch(Task("hold"), timeout=10.0))
        await until(lambda: any(link.calls for link in server._state.links), "the call running")
        await server.stop(0)
        with pytest.raises(TransientRpcError) as cancelled:
            await running
        connection.close()
    assert (cancelled.value.reason, cancelled.value.sent) == ("shutting-down", True)


async def test_a_sync_call_that_waits_for_a_thread_past_its_deadline_never_starts() -> None:
    release = threading.Event()
    started: list[Any] = []

    def gate(payload: Any) -> Any:
        started.append(payload)
        release.wait(10.0)
        return payload

    async with worker(handlers={"gate": gate}, threads=1) as server:
        connection = MsgpackConnection(at(server.address))
        first = asyncio.ensure_future(connection.dispatch(Task("gate", "first"), timeout=10.0))
        await until(lambda: started, "the first call running")
        # the only thread is busy: this one waits in the queue until its deadline passes
        with pytest.raises(TransientRpcError) as late:
            await connection.dispatch(Task("gate", "queued"), timeout=0.2)
        assert late.value.reason == "deadline"
        release.set()
        assert await first == "first"
        # a third call, after the queued one in the same queue: when it ran, that one was
        # judged already
        assert await connection.dispatch(Task("gate", "third"), timeout=10.0) == "third"
        connection.close()
    assert started == ["first", "third"]


async def test_a_sync_call_dropped_from_the_thread_queue_is_answered_not_started() -> None:
    release = threading.Event()

    def gate(payload: Any) -> Any:
        release.wait(10.0)
        return payload

    async with (
        worker(handlers={"gate": gate}, threads=1) as server,
        raw_client(server, time.monotonic()) as peer,
    ):
        peer.writer.write(dispatch(1, "gate", "first", 10.0, time.monotonic() + 10.0))
        peer.writer.write(dispatch(2, "gate", "queued", 0.2, time.monotonic() + 0.2))
        dropped = await peer.read()
        release.set()
        first = await peer.read()
    assert dropped[1] == 2
    assert dropped[2]["kind"] == wire.DEADLINE
    assert dropped[2]["started"] is False
    assert first[1:3] == [1, None]


@pytest.mark.parametrize("threads", [0, -1, 1.5, True, "2"])
async def test_threads_must_be_a_positive_int(threads: Any) -> None:
    with pytest.raises(ValueError, match="threads must be a positive int"):
        await serve_msgpack({}, "127.0.0.1:0", InProcessDiscovery(new_namespace()), threads=threads)


@settings(max_examples=300)
@given(
    st.integers(0, 2**32 - 1),
    st.text(max_size=20),
    st.binary(max_size=40),
    st.none() | st.floats(),
    st.floats(allow_nan=False, allow_infinity=False),
)
def test_a_request_with_a_deadline_is_msgpack_pythons_and_read_back_whole(
    msgid: int, handler: str, payload: bytes, timeout: float | None, deadline: float
) -> None:
    expected = reference.packed([0, msgid, wire.DISPATCH, [handler, payload, timeout, deadline]])
    try:
        frame = wire.request(msgid, handler, payload, timeout, deadline)
    except ValueError:
        assert any("\ud800" <= c <= "\udfff" for c in handler)
        return
    assert frame == expected
    read = wire.FrameDecoder(len(frame) + 64, "requests")
    read.feed(wire.hello(1))
    taken_apart = reference.taken_apart(reference.model_unpack(frame), "requests")
    assert reference.same(read.feed(frame), [taken_apart])


@settings(max_examples=300)
@given(
    st.integers(0, 2**32 - 1),
    st.none()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(width=32)
    | st.booleans()
    | st.text(max_size=3),
    st.booleans(),
)
def test_the_decoder_reads_every_deadline_the_worker_reads(
    msgid: int, deadline: Any, single: bool
) -> None:
    """Ints and float32 (``single``) too, as the model reads them; what it does not read is
    handed over whole, for the worker to refuse."""
    message = [0, msgid, wire.DISPATCH, ["h", b"\xc0", None, deadline]]
    frame = msgpack.packb(message, use_bin_type=True, use_single_float=single)
    read = wire.FrameDecoder(len(frame) + 64, "requests")
    read.feed(wire.hello(1))
    taken_apart = reference.taken_apart(reference.model_unpack(frame), "requests")
    assert reference.same(read.feed(frame), [taken_apart])


def test_call_sends_the_deadline_as_request_does() -> None:
    for deadline in (None, 1234.5):
        assert wire.call(5, "echo", [1, "x"], 2.0, deadline) == wire.request(
            5, "echo", reference.packed([1, "x"]), 2.0, deadline
        )
