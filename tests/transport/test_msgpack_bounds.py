"""The bounds a MessagePack-RPC worker keeps (`WorkerLimits`), each shown by its attack on a
real worker process (bounds_worker.py) over loopback: a client that never reads its answers,
connections that never say hello or never finish a message, more connections than allowed,
a worker out of file descriptors, more calls than the worker takes, messages of millions of
items, msgids outside 32 bits."""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import socket
import ssl
import sys
import uuid
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgpack  # type: ignore[import-untyped]
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardline import TransientRpcError, WorkerMetadata
from shardline.discovery import InProcessDiscovery
from shardline.errors import InvalidArgumentType, WorkerError
from shardline.transport import LocalPool, Task
from shardline.transport.limits import WorkerLimits
from shardline.transport.msgpack import stream_wire, wire
from shardline.transport.msgpack.connection import MsgpackConnection
from shardline.transport.msgpack.server import MAX_IN_FLIGHT, serve_msgpack
from support.certificates import Pair, make_certificates
from support.transport_servers import WAIT
from support.worker_processes import worker_process

pytestmark = [pytest.mark.integration, pytest.mark.async_timeout(60)]

SCRIPT = Path(__file__).with_name("bounds_worker.py")
MiB = 1024 * 1024


class Worker:
    """A bounds_worker.py process: its address, and its log lines as they come."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.lines: list[str] = []
        self._changed = asyncio.Event()
        self._reading: asyncio.Task[None] | None = None
        self.host = ""
        self.port = 0

    async def start(self) -> None:
        assert self.process.stdout is not None
        assert self.process.stderr is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), WAIT)
        assert line, f"the worker exited: {await self.process.stderr.read()!r}"
        where = wire.record_address(line.decode().strip())
        assert not isinstance(where, str)
        self.host, self.port = where
        self._reading = asyncio.create_task(self._read(self.process.stderr))

    async def _read(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            self.lines.append(line.decode(errors="replace").rstrip())
            self._changed.set()

    @property
    def record(self) -> WorkerMetadata:
        return WorkerMetadata(
            uid=uuid.uuid4(), address=wire.tcp_address(self.host, self.port), pid=0, version=""
        )

    async def logged(self, *words: str, after: int = 0) -> str:
        """The first log line holding every one of ``words``, from the ``after``-th line on,
        waited for (at most WAIT)."""
        async with asyncio.timeout(WAIT):
            while True:
                for line in self.lines[after:]:
                    if all(word in line for word in words):
                        return line
                self._changed.clear()
                await self._changed.wait()

    def rss(self) -> int:
        """The process's resident memory in bytes."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        (line,) = [line for line in status.splitlines() if line.startswith("VmRSS:")]
        return int(line.split()[1]) * 1024

    async def close(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
        await self.process.wait()
        if self._reading is not None:
            await self._reading


@asynccontextmanager
async def bounded_worker(
    limits: dict[str, Any],
    *,
    nofile: tuple[int, int] | None = None,
    loop: str = "uvloop",
    tls: Pair | None = None,
) -> AsyncIterator[Worker]:
    """A worker process under ``WorkerLimits(**limits)``, its open file limit set to ``nofile``
    (soft, hard) before it starts, serving on ``loop`` (``uvloop`` or ``asyncio``), with TLS
    (this certificate and key) when ``tls`` is given."""
    WorkerLimits(**limits)  # a typo fails here, not in the child

    def limit_files() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, nofile)

    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(SCRIPT),
        json.dumps(limits),
        str(MAX_IN_FLIGHT),
        loop,
        *([tls.cert, tls.key] if tls else []),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        preexec_fn=limit_files,
    )
    worker = Worker(process)
    try:
        await worker.start()
        yield worker
    finally:
        await worker.close()


@asynccontextmanager
async def client(worker: Worker) -> AsyncIterator[MsgpackConnection]:
    opened = MsgpackConnection(worker.record)
    try:
        yield opened
    finally:
        opened.close()


async def raw_socket(
    worker: Worker, *, hello: bool = True, receive_buffer: int | None = None
) -> socket.socket:
    """A TCP socket to the worker; with ``hello``, one that has said hello and read the
    worker's."""
    sock = socket.socket()
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (worker.host, worker.port))
    if hello:
        await loop.sock_sendall(sock, wire.hello(1 << 30))
        (greeting,) = await read(sock, 1)
        assert greeting[:2] == [wire.NOTIFICATION, wire.HELLO]
    return sock


async def read(sock: socket.socket, count: int, limit: int = 8 * MiB) -> list[Any]:
    """The next ``count`` messages of ``sock``, fewer if the worker closes it first.

    Implementation notes: read with the transport's own decoder; a socket read by it once
    must be read by it to the end (a decoder per call would lose a message split between
    two calls), so this is called once per socket, or with exact counts."""
    decoder = _decoders.setdefault(sock, wire.FrameDecoder(limit))
    loop = asyncio.get_running_loop()
    messages: list[Any] = []
    while len(messages) < count:
        try:
            data = await loop.sock_recv(sock, 1 << 20)
        except ConnectionResetError:
            break
        if not data:
            break
        messages.extend(decoder.feed(data))
    return messages


# By socket, not by descriptor: a test that fails before close_all leaves its decoder
# behind, and a later socket given the same descriptor read through it (a message of the
# dead socket unfinished in it) hung until its test timed out.
_decoders: weakref.WeakKeyDictionary[socket.socket, wire.FrameDecoder] = weakref.WeakKeyDictionary()


async def closed_by_worker(sock: socket.socket) -> bool:
    """Whether the worker closes ``sock`` within WAIT (what it sent before is read and
    dropped)."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(WAIT):
        while True:
            try:
                if not await loop.sock_recv(sock, 1 << 20):
                    return True
            except ConnectionResetError:
                return True


def close_all(socks: list[socket.socket]) -> None:
    for sock in socks:
        _decoders.pop(sock, None)
        sock.close()


def dispatch(msgid: int, handler: str, payload: Any = None) -> bytes:
    return wire.request(msgid, handler, msgpack.packb(payload), None)


async def dial(worker: Worker) -> tuple[socket.socket, float]:
    """A TCP socket connected to the worker (nothing sent), and the seconds its connect took."""
    sock = socket.socket()
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await loop.sock_connect(sock, (worker.host, worker.port))
    return sock, loop.time() - started


async def blocked(worker: Worker, sock: socket.socket, seconds: float) -> None:
    """Blocks the worker's loop for ``seconds`` through ``sock`` (which said hello); returns
    once it is blocked."""
    seen = len(worker.lines)
    await asyncio.get_running_loop().sock_sendall(sock, dispatch(3, "block", seconds))
    await worker.logged(f"blocking the loop for {seconds} s", after=seen)


async def echo_works(worker: Worker) -> None:
    async with client(worker) as opened:
        assert await opened.dispatch(Task("echo", "still here")) == "still here"


async def holding(worker: Worker) -> socket.socket | None:
    """A socket that says hello and starts a call that runs until cancelled (msgid 1), then
    pings (msgid 2): the pong says the call was read, and no timeout closes the socket while
    it runs. None when the worker closed it first: refused (closed without its hello), or
    idle before the call came (a loaded machine can stall the test that long after a
    connect, past a test's short ``idle_timeout``)."""
    sock = socket.socket()
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (worker.host, worker.port))
    with contextlib.suppress(ConnectionError):  # closed already
        await loop.sock_sendall(sock, wire.hello(1 << 30) + dispatch(1, "hold") + wire.ping(2))
    answers = await read(sock, 2)
    if len(answers) == 2:
        assert answers[1] == [wire.RESPONSE, 2, None, None]
        return sock
    close_all([sock])
    return None


async def answered(opened: MsgpackConnection, value: Any) -> None:
    """``echo`` of ``value`` answered through ``opened``, dialling again while the worker
    closes the socket unserved: refused, or cut for a hello (or a first call) read after a
    test's short ``hello_timeout`` (``idle_timeout``): a loaded machine can stall the client
    between its connect and its hello, or the worker between its accept and its read, that
    long; the bound at work. At most WAIT."""
    async with asyncio.timeout(WAIT):
        while True:
            try:
                assert await opened.dispatch(Task("echo", value)) == value
                return
            except TransientRpcError as error:
                if error.reason not in ("connection-lost", "cannot-connect"):
                    raise


async def served(worker: Worker) -> None:
    """A new client of ``worker`` served (see :func:`answered`)."""
    async with client(worker) as opened:
        await answered(opened, "still here")


# --- answers nobody reads ---------------------------------------------------------------


async def test_a_client_that_never_reads_costs_the_worker_no_more_than_what_it_started() -> None:
    # the attack: 1,000 pipelined requests for 1 MB answers on a socket never read
    async with bounded_worker({}) as worker:
        before = worker.rss()
        flood = await raw_socket(worker, receive_buffer=4096)
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(flood, b"".join(dispatch(n, "big") for n in range(1000)))
        # two round trips on another socket: the worker has read the flood by then
        async with client(worker) as opened:
            for _ in range(2):
                assert await opened.dispatch(Task("echo", 1)) == 1
        grown = worker.rss() - before
        assert grown < 100 * MiB, f"the worker grew by {grown / MiB:.0f} MiB"
        # nothing was lost: once read, every answer comes, in order (read through a
        # larger buffer: 1,000 MB through the 4 KiB one took over the test's 60 s at load 10)
        flood.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * MiB)
        answers = await read(flood, 1000)
        assert [answer[1] for answer in answers] == list(range(1000))
        assert all(len(answer[3]) > 1_000_000 for answer in answers)
        close_all([flood])


async def test_answers_queued_past_max_queued_bytes_close_the_connection() -> None:
    # calls that all start before any answers: their answers come while the socket is full
    async with bounded_worker({"max_queued_bytes": 8 * MiB}) as worker:
        before = worker.rss()
        flood = await raw_socket(worker, receive_buffer=4096)
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(flood, b"".join(dispatch(n, "big_later") for n in range(1000)))
        line = await worker.logged("WARNING", "over max_queued_bytes 8388608")
        assert "answer bytes it does not read are queued" in line
        grown = worker.rss() - before
        assert grown < 100 * MiB, f"the worker grew by {grown / MiB:.0f} MiB"
        assert await closed_by_worker(flood)
        close_all([flood])
        await echo_works(worker)


# --- timeouts ---------------------------------------------------------------------------


async def test_connections_that_never_say_hello_are_closed_after_hello_timeout() -> None:
    async with bounded_worker({"hello_timeout": 0.5}) as worker:
        silent = [await raw_socket(worker, hello=False) for _ in range(50)]
        assert all(await asyncio.gather(*map(closed_by_worker, silent)))
        await worker.logged("WARNING", "no hello within hello_timeout 0.5 s")
        close_all(silent)
        await served(worker)


async def test_unfinished_frames_are_closed_after_frame_timeout() -> None:
    # the attack: 50 connections, each holding a 4 MiB frame one kilobyte short
    async with bounded_worker({"frame_timeout": 1.0}) as worker:
        body = 4 * MiB - 64
        frame = wire.request(1, "echo", b"\0" * body, None)
        holders = [await raw_socket(worker) for _ in range(50)]
        loop = asyncio.get_running_loop()
        for sock in holders:
            # the worker may close it before it is all sent: that is the bound at work
            with contextlib.suppress(ConnectionError):
                await loop.sock_sendall(sock, frame[:-1024])
        assert all(await asyncio.gather(*map(closed_by_worker, holders)))
        await worker.logged("WARNING", "a message unfinished after frame_timeout 1 s")
        close_all(holders)
        await echo_works(worker)


async def test_an_idle_connection_is_closed_but_not_one_with_a_call_in_flight() -> None:
    async with bounded_worker({"idle_timeout": 0.5}) as worker:
        async with asyncio.timeout(WAIT):
            while (held := await holding(worker)) is None:
                pass
        idle = await raw_socket(worker)
        assert await closed_by_worker(idle)
        await worker.logged("INFO", "idle for idle_timeout 0.5 s")
        # the one holding a call is still served
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(held, wire.ping(3))
        (pong,) = await read(held, 1)
        assert pong == [wire.RESPONSE, 3, None, None]
        close_all([held, idle])
        # a client whose socket was closed as idle dials again at its next call
        async with client(worker) as opened:
            seen = len(worker.lines)
            await answered(opened, 1)
            link = opened._shared.link
            assert link is not None
            await worker.logged("closed 1 connections: idle", after=seen)
            # (a call written while the close is on its way fails as connection lost: the
            # client must have seen it)
            async with asyncio.timeout(WAIT):
                while not link.broken:
                    await asyncio.sleep(0.005)
            await answered(opened, 2)
            assert opened._shared.link is not link


# What each timeout's victim sends before the worker's loop blocks (read by the worker then),
# and what it sends while it is blocked, in time: a ping, or an echo (msgid 9) whose frame
# it finishes. Its silent twin sends the same before, and nothing after.
_ECHO = dispatch(9, "echo", "x" * 1000)
_STALLS = {
    "hello": ({"hello_timeout": 1.0}, b"", wire.hello(1 << 30) + wire.ping(9), "no hello"),
    "idle": ({"idle_timeout": 1.0}, wire.hello(1 << 30) + wire.ping(1), wire.ping(9), "idle for"),
    "frame": (
        {"frame_timeout": 1.0},
        wire.hello(1 << 30) + wire.ping(1) + _ECHO[:-100],
        _ECHO[-100:],
        "a message unfinished",
    ),
}


@pytest.mark.parametrize("timeout", list(_STALLS))
async def test_what_came_while_the_loop_was_blocked_is_read_before_the_timeouts_judge(
    timeout: str,
) -> None:
    # uvloop runs its timers before it reads its sockets: after a handler blocked the loop
    # past a timeout, the sweep came first, and cut clients whose bytes came in time
    limits, before, during, said = _STALLS[timeout]
    async with bounded_worker(limits) as worker:
        loop = asyncio.get_running_loop()
        blocker = await raw_socket(worker)
        victim, silent = [await raw_socket(worker, hello=False) for _ in range(2)]
        for sock in (victim, silent):
            await loop.sock_sendall(sock, before)
            # the worker's hello (and the pong): accepted and read, timed from now on
            assert len(await read(sock, 1 if timeout == "hello" else 2)) > 0
        seen = len(worker.lines)
        await blocked(worker, blocker, 2.5)
        await loop.sock_sendall(victim, during)
        (answer,) = await read(victim, 1)
        assert answer[:3] == [wire.RESPONSE, 9, None], answer
        assert await closed_by_worker(silent)
        await worker.logged("WARNING" if timeout != "idle" else "INFO", "closed", said, after=seen)
        close_all([blocker, victim, silent])


async def test_a_tls_handshake_sent_while_the_loop_was_blocked_is_finished_not_cut(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # As the timeouts above: uvloop runs its timers before it reads its sockets, so after a
    # stall start_tls's own handshake timeout cut a handshake whose first flight came in time
    certificates = make_certificates(tmp_path_factory.mktemp("tls"))
    trusted = ssl.create_default_context(cafile=certificates.ca)
    async with bounded_worker({"handshake_timeout": 1.5}, tls=certificates.server) as worker:
        victim, silent = [await raw_socket(worker, hello=False) for _ in range(2)]
        # accepted after those two: once its handshake is done, the worker has accepted them
        _, writer = await asyncio.open_connection(
            worker.host, worker.port, ssl=trusted, server_hostname="localhost"
        )
        seen = len(worker.lines)
        writer.write(wire.hello(1 << 30) + dispatch(3, "block", 3.0))
        await worker.logged("blocking the loop for 3.0 s", after=seen)
        # the victim's handshake and first call, sent while the loop is blocked
        victim_reader, victim_writer = await asyncio.open_connection(
            sock=victim, ssl=trusted, server_hostname="localhost"
        )
        victim_writer.write(wire.hello(1 << 30) + wire.ping(9))
        decoder = wire.FrameDecoder(1 << 20)
        answers: list[Any] = []
        async with asyncio.timeout(WAIT):
            while len(answers) < 2:
                data = await victim_reader.read(1 << 16)
                assert data, "the worker closed the connection"
                answers.extend(decoder.feed(data))
        assert answers[1] == [wire.RESPONSE, 9, None, None], answers
        assert await closed_by_worker(silent)
        await worker.logged(
            "WARNING", "refused the TLS handshake", "handshake_timeout 1.5 s", after=seen
        )
        for opened in (writer, victim_writer):
            opened.close()
        close_all([silent])


# --- connections and file descriptors ---------------------------------------------------


async def test_connections_beyond_max_connections_are_closed_counted_and_logged() -> None:
    async with bounded_worker({"max_connections": 20}) as worker:
        admitted = [await raw_socket(worker) for _ in range(20)]
        refused = [await raw_socket(worker, hello=False) for _ in range(10)]
        assert all(await asyncio.gather(*map(closed_by_worker, refused)))
        line = await worker.logged("WARNING", "refused", "over max_connections")
        assert "refused 10 connections" in line
        assert "at most 20" in line
        loop = asyncio.get_running_loop()
        for n, sock in enumerate(admitted):
            await loop.sock_sendall(sock, wire.ping(n))
            assert await read(sock, 1) == [[wire.RESPONSE, n, None, None]]
        close_all(admitted + refused)
        await echo_works(worker)


@pytest.mark.parametrize("serving_loop", ["uvloop", "asyncio"])
async def test_idle_sockets_past_the_open_file_limit_leave_room_for_clients(
    serving_loop: str,
) -> None:
    # The attack: 1,100 sockets against a worker under ulimit -n 1024. Each holds a call
    # while the attack builds up, so none is closed before it is complete however long a
    # loaded machine makes that (sockets that never said hello, under a 5 s hello_timeout,
    # were once closed before the bound was reached: nothing was refused); then they go
    # idle. The 768 descriptors beyond the reserve (256) are shared: 192 for the listen
    # backlog (a quarter), 576 for the connections.
    async with bounded_worker(
        {"idle_timeout": 5.0}, nofile=(1024, 1024), loop=serving_loop
    ) as worker:
        await worker.logged("the listen backlog is 192, under accept_burst 1000")
        await worker.logged(
            "max_connections 10000 is over what the open file limit (1024) allows beside a"
            " listen backlog of 192: 576 connections at most"
        )

        async def refusals_logged(count: int, after: int = 0) -> int:
            # until the lines from the after-th on say count were refused, and no more: the
            # index of the line after the last of them
            refused = 0
            async with asyncio.timeout(WAIT):
                while refused < count:
                    line = await worker.logged("WARNING", "refused", "at most 576", after=after)
                    after = worker.lines.index(line, after) + 1
                    refused += int(line.split("refused ")[1].split()[0])
            assert refused == count
            return after

        held: list[socket.socket | None] = []
        while len(held) < 1100:
            # 50 at a time, each taken by the worker (served or refused) before the next 50:
            # within the listen backlog (192), so no connect waits out a dropped SYN
            held += await asyncio.gather(*(holding(worker) for _ in range(50)))
        idle = [sock for sock in held if sock is not None]
        assert len(idle) == 576
        seen = await refusals_logged(1100 - 576)
        # 300 dial the full worker while its loop is blocked. uvloop refuses each as it
        # accepts it; asyncio's loop accepts the whole queue (192) in one pass beside the 576
        # open, and refuses them a turn later: the queue and the connections fit beside the
        # reserve, so no accept fails for want of a descriptor (a backlog of 1,000 beside
        # 768 connections failed them: "out of system resource")
        await blocked(worker, idle[0], 1.0)
        burst = [sock for sock, _ in await asyncio.gather(*(dial(worker) for _ in range(300)))]
        assert all(await asyncio.gather(*map(closed_by_worker, burst)))
        close_all(burst)
        await refusals_logged(300, after=seen)
        loop = asyncio.get_running_loop()
        for sock in idle:
            await loop.sock_sendall(sock, wire.cancel(1))
        # idle from their cancel on: closed by the worker, and a client gets through
        assert all(await asyncio.gather(*map(closed_by_worker, idle)))
        await served(worker)
        close_all(idle)
        short = ("out of file descriptors", "out of system resource", "Too many open files")
        assert not [line for line in worker.lines if any(word in line for word in short)]


async def test_running_out_of_file_descriptors_is_logged_at_warning() -> None:
    async with bounded_worker({}, nofile=(512, 512)) as worker, client(worker) as opened:
        assert await opened.dispatch(Task("hog")) > 0
        line = await worker.logged("out of file descriptors (EMFILE)")
        assert line.startswith("WARNING")
        assert await opened.dispatch(Task("release")) > 0
        await worker.logged("INFO", "file descriptors are available again")


async def test_the_soft_open_file_limit_is_raised_to_the_hard_one_at_start() -> None:
    async with bounded_worker({}, nofile=(256, 4096)) as worker:
        await worker.logged("raised the open file limit from 256 to 4096")
        limits = Path(f"/proc/{worker.process.pid}/limits").read_text()
        (line,) = [line for line in limits.splitlines() if line.startswith("Max open files")]
        assert line.split()[3:5] == ["4096", "4096"]


# --- calls ------------------------------------------------------------------------------


async def test_calls_beyond_max_calls_on_the_whole_worker_are_busy() -> None:
    # per connection, 1,024 may run: the worker-wide bound is what stops these
    async with bounded_worker({"max_calls": 6}) as worker:
        socks = [await raw_socket(worker) for _ in range(3)]
        loop = asyncio.get_running_loop()
        busy = []
        for sock in socks:
            await loop.sock_sendall(sock, b"".join(dispatch(n, "hold") for n in range(3)))
            await loop.sock_sendall(sock, wire.ping(99))
            answers = []
            while not answers or answers[-1][1] != 99:
                answers += await read(sock, 1)
            busy.append([answer[2]["kind"] for answer in answers[:-1]])
        assert busy == [[], [], ["busy"] * 3]
        async with client(worker) as opened:
            with pytest.raises(TransientRpcError) as refused:
                await opened.dispatch(Task("echo", 1))
            assert (refused.value.reason, refused.value.sent) == ("busy", False)
            assert "6 dispatches already in flight on this worker" in str(refused.value)
        close_all(socks)


async def test_a_stream_counts_against_max_calls_as_a_dispatch_does() -> None:
    async with bounded_worker({"max_calls": 2}) as worker:
        sock = await raw_socket(worker)
        loop = asyncio.get_running_loop()
        # two endless streams, each held by its window of one item
        await loop.sock_sendall(
            sock,
            b"".join(
                stream_wire.stream_request(n, "ticks", msgpack.packb(None), None, None, 1)
                for n in (1, 2)
            ),
        )
        await loop.sock_sendall(sock, dispatch(3, "echo", 1))
        await loop.sock_sendall(
            sock, stream_wire.stream_request(4, "ticks", msgpack.packb(None), None, None, 1)
        )
        answers: dict[int, Any] = {}

        async def two_answers() -> None:
            while len(answers) < 2:
                for message in await read(sock, 1):
                    if message[0] == wire.RESPONSE:
                        answers[message[1]] = message[2]

        await asyncio.wait_for(two_answers(), WAIT)
        assert [answers[msgid]["kind"] for msgid in (3, 4)] == ["busy", "busy"]
        assert "2 dispatches already in flight on this worker" in answers[3]["message"]
        close_all([sock])


# --- items and what an error says -------------------------------------------------------


async def test_a_message_of_millions_of_items_closes_its_connection() -> None:
    # the attack: a 4 MB frame of four million one-byte ints
    async with bounded_worker({}) as worker:
        sock = await raw_socket(worker)
        frame = msgpack.packb([0, 1, wire.DISPATCH, [0] * 4_000_000])
        loop = asyncio.get_running_loop()
        with contextlib.suppress(ConnectionError):
            await loop.sock_sendall(sock, frame)
        assert await closed_by_worker(sock)
        await worker.logged("ERROR", "more than 4096 items in one message")
        close_all([sock])
        await echo_works(worker)


async def test_a_payload_of_millions_of_items_is_a_bad_request_naming_the_bound() -> None:
    async with bounded_worker({}) as worker:
        sock = await raw_socket(worker)
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(sock, dispatch(1, "echo", [0] * 4_000_000))
        ((_, msgid, error, _),) = await read(sock, 1)
        assert (msgid, error["kind"]) == (1, wire.BAD_REQUEST)
        assert "more than 1048576 items" in error["message"]
        close_all([sock])


async def test_a_stream_s_payload_is_bounded_as_a_dispatch_s() -> None:
    async with bounded_worker({"max_payload_items": 3}) as worker, client(worker) as opened:
        with pytest.raises(WorkerError, match="more than 3 items"):
            async for _ in await opened.stream(Task("ticks", [1, 2, 3])):
                pass
        async for tick in await opened.stream(Task("ticks", [1, 2])):
            assert tick == 0
            break


@pytest.mark.parametrize(
    ("params", "said"),
    [
        ([0] * 4000, "got an array of 4000 items"),
        (["echo", "x" * 100_000, None], "got ['echo', a str of 100000 chars, None]"),
        ({"k": 1}, "got a map of 1 entries"),
    ],
    ids=["many-ints", "long-str", "map"],
)
async def test_bad_parameters_are_described_by_type_and_size(params: Any, said: str) -> None:
    async with bounded_worker({}) as worker:
        sock = await raw_socket(worker)
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(sock, msgpack.packb([0, 7, wire.DISPATCH, params]))
        ((_, msgid, error, _),) = await read(sock, 1)
        assert (msgid, error["kind"]) == (7, wire.BAD_REQUEST)
        assert said in error["message"]
        assert len(error["message"]) < 200
        close_all([sock])


@pytest.mark.parametrize("msgid", [-1, -(2**63), 2**32, 2**64 - 1])
@pytest.mark.parametrize(
    "request_of",
    [lambda msgid: msgpack.packb([0, msgid, wire.PING, []]), lambda msgid: dispatch(msgid, "echo")],
    ids=["ping", "dispatch"],
)
async def test_a_msgid_outside_32_bits_closes_the_connection_cleanly(
    msgid: int, request_of: Callable[[int], bytes]
) -> None:
    async with bounded_worker({}) as worker:
        sock = await raw_socket(worker)
        loop = asyncio.get_running_loop()
        # (wire.request writes unsigned msgids only)
        frame = request_of(msgid) if msgid >= 0 else msgpack.packb([0, msgid, wire.PING, []])
        await loop.sock_sendall(sock, frame)
        assert await closed_by_worker(sock)
        await worker.logged("ERROR", f"msgid {msgid} is not in 0..4294967295")
        assert not [line for line in worker.lines if "Traceback" in line]
        close_all([sock])
        # the largest msgid is answered
        sock = await raw_socket(worker)
        await loop.sock_sendall(sock, request_of(2**32 - 1))
        ((kind, answered, error, _),) = await read(sock, 1)
        assert (kind, answered, error) == (wire.RESPONSE, 2**32 - 1, None)
        close_all([sock])


# --- connection churn ----------------------------------------------------------------------


async def _dial_again_and_again(worker: Worker, seconds: float, *, violate: bool) -> int:
    """The attack: one connection after another for ``seconds``, each saying hello and then
    sending a msgid of -1 and waiting for the worker to close it (``violate``), or closing
    as soon as the worker's hello comes; returns how many the worker accepted."""
    loop = asyncio.get_running_loop()
    bad = msgpack.packb([0, -1, wire.PING, []])
    accepted = 0
    end = loop.time() + seconds
    while loop.time() < end:
        sock = socket.socket()
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, (worker.host, worker.port))
            await loop.sock_sendall(sock, wire.hello(1 << 30) + (bad if violate else b""))
            async with asyncio.timeout(max(0.0, end - loop.time())):
                while await loop.sock_recv(sock, 1 << 16) and not violate:
                    break  # the worker's hello: accepted
            accepted += 1
        except ConnectionError:
            accepted += 1
        except TimeoutError:
            break  # still waiting to be accepted when the attack ends
        finally:
            sock.close()
    return accepted


@pytest.mark.parametrize(
    ("violate", "limits", "said"),
    [
        (True, {"violation_burst": 5, "violation_rate": 2.0}, "violation_burst 5"),
        (False, {"accept_burst": 5, "accept_rate": 2.0}, "accept_burst 5"),
    ],
    ids=["breaking-the-protocol", "breaking-nothing"],
)
async def test_connections_dialled_again_and_again_pause_accepting(
    violate: bool, limits: dict[str, Any], said: str
) -> None:
    burst, rate, seconds = 5, 2.0, 3.0
    async with bounded_worker(limits) as worker, client(worker) as established:
        assert await established.dispatch(Task("echo", 0)) == 0
        attack = asyncio.ensure_future(_dial_again_and_again(worker, seconds, violate=violate))
        await worker.logged("WARNING", "stopped accepting connections for", said)
        # a connection open before the pause is served during it
        assert await established.dispatch(Task("echo", 1), timeout=WAIT) == 1
        # one dialled during the attack waits its turn in the backlog, and is served
        async with client(worker) as dialled:
            assert await dialled.dispatch(Task("echo", 2), timeout=WAIT) == 2
        accepted = await attack
        # about burst + rate a second; without the bound, thousands
        assert accepted <= burst + rate * seconds + 2, accepted
        assert await established.dispatch(Task("echo", 3), timeout=WAIT) == 3
        # no accept failed on the way (a server closed under an accept logs its traceback)
        assert not [line for line in worker.lines if "Traceback" in line], worker.lines


@pytest.mark.parametrize("paused", [False, True], ids=["at-start", "after-a-pause"])
async def test_a_burst_of_dials_waits_in_the_listen_backlog_none_for_a_syn_sent_again(
    paused: bool,
) -> None:
    # The listen backlog is accept_burst deep (1,000; 960 under this test's open file limit
    # of 4,096), also once accepting resumes after a pause (a server made anew on the socket
    # listens again). 500 clients dial while the worker's loop is blocked, so none is
    # accepted meanwhile: each connect completes in the kernel's queue. Under asyncio's
    # default backlog (100), 400 SYNs were dropped and their connects took up to 2.06 s
    # (TCP sends a SYN again after 1 s, then 2 s more): no timing finer than that is
    # asserted.
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip(f"the worker is given an open file limit of 4,096; the hard one is {hard}")
    limits: dict[str, Any] = {"violation_burst": 1, "violation_rate": 20.0} if paused else {}
    async with bounded_worker(limits, nofile=(4096, 4096)) as worker:
        loop = asyncio.get_running_loop()
        if paused:
            breaking = await raw_socket(worker)
            await loop.sock_sendall(breaking, msgpack.packb([0, -1, wire.PING, []]))
            assert await closed_by_worker(breaking)
            await worker.logged("WARNING", "stopped accepting connections for")
            # accepted once accepting resumed: the server made anew serves
            close_all([breaking, await raw_socket(worker)])
        blocker = await raw_socket(worker)
        await blocked(worker, blocker, 2.0)
        dialled = await asyncio.gather(*(dial(worker) for _ in range(500)))
        socks = [sock for sock, _ in dialled]
        took = sorted(seconds for _, seconds in dialled)
        assert took[-1] < 1.0, f"connects took {took[0]:.3f} to {took[-1]:.3f} s"
        # each is served once the loop is free: the worker's hello comes
        greetings = await asyncio.gather(*(read(sock, 1) for sock in socks))
        assert all(greeting[0][:2] == [wire.NOTIFICATION, wire.HELLO] for greeting in greetings)
        close_all([blocker, *socks])


@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "tls"])
async def test_a_worker_s_connections_have_tcp_keepalive(
    tls: bool, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # set once on the listening socket on Linux, whose accepted sockets inherit it
    certificates = make_certificates(tmp_path_factory.mktemp("tls")) if tls else None
    server = await serve_msgpack(
        {"echo": lambda payload: payload},
        "127.0.0.1:0",
        InProcessDiscovery("keepalive"),
        tls=certificates.serving() if certificates else None,
    )
    opened = MsgpackConnection(
        server.metadata, tls=certificates.dialling() if certificates else None
    )
    try:
        assert await opened.dispatch(Task("echo", 1)) == 1
        (link,) = server._state.links
        sock = link._transport.get_extra_info("socket")
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        if hasattr(socket, "TCP_KEEPIDLE"):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 10
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3
    finally:
        opened.close()
        await server.stop(0)


async def test_lines_logged_per_connection_closed_are_at_most_one_per_log_interval() -> None:
    attempts = 30
    async with bounded_worker({"log_interval": 2.0, "violation_burst": 1000}) as worker:
        socks = [await raw_socket(worker) for _ in range(attempts)]
        for sock in socks:
            await asyncio.get_running_loop().sock_sendall(
                sock, msgpack.packb([0, -1, wire.PING, []])
            )
        for sock in socks:
            assert await closed_by_worker(sock)
        close_all(socks)
        summary = await worker.logged("ERROR", "... and", "more like it within 2 s, the last:")
        full = [line for line in worker.lines if line.startswith("ERROR") and "... and" not in line]
        assert len(full) == 1, full
        assert "closing the connection of the client at 127.0.0.1:" in full[0]
        assert f"and {attempts - 1} more like it" in summary, summary
        assert "msgid -1 is not in 0..4294967295" in summary


# --- where limits are given -------------------------------------------------------------


def test_limits_are_checked_and_read_back_from_their_settings() -> None:
    limits = WorkerLimits(max_calls=7, idle_timeout=2.5)
    assert limits.settings() == ["max_calls=7", "idle_timeout=2.5"]
    assert WorkerLimits.parse(limits.settings()) == limits
    assert WorkerLimits.parse(["max-calls=7", "idle_timeout=2.5"]) == limits
    with pytest.raises(ValueError, match="NAME one of max_connections"):
        WorkerLimits.parse(["max_cals=7"])
    with pytest.raises(ValueError, match="'seven' is not a number"):
        WorkerLimits.parse(["max_calls=seven"])
    with pytest.raises(ValueError, match="max_calls must be an int >= 1, got 0") as caught:
        WorkerLimits(max_calls=0)
    assert not isinstance(caught.value, TypeError)  # the right type, a wrong value
    with pytest.raises(ValueError, match="hello_timeout must be a positive finite"):
        WorkerLimits(hello_timeout=float("inf"))
    churn = WorkerLimits(accept_rate=9.5, violation_burst=3, violation_rate=0.5, log_interval=60.0)
    assert churn.settings() == [
        "accept_rate=9.5",
        "violation_burst=3",
        "violation_rate=0.5",
        "log_interval=60.0",
    ]
    assert WorkerLimits.parse(["violation_rate=2", "log_interval=1"]) == WorkerLimits(
        violation_rate=2.0, log_interval=1.0
    )
    with pytest.raises(ValueError, match="violation_rate must be a positive finite number, got 0"):
        WorkerLimits(violation_rate=0)
    # a wrong type is also a TypeError
    for wrong_type in ({"max_calls": "7"}, {"max_calls": 7.0}, {"idle_timeout": True}):
        with pytest.raises(InvalidArgumentType, match=next(iter(wrong_type))):
            WorkerLimits(**wrong_type)


async def test_the_worker_command_takes_limits(tmp_path: Path) -> None:
    arguments = ("--namespace", "bounds", "--address", "127.0.0.1:0", "--limit", "max_calls=1")
    async with worker_process(tmp_path, *arguments) as process:
        opened = MsgpackConnection(await process.ready())
        try:
            sleeping = asyncio.ensure_future(opened.dispatch(Task("sleep", 30.0), timeout=60))
            refused: TransientRpcError | None = None
            async with asyncio.timeout(WAIT):
                while refused is None:  # until the sleep runs: then the worker is full
                    try:
                        await opened.dispatch(Task("echo", 1))
                    except TransientRpcError as error:
                        refused = error
            assert refused.reason == "busy"
            assert "1 dispatches already in flight on this worker" in str(refused)
            sleeping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sleeping
        finally:
            opened.close()
    async with worker_process(tmp_path, *arguments[:4], "--limit", "max_cals=1") as process:
        assert await process.exit_status() == 2
    churn = ("--limit", "violation_rate=2.5", "--limit", "log_interval=1")
    async with worker_process(tmp_path, *arguments[:4], *churn) as process:
        opened = MsgpackConnection(await process.ready())
        try:
            assert await opened.dispatch(Task("echo", 1)) == 1
        finally:
            opened.close()


async def test_a_local_pool_gives_its_workers_the_limits() -> None:
    limits = WorkerLimits(max_payload_items=3)
    async with LocalPool("bounds_worker:HANDLERS", workers=1, limits=limits) as pool:
        assert await pool.dispatch(Task("echo", [1, 2])) == [1, 2]
        with pytest.raises(WorkerError, match="more than 3 items"):
            await pool.dispatch(Task("echo", [1, 2, 3]))
    with pytest.raises(ValueError, match="limits apply to the msgpack transport"):
        LocalPool("bounds_worker:HANDLERS", transport="grpc", limits=limits)


# --- the backlog against a model ----------------------------------------------------------


async def _big(payload: Any) -> bytes:
    return b"x" * payload


@settings(max_examples=20)
@given(
    st.lists(
        st.tuples(st.sampled_from([1, 300_000]), st.integers(1, 40), st.booleans()),
        min_size=1,
        max_size=6,
    )
)
def test_every_answer_comes_once_in_order_however_the_client_reads(
    steps: list[tuple[int, int, bool]],
) -> None:
    # The model: a client pipelining calls that answer at once gets each answer once, in the
    # order it asked, whether it reads as it goes (the worker's socket drains) or not (the
    # worker pauses, holds what it read, and goes on when the client reads).
    async def scenario() -> tuple[list[int], list[int]]:
        server = await serve_msgpack({"big": _big}, "127.0.0.1:0", InProcessDiscovery("model"))
        try:
            where = wire.record_address(server.address)
            assert not isinstance(where, str)
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setblocking(False)
            loop = asyncio.get_running_loop()
            await loop.sock_connect(sock, where)
            await loop.sock_sendall(sock, wire.hello(1 << 30))
            decoder = wire.FrameDecoder(1 << 30)
            asked: list[int] = []
            answered: list[int] = []

            async def read_until(count: int) -> None:
                while len(answered) < count:
                    data = await loop.sock_recv(sock, 1 << 20)
                    assert data, "the worker closed the socket"
                    answered.extend(m[1] for m in decoder.feed(data) if m[0] == wire.RESPONSE)

            await read_until(0)
            for size, count, reads in steps:
                start = len(asked)
                asked.extend(range(start, start + count))
                frames = b"".join(dispatch(n, "big", size) for n in range(start, start + count))
                await loop.sock_sendall(sock, frames)
                if reads:
                    await read_until(len(asked))
            await read_until(len(asked))
            sock.close()
            return asked, answered
        finally:
            await server.stop(0)

    asked, answered = asyncio.run(asyncio.wait_for(scenario(), WAIT))
    assert answered == asked
