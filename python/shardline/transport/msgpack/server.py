"""`serve_msgpack`: a worker process's MessagePack-RPC server over TCP or a Unix socket,
announced through discovery while it runs."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import os
import socket
import ssl
import stat
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextvars import copy_context
from types import CoroutineType
from typing import Any, cast

from shardline._core import coroutine_send
from shardline.discovery.protocol import Discovery, DiscoveryPublisher
from shardline.host_port import join_host_port, split_host_port
from shardline.transport.deadlines import Deadlines
from shardline.transport.eager import Rest, start_eagerly
from shardline.transport.limits import (
    FRAME,
    HELLO,
    IDLE,
    Sweeper,
    WorkerLimits,
    connection_bounds,
    unread_bytes,
)
from shardline.transport.log_throttle import LogThrottle
from shardline.transport.msgpack import stream_wire, wire
from shardline.transport.msgpack.churn import AcceptGate
from shardline.transport.msgpack.stream_worker import StreamProducer, UnsendableItem
from shardline.transport.msgpack.tls_accept import TlsAccept
from shardline.transport.remote_errors import builtin_base, remote_traceback
from shardline.transport.serving import (
    AnnouncedServer,
    Handler,
    RetryElsewhere,
    check_handlers,
    claimed_publisher,
    handler_threads,
    is_stream_handler,
    publish_record,
    type_name,
)
from shardline.transport.task import (
    BAD_REQUEST,
    BAD_RESULT,
    MAX_MESSAGE_BYTES,
    UNKNOWN_HANDLER,
    MalformedMessage,
)
from shardline.transport.tls import TlsSettings, check_plaintext
from shardline.workers import WorkerMetadata

__all__ = ["MAX_IN_FLIGHT", "MsgpackWorkerServer", "serve_msgpack"]

logger = logging.getLogger("shardline.transport.msgpack.server")

MAX_IN_FLIGHT = 1024
"""The default bound on the dispatches running at once for one connection."""

_TRANSIENT_TYPE = "shardline.RetryElsewhere"

# How fast a client's clock may run slower than this side's, in seconds per second (100 ppm,
# a common crystal's tolerance): an offset learnt earlier is let grow at this rate, so drift
# never makes it too small (which would drop requests before their deadline).
_DRIFT = 1e-4

# Linux gives an accepted socket its listening socket's keepalive options (and asyncio's and
# uvloop's TCP_NODELAY): set once there, not at each connection's cost.
_INHERITS_KEEPALIVE = sys.platform == "linux"


class MsgpackWorkerServer(AnnouncedServer):
    """A running worker, made by :func:`serve_msgpack`. ``metadata`` is the record it
    published; ``address`` is where it serves (``msgpack+tcp://host:port`` or
    ``msgpack+tls://host:port`` with the port bound, or ``msgpack+unix:///path``).

    ``await stop()`` (or leaving ``async with``) withdraws the record, then stops serving: it
    stops accepting connections, answers new dispatches ``shutting_down`` (the caller retries
    elsewhere), gives the dispatches in flight ``grace`` seconds to finish, then cancels the
    rest (also answered ``shutting_down``), closes every connection and removes its Unix
    socket file, and shuts its handler threads down (a sync handler still running finishes
    in its thread; one still queued never starts). It is idempotent, and finishes even if the
    caller is cancelled.
    """

    def __init__(
        self,
        state: _State,
        metadata: WorkerMetadata,
        publisher: DiscoveryPublisher,
        socket_file: tuple[str, int, int] | None,
        grace: float,
    ) -> None:
        super().__init__(metadata, publisher, grace)
        self._state = state
        self._socket_file = socket_file

    @property
    def refused_connections(self) -> int:
        """Connections accepted and closed at once because ``max_connections`` were open
        (see :class:`~shardline.transport.limits.WorkerLimits`), since the server started."""
        return self._state.sweeper.refused

    @property
    def violations(self) -> int:
        """Connections closed for breaking the protocol, and TLS handshakes refused, since
        the server started: what ``WorkerLimits.violation_burst`` and ``violation_rate``
        count."""
        return self._state.gate.violations

    @property
    def accept_pauses(self) -> int:
        """How many times the server stopped accepting connections for a while, because
        connections came, or broke the protocol (:attr:`violations`), faster than its
        :class:`~shardline.transport.limits.WorkerLimits` allow (``accept_rate``,
        ``violation_rate``)."""
        return self._state.gate.pauses

    async def _close(self, grace: float) -> None:
        state = self._state
        state.stopping = True
        state.sweeper.stop()
        state.gate.close()
        for handshake in state.handshakes:
            handshake.cancel()
        calls = [call for link in state.links for call in link.calls.values()]
        if calls:
            await asyncio.wait(calls, timeout=grace)
        for link in list(state.links):
            link.cancel_all()
        calls = [call for link in state.links for call in link.calls.values()]
        if calls:
            await asyncio.wait(calls)
        for link in list(state.links):
            link.close()
        state.threads.shutdown(wait=False, cancel_futures=True)
        await state.gate.wait_closed()
        state.log.close()
        _remove_socket_file(self._socket_file)


async def serve_msgpack(
    handlers: Mapping[str, Handler],
    address: str,
    discovery: Discovery,
    *,
    uid: uuid.UUID | None = None,
    version: str = "",
    tags: Iterable[str] = frozenset(),
    extra: Mapping[str, Any] | None = None,
    max_frame_bytes: int = MAX_MESSAGE_BYTES,
    max_in_flight: int = MAX_IN_FLIGHT,
    grace: float = 5.0,
    threads: int | None = None,
    tls: TlsSettings | None = None,
    insecure: bool = False,
    limits: WorkerLimits | None = None,
) -> MsgpackWorkerServer:
    """Serves ``handlers`` over MessagePack-RPC at ``address`` and announces the worker through
    ``discovery``; returns once it serves and its record is published.

    ``handlers`` maps names to handlers. A handler takes the task's payload (a msgpack value)
    and returns a result msgpack can carry; a coroutine function is awaited on the server's
    loop, any other callable runs on the server's own ``threads`` threads
    (:data:`~shardline.transport.serving.DEFAULT_THREADS` by default), so it may block; a
    call that finds them all busy waits in their queue (unbounded: ``max_in_flight`` already
    bounds the calls a connection has running or queued), and one whose deadline passes or
    whose caller cancels while it waits there never starts. A handler that raises, a
    ``BaseException`` included (``SystemExit``, ``KeyboardInterrupt``: the worker lives on),
    makes the caller's ``dispatch`` raise :class:`~shardline.errors.WorkerError`, with the
    handler's traceback and built-in type (:mod:`~shardline.transport.remote_errors`), and logs
    it here; one that raises :class:`RetryElsewhere` makes it retry on another worker (error
    kind ``busy`` when ``overloaded``, else ``unavailable``). A request whose deadline passed
    before the worker read it (a stalled worker, resumed) is not started: it is answered
    ``deadline``, not started. An async handler still running at the caller's deadline is
    cancelled (answered ``deadline``), and so is one whose caller cancelled its dispatch.

    ``address`` is ``host:port`` (or ``msgpack+tcp://host:port``; an IPv6 host in brackets,
    ``[::1]:port``) for TCP, published as ``msgpack+tcp://host:port``; port 0 picks a free
    port, and the record carries the port bound. Subscribers dial the address as published, so
    ``host`` must be reachable by them (not ``0.0.0.0``). An absolute path (or
    ``unix:///path``, ``msgpack+unix:///path``) is a Unix socket, published as
    ``msgpack+unix:///path``; a socket file left there by a worker that died is replaced, a
    live one or any other file is an ``OSError``, and the file is removed at stop. An address
    in use is an ``OSError``; a malformed one a ``ValueError`` (a TCP one an
    :class:`~shardline.errors.InvalidAddress`). The socket file is made mode 0600: only this
    user can connect (serve it in a directory only this user can write to, so nobody can
    swap it).

    ``tls`` (a :class:`~shardline.transport.tls.TlsSettings` with ``cert`` and ``key``)
    serves TCP with TLS, published as ``msgpack+tls://host:port`` (``msgpack+tls://`` is also
    taken as ``address``); its ``ca`` requires client certificates signed by it (mutual
    TLS). A client whose handshake fails or takes over ``limits.handshake_timeout`` seconds
    is dropped before it can send anything, logged at WARNING with its address and why
    (throttled, see ``limits``), and counted as a violation. Without ``tls``, a TCP address
    that is not loopback (``127.0.0.1``, ``::1``, ``localhost``) is refused with
    ``ValueError`` unless ``insecure`` is true: anyone who can reach it could run every
    handler. A Unix socket is always plaintext (``tls`` with one is a ``ValueError``).

    Frames over ``max_frame_bytes`` are refused: a peer sending one is disconnected (logged
    as an error; other connections are served on), a result that would make one is answered
    ``bad_result``. At most ``max_in_flight`` dispatches run at once for one connection; more
    are answered ``busy`` (the caller retries elsewhere), and a connection whose answers the
    peer does not read is not read from, and has no call started, until it does.

    ``limits`` (a :class:`~shardline.transport.limits.WorkerLimits`; its defaults when None)
    bounds what clients may hold: connections, calls in flight on the whole worker, answer
    bytes queued unread, the time to say hello, to finish a message and to stay idle, the
    items of a message and of a payload, and connection churn: over a TCP address, the worker
    stops accepting for a while when connections come, or break the protocol, faster than
    ``limits`` allow (connections already open are served on), and the lines it logs per
    connection are throttled to one of each kind per ``log_interval``. Serving raises the
    process's soft limit on open files to its hard limit where the system allows (logged at
    INFO), and running out of file descriptors is logged at WARNING.

    The record is ``WorkerMetadata(uid or a new uuid4, address, os.getpid(), version, tags,
    extra)``, published as ``worker-added`` through ``discovery.publisher``. Stopping the
    server closes that publisher, withdrawing every record it still owns, but not one another
    publisher has since taken over. Give each server a publisher of its own: a publisher that
    is in use by a running server is refused with ``ValueError``.
    """
    if max_frame_bytes < 1:
        raise ValueError(f"max_frame_bytes must be positive, got {max_frame_bytes}")
    if max_in_flight < 1:
        raise ValueError(f"max_in_flight must be positive, got {max_in_flight}")
    if limits is None:
        limits = WorkerLimits()
    elif not isinstance(limits, WorkerLimits):
        raise ValueError(f"limits must be a WorkerLimits, got {type(limits).__name__}")
    where, tls_named = _serve_address(address)
    context = None
    if isinstance(where, str):
        if tls is not None:
            raise ValueError(
                f"a Unix socket is served in plaintext (it is reached from this machine only),"
                f" not with TLS: {address!r}"
            )
    elif tls is not None:
        context = tls.server_context()
    elif tls_named:
        raise ValueError(f"{address!r} names TLS: serve it with tls=TlsSettings(cert=..., key=...)")
    else:
        await check_plaintext(*where, insecure)
    checked = check_handlers(handlers)
    with claimed_publisher(discovery) as publisher:
        state = _State(
            checked,
            max_frame_bytes,
            max_in_flight,
            handler_threads(threads),
            limits,
            *connection_bounds(limits),
            asyncio.get_running_loop(),
        )
        try:
            published, socket_file = await _listen(state, where, context, address)
            try:
                metadata = await publish_record(
                    publisher, published, uid=uid, version=version, tags=tags, extra=extra
                )
            except BaseException:
                state.gate.close()
                await state.gate.wait_closed()
                _remove_socket_file(socket_file)
                raise
        except BaseException:
            state.threads.shutdown(wait=False)
            raise
    state.sweeper.start()
    logger.info("worker %s serves %s at %s", metadata.uid, sorted(handlers), metadata.address)
    return MsgpackWorkerServer(state, metadata, publisher, socket_file, grace)


async def _listen(
    state: _State, where: tuple[str, int] | str, context: ssl.SSLContext | None, address: str
) -> tuple[str, tuple[str, int, int] | None]:
    """Starts accepting at ``where`` (a Unix socket's path or a TCP ``(host, port)``), through
    the state's gate: the address to publish, and the socket file made (its path, device and
    inode; None over TCP)."""
    loop = asyncio.get_running_loop()
    if isinstance(where, str):
        await _clear_stale_socket(where)
        try:
            server = await loop.create_unix_server(
                lambda: _Link(state), where, backlog=state.backlog
            )
        except OSError as error:
            raise OSError(error.errno, f"cannot serve at {address}: {error}") from None
        state.gate.attach(server, None)
        os.chmod(where, 0o600)
        status = os.stat(where)
        return f"{wire.UNIX_SCHEME}{where}", (where, status.st_dev, status.st_ino)
    host, port = where
    factory = _accepting(state, context)
    try:
        server = await loop.create_server(
            factory, host, port, reuse_port=False, backlog=state.backlog
        )
    except OSError as error:
        raise OSError(error.errno, f"cannot serve at {address}: {error}") from None
    if _INHERITS_KEEPALIVE:
        for listening in server.sockets:
            wire.keep_alive_socket(listening)

    def reserve(sock: socket.socket) -> Awaitable[asyncio.Server]:
        # (listen() again, with the backlog: the server made would give it asyncio's 100)
        return loop.create_server(factory, sock=sock, backlog=state.backlog)

    state.gate.attach(server, reserve)
    bound = server.sockets[0].getsockname()[1] if port == 0 else port
    return wire.tcp_address(host, bound, tls=context is not None), None


def _accepting(state: _State, context: ssl.SSLContext | None) -> Callable[[], asyncio.Protocol]:
    """The protocol factory of a TCP server, called at each accept (counted by the server's
    :class:`~shardline.transport.msgpack.churn.AcceptGate`): a connection's :class:`_Link`,
    after its TLS handshake when ``context`` is given (a refused one is logged and is a
    violation)."""
    gate = state.gate
    if context is None:

        def plain() -> asyncio.Protocol:
            gate.accepted()
            return _Link(state)

        return plain

    def refused(peer: Any, error: BaseException) -> None:
        who = join_host_port(peer[0], peer[1]) if isinstance(peer, tuple) else "a client"
        state.log.log(
            logging.WARNING,
            "refused the TLS handshake of %s: %s",
            who,
            type_name(error) + f": {error}",
        )
        gate.violation()

    def secured() -> asyncio.Protocol:
        gate.accepted()
        return TlsAccept(
            context, lambda: _Link(state), refused, state.handshakes, state.limits.handshake_timeout
        )

    return secured


def _serve_address(address: str) -> tuple[tuple[str, int] | str, bool]:
    """Where to serve, and whether the address names TLS (``msgpack+tls://``)."""
    for prefix in (wire.UNIX_SCHEME, "unix://"):
        if address.startswith(prefix):
            address = address[len(prefix) :]
            break
    else:
        tls = address.startswith(wire.TLS_SCHEME)
        if address.startswith((wire.TCP_SCHEME, wire.TLS_SCHEME)):
            address = address.partition("://")[2]
        if not address.startswith("/"):
            return split_host_port(address, any_port=True), tls
    if not address.startswith("/") or "\0" in address:
        raise ValueError(f"a Unix socket's address must be an absolute path, got {address!r}")
    return address, False


async def _clear_stale_socket(path: str) -> None:
    """Removes a socket file nobody listens on (its worker died); leaves anything else."""
    try:
        status = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(status.st_mode):
        raise OSError(f"cannot serve at {path}: a file that is not a socket is there")
    try:
        _, writer = await asyncio.open_unix_connection(path)
    except (ConnectionRefusedError, FileNotFoundError):
        logger.info("removing the socket file %s its worker left behind", path)
        os.unlink(path)
        return
    writer.close()
    raise OSError(f"cannot serve at {path}: a live server listens there")


def _remove_socket_file(socket_file: tuple[str, int, int] | None) -> None:
    # Only the file this server made: a successor may already have replaced it.
    if socket_file is None:
        return
    path, device, inode = socket_file
    try:
        status = os.lstat(path)
        if (status.st_dev, status.st_ino) == (device, inode):
            os.unlink(path)
    except FileNotFoundError:
        pass


def _describe_params(params: Any) -> str:
    """Malformed params as an error shows them: each item described (see
    :func:`~shardline.transport.msgpack.wire.describe`) when they are a short array."""
    if isinstance(params, list) and len(params) <= 8:
        return "[" + ", ".join(map(wire.describe, params)) + "]"
    return wire.describe(params)


def _call_ended(call: tuple[int, asyncio.Task[None]]) -> bool:
    return call[1].done()


def _stopped(msgid: int, started: bool) -> bytes:
    """The answer to a call cancelled neither by its caller nor at its deadline: the worker
    is stopping. ``started``: whether its handler had started."""
    return wire.error(
        msgid,
        wire.SHUTTING_DOWN,
        "shardline.ShuttingDown",
        "the worker stopped" if started else "the worker is stopping",
        started=started,
    )


def _failed(msgid: int, name: str, error: BaseException, limit: int) -> bytes:
    """The answer to a call whose handler raised ``error`` (never a cancellation), with the
    error's built-in type and traceback (:mod:`~shardline.transport.remote_errors`), or
    without the traceback when that would not fit the client's ``limit``."""
    if isinstance(error, RetryElsewhere):
        kind = wire.BUSY if error.overloaded else wire.UNAVAILABLE
        return wire.error(msgid, kind, _TRANSIENT_TYPE, f"handler {name!r}: {error}")
    if isinstance(error, UnsendableItem):
        return wire.error(msgid, wire.BAD_RESULT, BAD_RESULT, str(error))
    if isinstance(error, Exception):
        logger.warning("handler %r raised", name, exc_info=error)
    else:
        # SystemExit, KeyboardInterrupt...: one call's failure, never the worker's end
        logger.error(
            "handler %r raised %s, which is no Exception: answered as that call's error,"
            " the worker goes on",
            name,
            type_name(error),
            exc_info=error,
        )
    remote_type, message, builtin = type_name(error), str(error), builtin_base(error)
    frame = wire.error(
        msgid,
        wire.HANDLER,
        remote_type,
        message,
        builtin=builtin,
        traceback=remote_traceback(error),
    )
    if len(frame) > limit:
        frame = wire.error(msgid, wire.HANDLER, remote_type, message, builtin=builtin)
    return frame


class _State:
    """What every connection of one server shares."""

    def __init__(
        self,
        handlers: dict[str, tuple[Handler, bool]],
        max_frame_bytes: int,
        max_in_flight: int,
        threads: concurrent.futures.ThreadPoolExecutor,
        limits: WorkerLimits,
        max_connections: int,
        backlog: int,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.handlers = handlers
        # those called with dispatch; the others, async generators, are called with stream
        self.dispatched = {
            name: entry for name, entry in handlers.items() if not is_stream_handler(entry[0])
        }
        self.threads = threads
        self.served = ", ".join(sorted(handlers)) or "none"
        self.max_frame_bytes = max_frame_bytes
        self.max_in_flight = max_in_flight
        self.limits = limits
        self.max_calls = limits.max_calls
        self.links: set[_Link] = set()
        self.stopping = False
        self.calls = 0  # dispatches in flight over every link
        self.sweeper = Sweeper(loop, limits, self.links, max_connections)
        self.backlog = backlog  # the listen backlog (see connection_bounds)
        # the lines a peer can cause one of per connection, and the bound on that churn
        self.log = LogThrottle(logger, loop, limits.log_interval)
        self.gate = AcceptGate(loop, limits, self.log)
        self.handshakes: set[asyncio.Task[None]] = set()  # TLS handshakes under way


class _Link(asyncio.Protocol):
    """One client connection: reads requests, runs each dispatch (as a task once it waits),
    writes answers."""

    def __init__(self, state: _State) -> None:
        self._state = state
        self._decoder = wire.FrameDecoder(
            state.max_frame_bytes,
            "requests",
            state.limits.max_message_items,
            state.limits.max_payload_items,
        )
        self._transport: asyncio.Transport | None = None
        self._peer = "a client"
        self._peer_limit: int | None = None
        self._answer_limit = 0  # no answer goes out before the client's hello
        # time.monotonic() here minus the client's clock, at most: where its deadlines fall
        # on this side's clock (None: the client sent no clock), and when it was last
        # tightened (see _place)
        self._clock_offset: float | None = None
        self._offset_at = 0.0
        self._dropped = 0  # requests expired before they were read, in the current read
        self.calls: dict[int, asyncio.Task[None]] = {}
        self._producers: dict[int, StreamProducer] = {}  # the streams among the calls
        # Calls the client cancelled: they end without an answer.
        self._abandoned: set[int] = set()
        # Calls cancelled at their deadline: they are answered `deadline`.
        self._expired: set[int] = set()
        self._deadlines: Deadlines[tuple[int, asyncio.Task[None]]] | None = None
        self._unsent: list[bytes] = []
        self._unsent_bytes = 0
        self._receiving = False
        self._loop = asyncio.get_running_loop()  # a protocol is made on its server's loop
        # What the limits watch: when the connection opened, the decoder's progress at the
        # last sweep, when the sweeps first saw it change and saw the unfinished message
        # (None: none; see overdue); whether the socket takes writes, the messages read but
        # not handled until it does, and its high-water mark.
        self._opened = self._heard = self._loop.time()
        self._progress = (0, 0, 0)
        self._frame_since: float | None = None
        self._paused = False
        self._backlog: list[Any] = []
        self._high_water = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self._state.sweeper.admit(transport):
            return
        # a stream transport, though uvloop's are not asyncio.Transport subclasses
        self._transport = cast(asyncio.Transport, transport)
        transport = self._transport
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):  # TCP: (host, port), and IPv6's flow and scope ids
            self._peer = f"the client at {join_host_port(peer[0], peer[1])}"
        elif peer:
            self._peer = f"the client at {peer}"
        if not _INHERITS_KEEPALIVE:
            wire.keep_alive(transport)
        self._high_water = transport.get_write_buffer_limits()[1]
        self._state.links.add(self)
        transport.write(wire.hello(self._state.max_frame_bytes, self._loop.time()))

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._backlog = []
        self._state.links.discard(self)
        if self._deadlines is not None:
            self._deadlines.close()
        # Nobody is left to answer: the calls of a client that went away are cancelled.
        self._abandoned.update(self.calls)
        for call in self.calls.values():
            call.cancel()

    def pause_writing(self) -> None:
        # The client does not read its answers: start no call and read no request of it
        # until it does (what was read waits in the backlog).
        self._paused = True
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        self._paused = False
        if self._backlog:
            self.data_received(b"")  # handles the backlog, up to a pause again
        transport = self._transport
        if transport is not None and not transport.is_closing() and not self._paused:
            transport.resume_reading()

    def overdue(self, now: float, limits: WorkerLimits) -> str | None:
        """Which timeout this connection is past at ``now``, if any: no hello, an unfinished
        message, or idle (no call in flight, nothing read). A connection whose client does not
        read its answers is not read from, so its message cannot finish nor is it idle.

        Implementation notes: a read stamps nothing (the loop's time and the decoder's state,
        looked up at every read, cost 8% of the worker's instructions for a small call): each
        sweep compares the decoder's progress with what the sweep before saw, and dates what
        changed since to ``now``, which is never before it happened. The unfinished message
        is the one seen before if no message was read since. So a timeout is enforced up to
        two sweep intervals late, never early."""
        if self._transport is None:
            return None
        progress = self._decoder.progress
        if progress != self._progress:
            _, read, unfinished = progress
            self._heard = now
            if not unfinished:
                self._frame_since = None
            elif self._frame_since is None or read != self._progress[1]:
                self._frame_since = now
            self._progress = progress
        if self._peer_limit is None and now - self._opened > limits.hello_timeout:
            return HELLO
        if self._paused or self._backlog:
            return None
        if self._frame_since is not None:
            return FRAME if now - self._frame_since > limits.frame_timeout else None
        if not self.calls and now - self._heard > limits.idle_timeout:
            return IDLE
        return None

    def expire(self, reason: str) -> None:
        """Closes the connection for the timeout ``reason`` (see :meth:`overdue`)."""
        if self._transport is not None:
            if reason == IDLE:
                self._transport.close()
            else:
                self._transport.abort()

    def unread(self) -> bool:
        """Whether bytes its client sent wait in its socket, not read yet (see
        :class:`~shardline.transport.limits.Sweeper`)."""
        return self._transport is not None and unread_bytes(self._transport) > 0

    def data_received(self, data: bytes) -> None:
        """Handles the messages ``data`` completes, after those of the backlog, until the
        socket stops taking writes: the rest wait in the backlog for :meth:`resume_writing`.

        Implementation notes: the whole of a read is in this one method, the write of its
        answers included (what :meth:`_flush` does, written out): a small dispatch costs the
        worker about 18,000 instructions, and each Python call this saves was 2-3% of them.
        :meth:`resume_writing` hands the backlog over as a read of no bytes."""
        try:
            messages = self._decoder.feed(data)
        except MalformedMessage as error:
            self._drop(f"{error}")
            return
        if self._backlog:
            if self._paused:
                self._backlog.extend(messages)
                return
            messages = self._backlog + messages
            self._backlog = []
        # the answers made while these messages are read go out in one write, at the end
        self._receiving = True
        try:
            unhandled = iter(messages)
            for message in unhandled:
                if self._transport is None or self._transport.is_closing():
                    return
                if self._unsent_bytes > self._high_water:
                    self._flush()  # the socket may stop taking writes (pause_writing)
                if self._paused:
                    self._backlog = [message, *unhandled]
                    return
                try:
                    if type(message) is tuple:
                        self._dispatch(*message)
                    else:
                        self._receive(message)
                except MalformedMessage as error:
                    self._drop(f"{error}")
                    return
        finally:
            self._receiving = False
            if self._dropped:
                logger.info(
                    "dropped %d requests of %s read after their deadline had passed",
                    self._dropped,
                    self._peer,
                )
                self._dropped = 0
            frames = self._unsent
            if frames:  # what _flush does, written out
                self._unsent = []
                self._unsent_bytes = 0
                transport = self._transport
                if transport is not None and not transport.is_closing():
                    transport.write(b"".join(frames))
                    if self._paused:
                        self._bound_queued(transport)

    def _drop(self, reason: str) -> None:
        """Closes the connection of a peer that broke the protocol: a violation."""
        self._state.log.log(logging.ERROR, "closing the connection of %s: %s", self._peer, reason)
        self._state.gate.violation()
        if self._transport is not None:
            self._transport.abort()

    def _receive(self, message: Any) -> None:
        if self._peer_limit is None:
            hello = wire.read_hello(message, self._peer)
            self._peer_limit = hello.max_frame_bytes
            self._answer_limit = min(self._state.max_frame_bytes, self._peer_limit)
            if hello.clock is not None:
                # Read now, not at the turn's start: an offset too small would expire every
                # later request early; one too large (the hello's transit) only drops late.
                self._offset_at = time.monotonic()
                self._clock_offset = self._offset_at - hello.clock
            return
        if not isinstance(message, list) or not message:
            raise MalformedMessage(
                f"a message is not a MessagePack-RPC array: {wire.describe(message)}"
            )
        kind = message[0]
        if kind == wire.REQUEST and len(message) == 4:
            _, msgid, method, params = message
            if isinstance(msgid, int) and not isinstance(msgid, bool):
                if not 0 <= msgid <= wire.MAX_MSGID:
                    raise MalformedMessage(f"msgid {msgid} is not in 0..{wire.MAX_MSGID}")
                self._request(msgid, method, params)
                return
        elif kind == wire.NOTIFICATION and len(message) == 3:
            _, method, params = message
            if method == wire.CANCEL:
                self._cancel(params)
            elif method == stream_wire.CREDIT:
                msgid, granted = stream_wire.read_credit(params)
                producer = self._producers.get(msgid)
                if producer is not None:  # (a stream that ended meanwhile needs none)
                    producer.grant(granted)
            elif method == wire.HELLO:
                raise MalformedMessage("a second hello")
            else:
                logger.debug("notification %s from %s ignored", wire.describe(method), self._peer)
            return
        raise MalformedMessage(f"not a request nor a notification: {wire.describe(message)}")

    def _request(self, msgid: int, method: Any, params: Any) -> None:
        if msgid in self.calls:
            raise MalformedMessage(f"msgid {msgid} is already in flight")
        if method == wire.PING:
            self._write(wire.result(msgid, None))
            return
        if method == stream_wire.STREAM:
            self._stream(msgid, params)
            return
        if method != wire.DISPATCH:
            self._answer_error(
                msgid, wire.BAD_REQUEST, BAD_REQUEST, f"no method {wire.describe(method)}"
            )
            return
        if not (
            isinstance(params, list)
            and len(params) in (3, 4)
            and isinstance(params[0], str)
            and isinstance(params[1], bytes)
        ):
            self._answer_error(
                msgid,
                wire.BAD_REQUEST,
                BAD_REQUEST,
                "dispatch takes [handler, payload bin, timeout, deadline], got"
                f" {_describe_params(params)}",
            )
            return
        name, payload, timeout = params[:3]
        try:
            seconds = wire.read_timeout(timeout)
            deadline = wire.read_deadline(params[3]) if len(params) == 4 else None
        except MalformedMessage as error:
            self._answer_error(msgid, wire.BAD_REQUEST, BAD_REQUEST, str(error))
            return
        try:
            argument = wire.unpack_value(
                payload, "the payload", self._state.limits.max_payload_items
            )
        except MalformedMessage as error:
            self._dispatch(msgid, name, None, seconds, deadline, error)
            return
        self._dispatch(msgid, name, argument, seconds, deadline)

    def _dispatch(
        self,
        msgid: int,
        name: str,
        argument: Any,
        seconds: float | None,
        deadline: float | None,
        unreadable: MalformedMessage | None = None,
    ) -> None:
        """A well-formed dispatch request, its payload read (``argument``), or not
        (``unreadable`` says why); ``seconds`` its timeout, ``deadline`` its deadline on the
        client's clock. The decoder hands these over already taken apart, the payload read;
        those whose payload it cannot read come through :meth:`_request`."""
        calls = self.calls
        state = self._state
        entry = state.dispatched.get(name)
        # Every refusal of _admit's, looked at in one test: the common call passes them all,
        # and _admit answers one that does not (it tells them apart, in its order).
        if (
            entry is None
            or msgid in calls
            or state.stopping
            or len(calls) >= state.max_in_flight
            or state.calls >= state.max_calls
        ):
            refused = self._admit(msgid, name, seconds, deadline, stream=False)
            assert refused is None
            return
        if deadline is not None and self._clock_offset is not None:
            # (stream given by position: as a keyword it costs ~220 instructions more)
            seconds = self._place(msgid, name, deadline, seconds, False)
            if seconds is None:
                return
        handler, is_async = entry
        if unreadable is not None:
            self._answer_error(
                msgid, wire.BAD_REQUEST, BAD_REQUEST, f"handler {name!r}: {unreadable}"
            )
            return
        # The handler's own coroutine up to its first wait, run here, in a copy of the context
        # as a task would: a handler that answers at once (most of them) costs no task, no
        # coroutine of this class and no turn of the loop; one that waits goes on as a task
        # (_run) from where it waits. An exception of the first step is answered here as _run
        # would answer it.
        context = copy_context()
        loop = self._loop
        queued = None if is_async else state.threads.submit(context.run, handler, argument)
        try:
            # (the call itself may raise, a function marked a coroutine function: even a
            # StopIteration is its error then, never its result, as inside a coroutine)
            handling = (
                context.run(handler, argument)
                if queued is None
                else asyncio.wrap_future(queued, loop=loop)
            )
            if type(handling) is CoroutineType:
                # (its return told apart without a StopIteration)
                returned, value = context.run(coroutine_send, handling, None)
                call = (
                    None
                    if returned
                    else loop.create_task(
                        self._run(msgid, name, Rest(handling, value), seconds), context=context
                    )
                )
            else:  # a sync handler's future, or another awaitable: awaited by _run
                call = start_eagerly(loop, self._run(msgid, name, handling, seconds, queued))
                if call is None:
                    return  # answered already: it did not wait
        except asyncio.CancelledError:
            self._write(_stopped(msgid, True))
            return
        except BaseException as error:
            # (a BaseException ends here as any error: raised out of data_received, it
            # would end the event loop, and the worker with it)
            self._write(_failed(msgid, name, error, self._answer_limit))
            return
        if call is None:
            # The common answer, written here (what _result and _write do, without their
            # calls): a plain result within the limit, sent at the end of data_received,
            # which is where _dispatch runs.
            frame = wire.answer(msgid, value)
            if frame is not None and (size := len(frame)) <= self._answer_limit:
                self._unsent.append(frame)
                self._unsent_bytes += size
            else:
                self._write(self._result(msgid, name, value))
            return
        self._track(msgid, call, seconds)

    def _stream(self, msgid: int, params: Any) -> None:
        """A stream request: refused, or answered at once, as a dispatch is, for the same
        reasons; else its handler's generator runs as a task (:class:`StreamProducer`) that
        sends its items, counted in ``calls`` as a dispatch, answered by :meth:`_run`."""
        try:
            request = stream_wire.read_stream_request(params)
        except MalformedMessage as error:
            self._answer_error(msgid, wire.BAD_REQUEST, BAD_REQUEST, str(error))
            return
        name = request.handler
        admitted = self._admit(msgid, name, request.timeout, request.deadline, stream=True)
        if admitted is None:
            return
        (handler, _), seconds = admitted
        try:
            argument = wire.unpack_value(
                request.payload, "the payload", self._state.limits.max_payload_items
            )
        except MalformedMessage as error:
            self._answer_error(msgid, wire.BAD_REQUEST, BAD_REQUEST, f"handler {name!r}: {error}")
            return
        context = copy_context()
        try:
            generator = context.run(handler, argument)
        except BaseException as error:
            self._write(_failed(msgid, name, error, self._answer_limit))
            return
        producer = StreamProducer(
            msgid, name, generator, request.window, self._write, self._answer_limit
        )
        call = self._loop.create_task(
            self._run(msgid, name, producer.run(), seconds), context=context
        )
        self._producers[msgid] = producer
        self._track(msgid, call, seconds)

    def _track(self, msgid: int, call: asyncio.Task[None], seconds: float | None) -> None:
        """Counts ``call`` (a dispatch or a stream gone on as a task) in flight until it ends,
        and ends it at its deadline, ``seconds`` from now, if it has one."""
        self.calls[msgid] = call
        self._state.calls += 1
        call.add_done_callback(functools.partial(self._finished, msgid))
        if seconds is not None:
            loop = self._loop
            if self._deadlines is None:
                self._deadlines = Deadlines(loop, self._expire, _call_ended)
            self._deadlines.add(loop.time() + seconds, (msgid, call))

    def _admit(
        self, msgid: int, name: str, seconds: float | None, deadline: float | None, *, stream: bool
    ) -> tuple[tuple[Handler, bool], float | None] | None:
        """Whether a call of handler ``name`` (a stream when ``stream``, else a dispatch) may
        start: None once it is answered here (the worker is stopping, the caller's
        ``deadline``, on its clock, passed before the worker read the request, too many calls
        are in flight, no handler has that name, or the handler is not of the call's kind);
        else the handler's entry and the seconds the call has (``seconds``, its timeout,
        tightened to its deadline)."""
        calls = self.calls
        if msgid in calls:
            raise MalformedMessage(f"msgid {msgid} is already in flight")
        state = self._state
        if state.stopping:
            self._write(_stopped(msgid, False))
            return None
        if deadline is not None and self._clock_offset is not None:
            seconds = self._place(msgid, name, deadline, seconds, stream)
            if seconds is None:
                return None
        if len(calls) >= state.max_in_flight or state.calls >= state.max_calls:
            self._answer_error(
                msgid,
                wire.BUSY,
                "shardline.Busy",
                f"{state.max_in_flight} dispatches already in flight on this connection"
                if len(calls) >= state.max_in_flight
                else f"{state.max_calls} dispatches already in flight on this worker",
            )
            return None
        entry = state.handlers.get(name)
        if entry is None:
            self._answer_error(
                msgid,
                wire.UNKNOWN_HANDLER,
                UNKNOWN_HANDLER,
                f"no handler named {name!r} (this worker serves: {state.served})",
            )
            return None
        if stream == (name in state.dispatched):
            self._answer_error(
                msgid,
                wire.BAD_REQUEST,
                BAD_REQUEST,
                f"handler {name!r} is not an async generator function: it answers dispatch(),"
                " it cannot stream"
                if stream
                else f"handler {name!r} is an async generator: its items are read with"
                " stream(), not dispatch()",
            )
            return None
        return entry, seconds

    def _place(
        self, msgid: int, name: str, deadline: float, seconds: float | None, stream: bool
    ) -> float | None:
        """The seconds call ``msgid`` (of handler ``name``, a stream when ``stream``) has:
        ``seconds``, its timeout, tightened to ``deadline`` (on the client's clock); None once
        it is answered ``deadline``, not started, because that passed before the worker read
        the request. Tightens the clock offset with what the request tells.

        Implementation notes: the client wrote the request at ``deadline - seconds`` on its
        clock (its deadline is its clock plus the timeout it sends; a negative one is sent as
        0, which only moves that instant earlier), so ``now - (deadline - seconds)`` is the
        offset plus this request's transit and wait: never below the offset. The smallest
        such sample (the hello's included) is the tightest bound, and a stall only makes
        samples larger. The bound kept is let grow at :data:`_DRIFT`, so a client's clock
        running slower than this side's never makes it too small."""
        now = time.monotonic()
        assert self._clock_offset is not None
        offset = self._clock_offset + (now - self._offset_at) * _DRIFT
        if seconds is not None:
            offset = min(offset, now - (deadline - seconds))
        self._clock_offset = offset
        self._offset_at = now
        left = deadline + offset - now
        if left <= 0:
            # its caller gave up while it waited to be read (this worker stalled)
            self._dropped += 1
            self._write(
                wire.error(
                    msgid,
                    wire.DEADLINE,
                    "shardline.Deadline",
                    f"handler {name!r}: the caller's deadline passed {-left:.3f} s before"
                    f" the worker read the {'stream ' if stream else ''}request; not started",
                    started=False,
                )
            )
            return None
        return left if seconds is None or left < seconds else seconds

    def _cancel(self, params: Any) -> None:
        if not (isinstance(params, list) and len(params) == 1 and isinstance(params[0], int)):
            raise MalformedMessage(f"{wire.CANCEL} takes [msgid], got {_describe_params(params)}")
        call = self.calls.get(params[0])
        if call is not None:
            self._abandoned.add(params[0])
            call.cancel()

    def cancel_all(self) -> None:
        """Cancels the calls in flight; each is answered ``shutting_down``."""
        for call in self.calls.values():
            call.cancel()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    async def _run(
        self,
        msgid: int,
        name: str,
        handling: Awaitable[Any],
        timeout: float | None,
        queued: concurrent.futures.Future[Any] | None = None,
    ) -> None:
        """Answers the call once ``handling`` (the handler's run, or the rest of it) ends;
        ``queued`` is a sync handler's job on the server's threads."""
        try:
            result = await handling
        except asyncio.CancelledError:
            if msgid in self._abandoned:
                return
            # a sync handler still queued never runs: cancel() is true for it alone
            started = queued is None or not queued.cancel()
            if msgid in self._expired:
                frame = wire.error(
                    msgid,
                    wire.DEADLINE,
                    "shardline.Deadline",
                    f"handler {name!r}: the caller's deadline passed"
                    + ("" if started else " while the call waited for a thread; not started"),
                    started=started,
                )
            else:
                frame = _stopped(msgid, started)
        except BaseException as error:
            # SystemExit, KeyboardInterrupt... too: a task that ends with one of them takes
            # the event loop down with it
            frame = _failed(msgid, name, error, self._answer_limit)
        else:
            frame = (
                wire.result(msgid, None)  # a stream's end
                if result is None and msgid in self._producers
                else self._result(msgid, name, result)
            )
        self._write(frame)

    def _expire(self, call: tuple[int, asyncio.Task[None]]) -> None:
        msgid, task = call
        self._expired.add(msgid)
        task.cancel()

    def _finished(self, msgid: int, call: asyncio.Task[None]) -> None:
        # A done callback, not a finally: a task cancelled before its first step never runs.
        del self.calls[msgid]
        self._state.calls -= 1
        self._producers.pop(msgid, None)
        self._abandoned.discard(msgid)
        self._expired.discard(msgid)

    def _result(self, msgid: int, name: str, result: Any) -> bytes:
        """The answer carrying ``result``, or ``bad_result`` when it cannot be carried."""
        frame = wire.answer(msgid, result)  # a plain value, packed in one call
        if frame is None:
            try:
                frame = wire.result(msgid, wire.pack_value(result, "the result", name))
            except (TypeError, ValueError) as error:
                return wire.error(msgid, wire.BAD_RESULT, BAD_RESULT, str(error))
        limit = self._answer_limit
        if len(frame) > limit:
            return wire.error(
                msgid,
                wire.BAD_RESULT,
                BAD_RESULT,
                f"handler {name!r}: the answer is {len(frame)} bytes, over the limit of {limit}",
            )
        return frame

    def _answer_error(self, msgid: int, kind: str, type_name: str, message: str) -> None:
        self._write(wire.error(msgid, kind, type_name, message))

    def _write(self, frame: bytes) -> None:
        # Answers ready in one turn of the loop go out in one write: a syscall per answer
        # was the worker's largest cost with many calls in flight. Those made while a read
        # is handled are written at its end (data_received), without waiting for a turn.
        if not self._unsent and not self._receiving:
            self._loop.call_soon(self._flush)
        self._unsent.append(frame)
        self._unsent_bytes += len(frame)
        if self._unsent_bytes > self._high_water and not self._receiving:
            # large answers go out at once: a turn's worth of them held here is unbounded
            self._flush()

    def _flush(self) -> None:
        frames, self._unsent = self._unsent, []
        self._unsent_bytes = 0
        transport = self._transport
        # (a turn's flush finds nothing when data_received wrote its answers first)
        if frames and transport is not None and not transport.is_closing():
            transport.write(b"".join(frames))
            if self._paused:
                self._bound_queued(transport)

    def _bound_queued(self, transport: asyncio.Transport) -> None:
        """Closes the connection once more answer bytes than ``max_queued_bytes`` wait for a
        client that does not read them (paused, the answers of calls that were already
        running still come)."""
        queued = transport.get_write_buffer_size()
        if queued > self._state.limits.max_queued_bytes:
            logger.warning(
                "closing the connection of %s: %d answer bytes it does not read are"
                " queued, over max_queued_bytes %d",
                self._peer,
                queued,
                self._state.limits.max_queued_bytes,
            )
            transport.abort()
