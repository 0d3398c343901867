"""`MsgpackConnection`: how a `WorkerProxy` reaches a worker served by `serve_msgpack`."""

from __future__ import annotations

import asyncio
import logging
import ssl
import weakref
from typing import Any, cast

from shardline.errors import RpcError, RpcReason, TransientRpcError
from shardline.transport.deadlines import Deadlines
from shardline.transport.loop_shared import LoopShared, Registries, release
from shardline.transport.msgpack import stream_wire, wire
from shardline.transport.msgpack.stream import MsgpackStream, StreamFeed, answer_error
from shardline.transport.remote_errors import worker_error
from shardline.transport.task import BAD_RESULT, MAX_MESSAGE_BYTES, MalformedMessage, Task
from shardline.transport.tls import TlsSettings
from shardline.workers import WorkerMetadata

__all__ = ["MsgpackConnection"]

logger = logging.getLogger("shardline.transport.msgpack.connection")

# What makes two connections share a socket: the address and every setting.
_Key = tuple[str, int, float, float, float, TlsSettings | None]


class MsgpackConnection:
    """A connection to the worker at ``metadata.address`` (``msgpack+tcp://host:port``,
    ``msgpack+tls://host:port`` or ``msgpack+unix:///path``), for
    ``WorkerProxy(connect=...)``; any other address is a ``ValueError``.

    A ``msgpack+tls://`` worker is dialled with TLS, by ``tls`` (a
    :class:`~shardline.transport.tls.TlsSettings`; default ``TlsSettings()``: the worker's
    certificate verified against the system's trust store, no client certificate): the
    worker's certificate must chain to ``tls.ca`` and name the address's host (or
    ``tls.server_hostname``), and ``tls.cert`` is presented to a worker that requires client
    certificates. The other addresses are dialled in plaintext, whatever ``tls``.

    Must be made on a running event loop and used on that loop. ``max_frame_bytes`` bounds the
    requests sent and the answers accepted; ``connect_timeout`` (seconds) bounds dialling the
    worker and its hello. While calls are in flight and nothing has come from the worker for
    ``ping_interval`` seconds, it is pinged; no answer within ``ping_timeout`` more fails the
    calls (``TransientRpcError``) and drops the socket. Use
    ``functools.partial(MsgpackConnection, ...)`` to give these to a proxy.

    ``await dispatch(task, timeout=None)`` runs the :class:`Task` on the worker and returns its
    handler's result. ``timeout`` (seconds) is the call's deadline, which the worker sees too:
    it does not start the call once the deadline has passed (a worker that stalled, then
    resumed, drops what its callers gave up on), and cancels an async handler at it.
    Failures, as :class:`WorkerProxy` expects them, each with whether the task may have
    started on the worker (``sent``, see :class:`~shardline.errors.RpcError`):

    - ``TransientRpcError`` (the worker stays pooled; the proxy tries another), not sent: the
      worker is unreachable (refused, no socket file, ``connect_timeout`` passed, the TLS
      handshake failed or the worker refused this side's certificate, a worker that serves
      TLS dialled in plaintext: each said in the message), the
      deadline passed before the request was written or the worker answered that it dropped
      the request unstarted, the worker answered ``busy``, ``unavailable`` (its handler raised
      ``RetryElsewhere``) or ``shutting_down`` for a call it never started, or this
      connection was closed;
    - ``TransientRpcError``, sent: the connection broke with the call written (the worker
      died or closed it: every call in flight on it fails at once), the worker does not
      answer pings, the deadline passed with the call written (on this side's timer, or
      answered ``deadline`` by the worker after the handler started), or the worker answered
      ``shutting_down`` for a call it cancelled after its handler started (a worker that does
      not say whether it had started, one of the first release, counts as started);
    - ``RpcError`` (the proxy evicts the worker): the worker speaks another protocol version,
      or sent what this protocol does not allow (unreadable bytes, a frame over
      ``max_frame_bytes``: every call in flight on the socket fails so, naming the limit);
      sent when the call had been written;
    - :class:`~shardline.errors.WorkerError` (propagates; the worker stays pooled; for a
      handler's built-in exception type, also an instance of it, see ``WorkerError``): the
      handler raised, the worker has no handler of that name, or it could not read the payload
      (``shardline.BadRequest``) or carry the result (``shardline.BadResult``, also when this
      side cannot read it);
    - ``TypeError`` / ``ValueError`` before anything is sent: ``task`` is not a ``Task`` with a
      str handler, its payload is not msgpack, or the request would exceed ``max_frame_bytes``
      or the limit the worker announced.

    Every ``RpcError`` it raises has its ``address`` (``metadata.address``) and ``reason`` set
    (see :class:`~shardline.errors.RpcError`): ``"cannot-connect"``, ``"connection-lost"``,
    ``"unresponsive"``, ``"deadline"``, ``"busy"``, ``"unavailable"``, ``"shutting-down"`` or
    ``"closed"`` for a ``TransientRpcError``; ``"protocol-version"``, ``"oversized"`` or
    ``"protocol"`` for the others.

    Cancelling ``dispatch`` (or its deadline passing) sends the worker a cancel for the call.

    ``await stream(task, timeout=None, window=DEFAULT_WINDOW)`` starts a streamed call of an
    async generator handler and returns its items as a
    :class:`~shardline.transport.msgpack.stream.MsgpackStream` once the request is written
    (the errors before that are ``dispatch``'s); see that class for flow control, the
    deadline, and leaving early.

    ``close()`` (idempotent, synchronous) says this connection is no longer needed; calls in
    flight through it finish normally. A connection that is garbage-collected unclosed is
    closed then.

    Implementation notes: connections with the same address and settings on the same loop
    share one socket, counted by reference, multiplexing their calls by msgid. The socket is
    dialled by the first dispatch; one that broke is dialled again by the next dispatch, so a
    worker restarted at the same address is reached again. When the last connection closes,
    the socket is closed once its last call in flight has finished.
    """

    def __init__(
        self,
        metadata: WorkerMetadata,
        *,
        max_frame_bytes: int = MAX_MESSAGE_BYTES,
        connect_timeout: float = 5.0,
        ping_interval: float = 5.0,
        ping_timeout: float = 10.0,
        tls: TlsSettings | None = None,
    ) -> None:
        for name, value in (
            ("max_frame_bytes", max_frame_bytes),
            ("connect_timeout", connect_timeout),
            ("ping_interval", ping_interval),
            ("ping_timeout", ping_timeout),
        ):
            if not value > 0:
                raise ValueError(f"{name} must be positive, got {value!r}")
        wire.record_address(metadata.address)
        if metadata.address.startswith(wire.TLS_SCHEME):
            if tls is None:
                tls = TlsSettings()
            elif not isinstance(tls, TlsSettings):
                raise TypeError(f"tls must be a TlsSettings, not {type(tls).__name__}")
            tls.client_context()  # bad files are said here, not at the first dispatch
        else:
            tls = None
        self.metadata = metadata
        self._max_frame_bytes = max_frame_bytes
        key = (metadata.address, max_frame_bytes, connect_timeout, ping_interval, ping_timeout, tls)
        self._shared = _registries.acquire(key)
        self._closed = False  # read on every dispatch: cheaper than the finalizer's `alive`
        self._finalizer = weakref.finalize(self, release, self._shared)
        # At exit the loop, and the sockets on it, are gone already.
        self._finalizer.atexit = False

    def __repr__(self) -> str:
        state = ", closed" if self._closed else ""
        return f"MsgpackConnection({self.metadata.uid}, {self.metadata.address!r}{state})"

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Releases this connection's share of its socket; later calls are no-ops."""
        self._closed = True
        self._finalizer()

    async def dispatch(self, task: Task, *, timeout: float | None = None) -> Any:
        """Runs ``task`` on the worker; see the class docstring for the errors."""
        if not isinstance(task, Task):
            raise TypeError(
                f"a MsgpackConnection dispatches Task objects, not {type(task).__name__}"
            )
        handler = task.handler
        if not isinstance(handler, str):
            raise TypeError(f"a task's handler is a str, not {type(handler).__name__}")
        if self._closed:
            address = self.metadata.address
            raise TransientRpcError(
                f"the connection to the worker at {address} is closed",
                reason="closed",
                address=address,
            )
        shared = self._shared
        link = shared.link
        # most calls go out in one step; any other is packed, checked and sent step by step
        sent = None if link is None else link.call(handler, task.payload, timeout)
        if sent is None:
            payload = wire.pack_value(task.payload, "the payload", handler)
            if not handler.isascii():
                _check_handler(handler)
            if len(payload) > self._max_frame_bytes:
                raise ValueError(
                    f"the task for handler {handler!r} is over {len(payload)} bytes,"
                    f" over the limit of {self._max_frame_bytes}"
                )
        shared.in_flight += 1
        try:
            if sent is None:
                sent = shared.send(handler, payload, timeout)
                if sent is None:
                    sent = await shared.send_when_ready(handler, payload, timeout)
            link, msgid, answer = sent
            try:
                return await answer
            except asyncio.CancelledError:
                link.cancel(msgid)
                raise
            except _Expired:
                link.cancel(msgid)
                raise shared.deadline_passed(timeout, sent=True) from None
            except _Failed as failed:
                failure = failed.failure
        finally:
            shared.end_call()
        raise answer_error(self.metadata.address, handler, failure)

    async def stream(
        self, task: Task, *, timeout: float | None = None, window: int = stream_wire.DEFAULT_WINDOW
    ) -> MsgpackStream:
        """Starts ``task`` as a streamed call; see the class docstring.

        ``window`` (1 to :data:`~shardline.transport.msgpack.stream_wire.MAX_WINDOW`) is how
        many items the worker may send ahead of the caller's reading. Raises before anything
        is sent what ``dispatch`` raises then (``TypeError``, ``ValueError``, and
        ``TransientRpcError`` not sent: unreachable, closed, the deadline passed while the
        socket was dialled or full); every later failure comes out of the iterator."""
        if not isinstance(task, Task):
            raise TypeError(f"a MsgpackConnection streams Task objects, not {type(task).__name__}")
        handler = task.handler
        if not isinstance(handler, str):
            raise TypeError(f"a task's handler is a str, not {type(handler).__name__}")
        if type(window) is not int or not 1 <= window <= stream_wire.MAX_WINDOW:
            raise ValueError(
                f"window must be an int from 1 to {stream_wire.MAX_WINDOW}, not {window!r}"
            )
        address = self.metadata.address
        if self._closed:
            raise TransientRpcError(
                f"the connection to the worker at {address} is closed",
                reason="closed",
                address=address,
            )
        payload = wire.pack_value(task.payload, "the payload", handler)
        _check_handler(handler)
        shared = self._shared
        loop = shared.loop
        deadline = None if timeout is None else loop.time() + timeout
        link = shared.link
        if link is None or link.broken or link.paused:
            scope = asyncio.timeout_at(deadline)
            try:
                async with scope:
                    link = await shared._ready()
                    if link.paused:
                        await link.writable()
            except TimeoutError:
                if scope.expired():
                    raise shared.deadline_passed(timeout, sent=False) from None
                raise
        msgid, feed = link.open_stream(handler, payload, deadline, window)
        shared.in_flight += 1
        return MsgpackStream(
            feed,
            msgid,
            window,
            deadline,
            address,
            link.grant,
            link.cancel_stream,
            shared.end_call,
            loop,
        )


def _check_handler(handler: str) -> None:
    try:
        handler.encode()
    except UnicodeEncodeError:
        raise ValueError(
            f"a task's handler must be Unicode text, not {handler!r} (a surrogate code point)"
        ) from None


class _Shared(LoopShared):
    """The socket (a :class:`_Link`) that every connection with one key uses, dialled again
    after it broke (see :class:`LoopShared`)."""

    def __init__(
        self, registry: dict[_Key, _Shared], key: _Key, loop: asyncio.AbstractEventLoop
    ) -> None:
        super().__init__(registry, key, loop)
        self.address, self.max_frame_bytes, self.connect_timeout, ping_interval, ping_timeout = key[
            :5
        ]
        self.tls = key[5]
        self.where = wire.record_address(self.address)
        self.ping = (ping_interval, ping_timeout)
        self.link: _Link | None = None
        self._dialling: asyncio.Task[_Link] | None = None
        self.deadlines: Deadlines[asyncio.Future[Any]] = Deadlines(
            loop, _expire, asyncio.Future.done
        )

    def _close(self) -> None:
        self.deadlines.close()
        if self._dialling is not None:
            self._dialling.cancel()
        if self.link is not None:
            logger.debug("closing the socket to %s", self.address)
            self.link.close()
            self.link = None

    # A call is sent by send() when the socket takes writes (no coroutine of its own: it is
    # awaited by MsgpackConnection.dispatch), else by send_when_ready().

    def send(self, handler: str, payload: bytes, timeout: float | None) -> _Sent | None:
        """Sends the call on a socket that takes writes now: its link, msgid and the future
        of its answer (the result's value; :class:`_Failed` for an error answer or a result
        this side cannot read, :class:`_Expired` at its deadline); None if the socket is being
        dialled or full."""
        link = self.link
        if link is None or link.broken or link.paused:
            return None
        if timeout is None:
            return link.send(handler, payload, None, None)
        return link.send(handler, payload, max(timeout, 0.0), self.loop.time() + timeout)

    async def send_when_ready(self, handler: str, payload: bytes, timeout: float | None) -> _Sent:
        """:meth:`send`, once the socket is dialled and takes writes; the wait counts
        towards the deadline."""
        loop = self.loop
        deadline = None if timeout is None else loop.time() + timeout
        scope = asyncio.timeout_at(deadline)
        try:
            async with scope:
                link = await self._ready()
                if link.paused:
                    await link.writable()
        except TimeoutError:
            if scope.expired():
                raise self.deadline_passed(timeout, sent=False) from None
            raise
        if deadline is None:
            return link.send(handler, payload, None, None)
        return link.send(handler, payload, max(deadline - loop.time(), 0.0), deadline)

    def deadline_passed(self, timeout: float | None, *, sent: bool) -> TransientRpcError:
        when = "with the call sent" if sent else "before the call was sent"
        return TransientRpcError(
            f"worker at {self.address}: deadline: {timeout} s passed {when}",
            reason="deadline",
            address=self.address,
            sent=sent,
        )

    async def _ready(self) -> _Link:
        link = self.link
        if link is not None and not link.broken:
            return link
        if self._dialling is None:
            self._dialling = self.loop.create_task(self._dial())
            self._dialling.add_done_callback(self._dialled)
        # Shielded: one caller giving up must not abort the dial the others wait for.
        return await asyncio.shield(self._dialling)

    def _dialled(self, dialling: asyncio.Task[_Link]) -> None:
        self._dialling = None
        if not dialling.cancelled() and dialling.exception() is None:
            self.link = dialling.result()

    async def _dial(self) -> _Link:
        where = self.where
        loop = self.loop
        link: _Link | None = None
        try:
            async with asyncio.timeout(self.connect_timeout):
                if isinstance(where, str):
                    _, link = await loop.create_unix_connection(lambda: _Link(self), where)
                elif self.tls is None:
                    _, link = await loop.create_connection(lambda: _Link(self), *where)
                else:
                    _, link = await loop.create_connection(
                        lambda: _Link(self),
                        *where,
                        ssl=self.tls.client_context(),
                        server_hostname=self.tls.server_hostname or where[0],
                    )
                await link.greeted
        except BaseException as error:
            if link is not None:
                link.close()
            if isinstance(error, TimeoutError):
                raise TransientRpcError(
                    f"worker at {self.address}: no connection and hello within"
                    f" {self.connect_timeout} s",
                    reason="cannot-connect",
                    address=self.address,
                ) from None
            if isinstance(error, OSError):
                what = (
                    "TLS handshake failed" if isinstance(error, ssl.SSLError) else "cannot connect"
                )
                raise TransientRpcError(
                    f"worker at {self.address}: {what}: {error}",
                    reason="cannot-connect",
                    address=self.address,
                ) from None
            raise
        return link


class _Link(asyncio.Protocol):
    """One socket to a worker: writes requests, matches answers to calls by msgid."""

    def __init__(self, shared: _Shared) -> None:
        self._shared = shared
        self._loop = shared.loop
        self._decoder = wire.FrameDecoder(shared.max_frame_bytes, "answers")
        self._transport: asyncio.Transport | None = None
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._streams: dict[int, StreamFeed] = {}
        self._next_msgid = 0
        # the largest request: this side's limit and the worker's, once its hello came
        self._limit = 0
        # whether the worker reads a request's deadline (its hello announced its clock)
        self._deadlines = False
        self.greeted: asyncio.Future[None] = self._loop.create_future()
        self.broken = False
        self.paused = False
        self._writable: asyncio.Future[None] | None = None
        self._last_heard = self._loop.time()
        self._ping_sent: float | None = None
        self._ping_timer: asyncio.TimerHandle | None = None
        self._unsent: list[bytes] = []

    # --- the protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport, though uvloop's are not asyncio.Transport subclasses
        self._transport = cast(asyncio.Transport, transport)
        transport = self._transport
        wire.keep_alive(transport)
        # the clock this side's deadlines are on (loop.time()), so the worker can place them
        transport.write(wire.hello(self._shared.max_frame_bytes, self._loop.time()))

    def connection_lost(self, exc: Exception | None) -> None:
        cause = f": {exc}" if exc is not None else ""
        shared = self._shared
        address = shared.address
        if not self.greeted.done():
            # a dial that failed: say the likely cause, which the worker cannot tell us
            if shared.tls is not None:
                cause += (
                    " (after the TLS handshake, before the worker's hello: a worker that requires"
                    " client certificates ends the connection so when it refuses this side's,"
                    " or none was given)"
                )
            elif not isinstance(shared.where, str):
                cause += (
                    " (before the worker's hello: a worker served with TLS ends a plaintext"
                    " connection so; its record would say msgpack+tls://)"
                )
        self._fail(
            TransientRpcError(
                f"worker at {address}: connection lost{cause}",
                reason="connection-lost",
                address=address,
                sent=True,
            )
        )

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    def data_received(self, data: bytes) -> None:
        self._last_heard = self._loop.time()
        self._ping_sent = None
        calls = self._calls
        try:
            for message in self._decoder.feed(data):
                if type(message) is tuple:
                    # a successful answer (msgid, value), taken apart and read by the decoder
                    answer = calls.pop(message[0], None)
                    if answer is not None and not answer.done():
                        answer.set_result(message[1])
                else:
                    self._receive(message)
        except wire.FrameTooLarge as error:
            address = self._shared.address
            self._violated(
                RpcError(
                    f"worker at {address} sent {error}",
                    reason="oversized",
                    address=address,
                    sent=True,
                )
            )
        except MalformedMessage as error:
            address = self._shared.address
            reason: RpcReason = (
                "protocol-version" if isinstance(error, wire.VersionMismatch) else "protocol"
            )
            self._violated(
                RpcError(f"worker at {address}: {error}", reason=reason, address=address, sent=True)
            )

    # --- what dispatch uses ---------------------------------------------------------------

    async def writable(self) -> None:
        """Returns once the socket takes writes again (or broke)."""
        if self._writable is None:
            self._writable = self._loop.create_future()
        await asyncio.shield(self._writable)

    def call(self, handler: str, value: Any, timeout: float | None) -> _Sent | None:
        """Sends the call at once if it is a common one: on a socket that takes writes, a
        plain payload packed in the request by the core (:func:`wire.call`), a request within
        the limit; returns what :meth:`_Shared.send` returns. None otherwise, having sent
        nothing: the caller packs and checks the call step by step (:meth:`send`)."""
        if self.broken or self.paused:
            return None
        msgid = self._next_msgid
        if timeout is None:
            deadline = None
            frame = wire.call(msgid, handler, value, None)
        else:
            deadline = self._loop.time() + timeout
            frame = wire.call(msgid, handler, value, timeout, deadline if self._deadlines else None)
        if frame is None or len(frame) > self._limit:
            return None
        # What _start does, written out: a call fewer on every call.
        self._next_msgid = (msgid + 1) & 0xFFFFFFFF
        answer = self._loop.create_future()
        calls = self._calls
        if calls or self._unsent:
            self._write(frame)
        else:  # an idle socket: no request to batch with, so none to wait a turn for
            cast(asyncio.Transport, self._transport).write(frame)
        calls[msgid] = answer
        if self._ping_timer is None:
            self._last_heard = self._loop.time()
            self._ping_timer = self._loop.call_later(self._shared.ping[0], self._check_alive)
        if deadline is not None:
            self._shared.deadlines.add(deadline, answer)
        return self, msgid, answer

    def send(
        self, handler: str, payload: bytes, timeout: float | None, deadline: float | None
    ) -> _Sent:
        """Writes the request (``timeout``: the seconds left to its ``deadline``, a
        ``loop.time()``; both None for none); returns what :meth:`_Shared.send` returns."""
        if self.broken or self._transport is None:
            address = self._shared.address
            raise TransientRpcError(
                f"worker at {address}: connection lost", reason="connection-lost", address=address
            )
        msgid = self._next_msgid
        frame = wire.request(
            msgid, handler, payload, timeout, deadline if self._deadlines else None
        )
        if len(frame) > self._limit:
            self._next_msgid = (msgid + 1) & 0xFFFFFFFF
            raise ValueError(
                f"the task for handler {handler!r} is {len(frame)} bytes, over the limit of"
                f" {self._limit} (this side's or the worker's at {self._shared.address})"
            )
        return self._start(msgid, frame, deadline)

    def _start(self, msgid: int, frame: bytes, deadline: float | None) -> _Sent:
        """Writes ``frame``, the request of call ``msgid``; registers its answer and
        ``deadline``. (:meth:`call` does the same, written out.)"""
        self._next_msgid = (msgid + 1) & 0xFFFFFFFF
        answer = self._loop.create_future()
        calls = self._calls
        if calls or self._unsent:
            self._write(frame)
        else:  # an idle socket: no request to batch with, so none to wait a turn for
            cast(asyncio.Transport, self._transport).write(frame)
        calls[msgid] = answer
        if self._ping_timer is None:
            self._last_heard = self._loop.time()
            self._ping_timer = self._loop.call_later(self._shared.ping[0], self._check_alive)
        if deadline is not None:
            self._shared.deadlines.add(deadline, answer)
        return self, msgid, answer

    def open_stream(
        self, handler: str, payload: bytes, deadline: float | None, window: int
    ) -> tuple[int, StreamFeed]:
        """Writes a stream request (``deadline`` a ``loop.time()``, None for none); returns
        its msgid and the feed its items and end will come to."""
        if self.broken or self._transport is None:
            address = self._shared.address
            raise TransientRpcError(
                f"worker at {address}: connection lost", reason="connection-lost", address=address
            )
        msgid = self._next_msgid
        timeout = None if deadline is None else max(deadline - self._loop.time(), 0.0)
        frame = stream_wire.stream_request(
            msgid, handler, payload, timeout, deadline if self._deadlines else None, window
        )
        self._next_msgid = (msgid + 1) & 0xFFFFFFFF
        if len(frame) > self._limit:
            raise ValueError(
                f"the task for handler {handler!r} is {len(frame)} bytes, over the limit of"
                f" {self._limit} (this side's or the worker's at {self._shared.address})"
            )
        feed = self._streams[msgid] = StreamFeed(handler, window)
        self._write(frame)
        if self._ping_timer is None:
            self._last_heard = self._loop.time()
            self._ping_timer = self._loop.call_later(self._shared.ping[0], self._check_alive)
        return msgid, feed

    def grant(self, msgid: int, items: int) -> None:
        """Lets the worker send ``items`` more of stream ``msgid``."""
        feed = self._streams.get(msgid)
        if feed is not None and not self.broken:
            feed.allowed += items
            self._write(stream_wire.credit(msgid, items))

    def cancel_stream(self, msgid: int) -> None:
        """Forgets the stream and tells the worker to cancel it."""
        if self._streams.pop(msgid, None) is not None and not self.broken:
            self._write(wire.cancel(msgid))

    def cancel(self, msgid: int) -> None:
        """Forgets the call and tells the worker to cancel it."""
        if self._calls.pop(msgid, None) is not None and not self.broken:
            self._write(wire.cancel(msgid))

    def close(self) -> None:
        self.broken = True
        if self._transport is not None:
            self._transport.close()

    def _write(self, frame: bytes) -> None:
        # Requests made in one turn of the loop go out in one write (a syscall per request
        # was the client's largest cost with many calls in flight), in the order they came.
        if not self._unsent:
            self._loop.call_soon(self._flush)
        self._unsent.append(frame)

    def _flush(self) -> None:
        frames, self._unsent = self._unsent, []
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(b"".join(frames))

    # --- inside -------------------------------------------------------------------------

    def _receive(self, message: Any) -> None:
        if not self.greeted.done():
            hello = wire.read_hello(message, f"the worker at {self._shared.address}")
            self._limit = min(self._shared.max_frame_bytes, hello.max_frame_bytes)
            self._deadlines = hello.clock is not None
            self.greeted.set_result(None)
            return
        if not (isinstance(message, list) and len(message) == 4 and message[0] == wire.RESPONSE):
            if isinstance(message, list) and len(message) == 3 and message[0] == wire.NOTIFICATION:
                if message[1] == stream_wire.ITEM:
                    self._item(message[2])
                return  # a notification this version does not know: ignored
            raise MalformedMessage(f"not a response: {wire.describe(message)}")
        _, msgid, error, result = message
        if self._streams and type(msgid) is int and msgid in self._streams:
            self._stream_ended(self._streams.pop(msgid), error, result)
            return
        answer = self._calls.pop(msgid, None) if isinstance(msgid, int) else None
        if answer is None:
            return  # a call cancelled or timed out here, or a ping
        if answer.done():
            return
        if error is None and isinstance(result, bytes):
            try:
                value = wire.unpack_value(result, "the result")
            except MalformedMessage as unreadable:
                answer.set_exception(
                    _Failed(
                        wire.ErrorAnswer(
                            wire.BAD_RESULT, BAD_RESULT, str(unreadable), True, None, None
                        )
                    )
                )
            else:
                answer.set_result(value)
            return
        try:
            failure = wire.read_error(error)
        except MalformedMessage as unreadable:
            address = self._shared.address
            answer.set_exception(
                RpcError(
                    f"worker at {address}: {unreadable}",
                    reason="protocol",
                    address=address,
                    sent=True,
                )
            )
        else:
            answer.set_exception(_Failed(failure))

    def _item(self, params: Any) -> None:
        msgid, packed = stream_wire.read_item(params)
        feed = self._streams.get(msgid)
        if feed is None:
            return  # a stream cancelled here: its late items are dropped
        if feed.allowed <= 0:
            raise MalformedMessage(f"an item of stream {msgid} past the credit granted")
        try:
            value = wire.unpack_value(packed, "an item")
        except MalformedMessage as unreadable:
            # that stream's failure alone, as an unreadable result is that call's
            del self._streams[msgid]
            self._write(wire.cancel(msgid))
            address = self._shared.address
            feed.finish(
                worker_error(BAD_RESULT, str(unreadable), handler=feed.handler, address=address)
            )
            return
        feed.push(value)

    def _stream_ended(self, feed: StreamFeed, error: Any, result: Any) -> None:
        """The answer that ends a stream: nil (its end) or an error."""
        address = self._shared.address
        if error is None:
            if result is not None:
                raise MalformedMessage(f"a stream's end carries a result: {result!r:.100}")
            feed.end()
            return
        try:
            failure = wire.read_error(error)
        except MalformedMessage as unreadable:
            feed.finish(
                RpcError(
                    f"worker at {address}: {unreadable}",
                    reason="protocol",
                    address=address,
                    sent=True,
                )
            )
            return
        feed.finish(answer_error(address, feed.handler, failure))

    def _check_alive(self) -> None:
        self._ping_timer = None
        if self.broken or not (self._calls or self._streams) or self._transport is None:
            return
        interval, patience = self._shared.ping
        now = self._loop.time()
        if self._ping_sent is not None:
            if now - self._ping_sent >= patience:
                address = self._shared.address
                self._violated(
                    TransientRpcError(
                        f"worker at {address}: no answer to a ping in {patience} s",
                        reason="unresponsive",
                        address=address,
                        sent=True,
                    ),
                    log=logging.WARNING,
                )
                return
            delay = self._ping_sent + patience - now
        elif now - self._last_heard >= interval:
            self._ping_sent = now
            self._write(wire.ping(self._next_msgid))
            self._next_msgid = (self._next_msgid + 1) & 0xFFFFFFFF
            delay = patience
        else:
            delay = self._last_heard + interval - now
        self._ping_timer = self._loop.call_later(delay, self._check_alive)

    def _violated(self, error: RpcError, log: int = logging.ERROR) -> None:
        logger.log(log, "dropping the socket: %s", error)
        self._fail(error)
        if self._transport is not None:
            self._transport.abort()

    def _fail(self, error: RpcError) -> None:
        """Fails the calls in flight with ``error`` (``sent``: they were written), and the
        dial with a copy of it not sent, if the hello had not come yet."""
        self.broken = True
        if self._ping_timer is not None:
            self._ping_timer.cancel()
            self._ping_timer = None
        if not self.greeted.done():
            self.greeted.set_exception(
                type(error)(str(error), reason=error.reason, address=error.address)
            )
            # Retrieved here too: the dial that waited on it may have been abandoned.
            self.greeted.exception()
        calls, self._calls = self._calls, {}
        for answer in calls.values():
            if not answer.done():
                answer.set_exception(error)
        streams, self._streams = self._streams, {}
        for feed in streams.values():
            feed.finish(error)
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)


_registries: Registries[_Key, _Shared] = Registries(_Shared)

_Sent = tuple[_Link, int, "asyncio.Future[Any]"]
"""A call on its way: the link it went on, its msgid, the future of its answer."""


class _Expired(Exception):
    """Set on a call's answer when its deadline passes before the worker answered."""


class _Failed(Exception):
    """Set on a call's answer when the worker answered an error, or a result this side cannot
    read: ``failure``, what :func:`~shardline.transport.msgpack.stream.answer_error` makes the
    caller's error of."""

    def __init__(self, failure: wire.ErrorAnswer) -> None:
        super().__init__(failure)
        self.failure = failure


def _expire(answer: asyncio.Future[Any]) -> None:
    answer.set_exception(_Expired())
