"""``Pipeline``: one connection to an instance on which the client's ``execute`` calls are sent
without waiting for each other's answers (pipelining of PostgreSQL's extended query protocol).

Implementation notes:
    Each query is its own Bind, Execute and Sync. The queries that callers hand the pipeline
    in one turn of the event loop go out in one write, so the server's backend reads them in
    one wake-up instead of sleeping and waking once per query; the backend still runs each
    to its Sync, which ends the implicit transaction of that query alone (PostgreSQL's
    protocol, "Pipelining" and "Extended Query": after an error the backend discards
    messages up to the next Sync, answers ReadyForQuery there and goes on with the next
    query), so one query's error rolls back only that query and the others run as if sent
    apart. The answers come back in the order sent and end at each query's ReadyForQuery.

    The connection is opened by asyncpg (authentication, settings) and then taken over: its
    transport is given this module's protocol, so asyncpg's ``Connection`` is only kept to be
    terminated at the end. A statement is prepared once per pipeline (Parse and Describe of a
    named statement, a pipelined query of its own) and sent with binary parameters encoded
    here, only for the parameter types and Python values where the encoding is exactly what
    asyncpg's default codecs send (``_ENCODERS``, the value's class tested exactly); any
    other query, argument or statement the server refuses to prepare is not pipelined
    (:data:`NOT_PIPELINED`), and the client runs it on a pooled connection as before. Rows a
    statement returns are read past, not decoded: ``execute`` returns the command's status.

    A query that leaves the session in a transaction block, or in a ``client_encoding``
    other than UTF8, closes the connection once answered (the queries sent behind it fail as
    below). A caller that stops waiting (cancelled) leaves its query in the pipeline: it was sent,
    its answer is read and dropped, and the others are unaffected. When the connection is
    lost, every query sent and not answered raises the driver's
    ``ConnectionDoesNotExistError``, as a query on a pooled connection does: it may have run,
    and is not sent again. :meth:`Pipeline.expire` closes the connection when its oldest
    query passed its deadline; that query raises ``TimeoutError``, the ones behind it the
    connection error.

    The pipeline is bounded, so that a crowd of callers cannot pile their queries on one
    backend, nor their bytes in the client: at most ``limit`` queries are sent and unanswered
    at once (prepares included), and nothing new is sent while the transport has paused
    writing (the server not reading: ``pause_writing`` until ``resume_writing``). A query
    that finds it full or paused is not pipelined (:data:`NOT_PIPELINED`) and goes the pooled
    way, bounded there by the pool's size and ``acquire_timeout`` as without pipelining.
    The queries accepted before the pause are in the transport's buffer (the flow control
    pauses only inside a write), which the transport writes once the socket is writable
    again: at most ``limit`` queries' bytes.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import struct
from collections.abc import Callable
from typing import Any, Final

from asyncpg.exceptions import ConnectionDoesNotExistError, PostgresError

__all__ = ["NOT_PIPELINED", "Pipeline"]

logger = logging.getLogger("shardline.picodata")

NOT_PIPELINED: Final[Any] = object()
"""What :meth:`Pipeline.execute` returns for a query it does not send."""

MAX_STATEMENTS = 256
"""The most statements one pipeline prepares; a query beyond them is not pipelined."""

_INT2 = struct.Struct("!ih")
_INT4 = struct.Struct("!ii")
_INT8 = struct.Struct("!iq")
_FLOAT8 = struct.Struct("!id")
_LENGTH = struct.Struct("!i")
_NULL = b"\xff\xff\xff\xff"


def _int(packer: struct.Struct, low: int, high: int) -> Callable[[Any], bytes | None]:
    def encode(value: Any) -> bytes | None:
        if value.__class__ is int and low <= value < high:
            return packer.pack(packer.size - 4, value)
        return None

    return encode


def _text(value: Any) -> bytes | None:
    if value.__class__ is str:
        try:
            data = value.encode()
        except UnicodeEncodeError:  # a lone surrogate: asyncpg's DataError, pooled
            return None
        return _LENGTH.pack(len(data)) + data
    return None


def _bytea(value: Any) -> bytes | None:
    if value.__class__ is bytes:
        return _LENGTH.pack(len(value)) + value
    return None


def _bool(value: Any) -> bytes | None:
    if value.__class__ is bool:
        return b"\x00\x00\x00\x01\x01" if value else b"\x00\x00\x00\x01\x00"
    return None


def _float8(value: Any) -> bytes | None:
    if value.__class__ is float:
        return _FLOAT8.pack(8, value)
    return None


_ENCODERS: Final[dict[int, Callable[[Any], bytes | None]]] = {
    16: _bool,  # bool
    17: _bytea,  # bytea
    20: _int(_INT8, -(2**63), 2**63),  # int8
    21: _int(_INT2, -(2**15), 2**15),  # int2
    23: _int(_INT4, -(2**31), 2**31),  # int4
    25: _text,  # text
    701: _float8,  # float8
    1043: _text,  # varchar
}
"""Parameter type OID -> the binary parameter (length and value) asyncpg's default codec
sends for a value of the one Python class accepted here, or None for any other value."""

_SYNC = b"S\x00\x00\x00\x04"
_EXECUTE = b"E\x00\x00\x00\x09\x00\x00\x00\x00\x00"  # unnamed portal, all rows


def _message(kind: bytes, body: bytes) -> bytes:
    return kind + _LENGTH.pack(len(body) + 4) + body


class _Statement:
    __slots__ = ("bind_head", "encoders", "query")

    def __init__(self, name: bytes, encoders: list[Callable[[Any], bytes | None]], query: str):
        n = len(encoders)
        # unnamed portal, the statement, every parameter binary, then the parameters
        self.bind_head = b"\x00" + name + b"\x00" + struct.pack("!hhh", 1, 1, n)
        self.encoders = encoders
        self.query = query

    def bind(self, args: tuple[Any, ...]) -> bytes | None:
        """Bind, Execute and Sync of ``args``, or None if one cannot be encoded here."""
        encoders = self.encoders
        if len(args) != len(encoders):
            return None
        parts = [self.bind_head]
        for encode, value in zip(encoders, args, strict=True):
            if value is None:
                parts.append(_NULL)
                continue
            data = encode(value)
            if data is None:
                return None
            parts.append(data)
        parts.append(b"\x00\x00")  # results in text: read past, never decoded
        body = b"".join(parts)
        return b"B" + _LENGTH.pack(len(body) + 4) + body + _EXECUTE + _SYNC


class _Sent:
    """One query sent, until its ReadyForQuery."""

    __slots__ = ("error", "future", "parameters", "query", "tag", "tick")

    def __init__(self, future: asyncio.Future[Any], query: str, tick: int | None) -> None:
        self.future = future
        self.query = query
        self.tick = tick
        self.tag = b""
        self.error: dict[str, str] | None = None
        self.parameters: list[int] | None = None


class _Wire(asyncio.Protocol):
    """The protocol of the taken-over transport: reads the answers, one query's at a time,
    and passes on the transport's flow control."""

    def __init__(self, pipeline: Pipeline) -> None:
        self._pipeline = pipeline
        self._buffer = bytearray()

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        sent = self._pipeline.sent
        end = len(buffer)
        at = 0
        while end - at >= 5:
            length = int.from_bytes(buffer[at + 1 : at + 5], "big")
            stop = at + 1 + length
            if stop > end:
                break
            kind = buffer[at]
            if kind == 0x5A:  # ReadyForQuery
                query = sent.popleft()
                self._pipeline.answered(query, buffer[at + 5])
            elif kind == 0x43:  # CommandComplete
                sent[0].tag = bytes(buffer[at + 5 : stop - 1])
            elif kind == 0x45:  # ErrorResponse
                fields = {}
                for field in bytes(buffer[at + 5 : stop - 1]).split(b"\x00"):
                    if field:
                        fields[chr(field[0])] = field[1:].decode(errors="replace")
                if sent:
                    sent[0].error = fields
                else:  # a FATAL error outside any query (e.g. the server shutting down)
                    logger.info("pipelined connection: %s", fields.get("M", fields))
            elif kind == 0x53 and bytes(buffer[at + 5 : stop]).startswith(b"client_encoding\x00"):
                # ParameterStatus: a query changed the encoding the pipeline writes text in
                self._pipeline.encoding = bytes(buffer[at + 21 : stop - 1]).decode()
            elif kind == 0x74:  # ParameterDescription
                count = int.from_bytes(buffer[at + 5 : at + 7], "big")
                sent[0].parameters = [
                    int.from_bytes(buffer[at + 7 + 4 * i : at + 11 + 4 * i], "big")
                    for i in range(count)
                ]
            # others (ParseComplete, BindComplete, DataRow, RowDescription, NoData,
            # notices, parameter statuses, notifications) carry nothing execute returns
            at = stop
        del buffer[:at]

    def pause_writing(self) -> None:
        self._pipeline.paused = True

    def resume_writing(self) -> None:
        self._pipeline.paused = False

    def connection_lost(self, exc: Exception | None) -> None:
        # lost before the pipeline closed it itself (deadline, session state): dropped
        self._pipeline.lost(exc, dropped=not self._pipeline.closed)


class Pipeline:
    """Queries to one instance over one connection, sent without waiting for each other (see
    the module). ``connection`` is an asyncpg connection, idle and outside a transaction,
    that the pipeline owns from now on (it terminates it when closed or broken).

    :meth:`execute` runs ``execute(query, *args)`` and returns its status, as asyncpg's
    ``Connection.execute`` would, or :data:`NOT_PIPELINED` without sending anything;
    ``sent`` holds the queries sent and not yet answered, the oldest first (read-only), never
    more than ``limit`` of them. Raises ``ValueError`` for a ``limit`` that is not a positive
    int.

    The client's ``limit`` is its pool's ``size`` (:func:`~shardline.picodata.connect`'s
    ``pool_size``, 16 by default): a backend runs its queries one at a time, so a full
    pipeline queues on the instance as much work as the pool's connections carry at once,
    and a query beyond it waits no longer pooled than it would have without pipelining.
    """

    def __init__(self, connection: Any, limit: int) -> None:
        if limit.__class__ is not int or limit < 1:
            raise ValueError(f"limit must be a positive int, got {limit!r}")
        self.limit = limit
        """The most queries sent and not answered at once (read-only)."""
        self._connection = connection
        self._loop = asyncio.get_running_loop()
        self._transport = connection._transport
        self._statements: dict[str, _Statement | asyncio.Future[_Statement | None] | None] = {}
        self._names = itertools.count(1)
        self._out: list[bytes] = []
        self._flushing = False
        self._drained: asyncio.Event | None = None
        self.sent: collections.deque[_Sent] = collections.deque()
        self.closed = False
        self.queries = 0
        """Queries sent (prepares not counted)."""
        self.writes = 0
        """Writes to the socket: ``queries / writes`` is the mean batch."""
        self.encoding = "UTF8"
        """The session's ``client_encoding``: the pipeline closes if a query changes it."""
        self.paused = False
        """True while the transport has paused writing: nothing new is sent (read-only)."""
        self.refused = 0
        """Queries not pipelined because the pipeline was full or paused."""
        self._drop_unreported = False
        self._transport.set_protocol(_Wire(self))
        self._transport.resume_reading()

    async def execute(self, query: str, args: tuple[Any, ...], tick: int | None) -> Any:
        """Sends ``query`` with ``args`` and returns its command status (``"INSERT 0 1"``), or
        :data:`NOT_PIPELINED`. Raises the server's error as asyncpg's exception for its
        SQLSTATE, ``ConnectionDoesNotExistError`` if the connection was lost before the
        answer, ``TimeoutError`` if :meth:`expire` closed it with this query the oldest
        unanswered. ``tick`` is the client's deadline tick when it was sent."""
        if self.closed:
            return NOT_PIPELINED
        if self.paused or len(self.sent) >= self.limit:
            self.refused += 1
            return NOT_PIPELINED
        statement = self._statements.get(query, NOT_PIPELINED)
        if statement is NOT_PIPELINED:
            statement = await self._prepare(query, tick)
        elif statement.__class__ is not _Statement and statement is not None:
            statement = await asyncio.shield(statement)
        if statement is None or self.closed:
            return NOT_PIPELINED
        message = statement.bind(args)
        if message is None:
            return NOT_PIPELINED
        if self.paused or len(self.sent) >= self.limit:  # filled while it was prepared
            self.refused += 1
            return NOT_PIPELINED
        future = self._send(message, query, tick)
        self.queries += 1
        return await future

    def expire(self, tick: int) -> bool:
        """Closes the connection if its oldest unanswered query was sent at ``tick`` or
        before: True if it did. The queries sent at ``tick`` or before raise
        ``TimeoutError``, the later ones the connection error."""
        sent = self.sent
        if self.closed or not sent or sent[0].tick is None or sent[0].tick > tick:
            return False
        while sent and sent[0].tick is not None and sent[0].tick <= tick:
            query = sent.popleft()
            if not query.future.done():
                query.future.set_exception(
                    TimeoutError(f"pipelined query {query.query!r} passed its deadline")
                )
        self._connection.terminate()
        self.lost(None, dropped=False)
        return True

    def forget_statements(self) -> None:
        """Prepares every statement anew at its next use (after a stale-statement error)."""
        self._statements = {
            query: statement
            for query, statement in self._statements.items()
            if statement.__class__ is asyncio.Future
        }

    async def aclose(self) -> None:
        """Sends nothing more, waits for the answers of the queries sent, closes the
        connection."""
        if not self.closed:
            self.closed = True
            if self.sent:
                self._drained = asyncio.Event()
                await self._drained.wait()
        self._connection.terminate()

    # internals

    def _send(self, message: bytes, query: str, tick: int | None) -> asyncio.Future[Any]:
        future = self._loop.create_future()
        self.sent.append(_Sent(future, query, tick))
        self._out.append(message)
        if not self._flushing:
            self._flushing = True
            self._loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        self._flushing = False
        out, self._out = self._out, []
        if out and not self._transport.is_closing():
            self._transport.write(b"".join(out))
            self.writes += 1

    async def _prepare(self, query: str, tick: int | None) -> _Statement | None:
        """Parses ``query`` as a named statement and learns its parameter types; None if it is
        not pipelined (kept when a type has no encoder, so not asked again). Raises
        ``TimeoutError`` if the connection was closed at ``tick``'s deadline meanwhile."""
        if len(self._statements) >= MAX_STATEMENTS:
            return None
        preparing: asyncio.Future[_Statement | None] = self._loop.create_future()
        self._statements[query] = preparing
        name = f"__shardline_pipeline_{next(self._names)}__".encode()
        text = query.encode()
        message = (
            _message(b"P", name + b"\x00" + text + b"\x00\x00\x00")
            + _message(b"D", b"S" + name + b"\x00")
            + _SYNC
        )
        answer = self._send(message, query, tick)  # bounded by the deadline of its query
        try:
            parameters = await asyncio.shield(answer)
        except BaseException as error:
            # not kept: the next use prepares again (the table may exist by then); this one
            # goes pooled, and raises there what preparing it raises
            if self._statements.get(query) is preparing:
                del self._statements[query]
            preparing.set_result(None)
            if isinstance(error, PostgresError | ConnectionDoesNotExistError):
                return None  # nothing ran
            raise  # its deadline (TimeoutError), or cancelled
        encoders = [_ENCODERS.get(oid) for oid in parameters]
        # kept either way: a type without an encoder stays without one
        statement = _Statement(name, encoders, query) if all(encoders) else None  # type: ignore[arg-type]
        if self._statements.get(query) is preparing:
            self._statements[query] = statement
        preparing.set_result(statement)
        return statement

    def answered(self, query: _Sent, status: int) -> None:
        """The wire read ``query``'s ReadyForQuery (``status``: the session's transaction
        state after it, ``I`` idle)."""
        future = query.future
        if not future.done():
            if query.error is not None:
                future.set_exception(PostgresError.new(query.error, query=query.query))
            elif query.parameters is not None:
                future.set_result(query.parameters)
            else:
                future.set_result(query.tag.decode())
        if (status != 0x49 or self.encoding != "UTF8") and not self.closed:
            logger.warning(
                "pipelined query %r left the session in a transaction or another"
                " client_encoding: connection closed",
                query.query,
            )
            self._connection.terminate()
            self.lost(None, dropped=False)
        if not self.sent and self._drained is not None:
            self._drained.set()

    def claim_drop(self) -> bool:
        """True once, at the first call after the connection was dropped (lost, not closed
        by the pipeline itself): the caller reports that one failure of the instance, however
        many queries it failed."""
        claimed, self._drop_unreported = self._drop_unreported, False
        return claimed

    def lost(self, exc: Exception | None, *, dropped: bool) -> None:
        """The connection is gone (``dropped``: not closed by the pipeline itself): every
        query sent and unanswered fails."""
        if dropped:
            self._drop_unreported = True
        self.closed = True
        sent, self.sent = self.sent, collections.deque()
        for query in sent:
            if not query.future.done():
                error = ConnectionDoesNotExistError(
                    "connection was closed in the middle of operation"
                )
                error.__cause__ = exc
                query.future.set_exception(error)
        if self._drained is not None:
            self._drained.set()
