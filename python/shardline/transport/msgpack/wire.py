"""The MessagePack-RPC wire between `MsgpackConnection` and a worker served by `serve_msgpack`.

Messages are MessagePack-RPC's, streamed back to back on the socket (msgpack is
self-delimiting)::

    request       [0, msgid, method, params]
    response      [1, msgid, error, result]
    notification  [2, method, params]

What shardline adds (docs/msgpack-rpc.md tells the whole protocol):

- the first message each way is the hello, ``[2, "shardline.hello", {"version": 1,
  "max_frame_bytes": N, "clock": T}]``; a peer whose ``version`` differs is refused (the
  connection is closed), and each side sends no frame over the limit its peer announced;
  ``clock`` (optional: a peer of the first release sends none) is the sender's event-loop clock
  in seconds when it wrote the hello;
- ``[0, msgid, "shardline.dispatch", [handler, payload, timeout, deadline]]`` runs a handler:
  ``payload`` is the task's payload packed on its own (a bin), ``timeout`` the seconds left to
  the caller (nil for none), ``deadline`` (optional: three params are read too) the caller's
  deadline on the clock its hello announced; the answer's result is the handler's result,
  packed on its own likewise;
- ``[0, msgid, "shardline.ping", []]`` is answered ``[1, msgid, nil, nil]``;
- ``[2, "shardline.cancel", [msgid]]`` cancels a dispatch in flight (no answer follows);
- an error is a map ``{"kind": KIND, "type": str, "message": str}``, ``KIND`` one of
  :data:`ERROR_KINDS`, and for ``deadline`` and ``shutting_down`` ``"started": bool``, whether
  the handler had started (absent from a worker of the first release); for ``handler``,
  optionally ``"builtin": str`` and ``"traceback": str`` (see
  :mod:`shardline.transport.remote_errors`).

Nothing read is ever unpickled or evaluated: maps take only str or bytes keys, strings must be
UTF-8, and extension types (the timestamp included) are refused. Every frame read is bounded.
"""

from __future__ import annotations

import math
import socket
import threading
from typing import Any, Literal, NamedTuple

from shardline._core import (
    MsgpackReader,
    msgpack_answer,
    msgpack_call,
    msgpack_plain,
    msgpack_request,
    msgpack_result,
    msgpack_unpack,
)
from shardline._extras import requires_extra
from shardline.errors import InvalidAddress
from shardline.host_port import join_host_port, split_host_port

with requires_extra("msgpack", __name__):
    import msgpack  # type: ignore[import-untyped]

from shardline.transport.task import MalformedMessage

__all__ = [
    "BAD_REQUEST",
    "BAD_RESULT",
    "BUSY",
    "CANCEL",
    "DEADLINE",
    "DISPATCH",
    "ERROR_KINDS",
    "HANDLER",
    "HELLO",
    "KEEPALIVE_SECONDS",
    "MAX_MSGID",
    "NOTIFICATION",
    "PING",
    "PROTOCOL_VERSION",
    "REQUEST",
    "RESPONSE",
    "SHUTTING_DOWN",
    "TCP_SCHEME",
    "TLS_SCHEME",
    "TRANSIENT_KINDS",
    "UNAVAILABLE",
    "UNIX_SCHEME",
    "UNKNOWN_HANDLER",
    "ErrorAnswer",
    "FrameDecoder",
    "FrameTooLarge",
    "Hello",
    "MalformedMessage",
    "VersionMismatch",
    "answer",
    "call",
    "cancel",
    "describe",
    "error",
    "hello",
    "keep_alive",
    "keep_alive_socket",
    "pack",
    "pack_value",
    "ping",
    "read_deadline",
    "read_error",
    "read_hello",
    "read_timeout",
    "record_address",
    "request",
    "result",
    "tcp_address",
    "unpack_value",
]

PROTOCOL_VERSION = 1
"""The major version each side announces in its hello; another one is refused."""

REQUEST, RESPONSE, NOTIFICATION = 0, 1, 2
MAX_MSGID = 2**32 - 1
"""msgids are unsigned 32-bit: a worker closes a connection sending one outside 0..MAX_MSGID."""
HELLO = "shardline.hello"
CANCEL = "shardline.cancel"
DISPATCH = "shardline.dispatch"
PING = "shardline.ping"

BUSY = "busy"
UNAVAILABLE = "unavailable"
SHUTTING_DOWN = "shutting_down"
DEADLINE = "deadline"
HANDLER = "handler"
UNKNOWN_HANDLER = "unknown_handler"
BAD_REQUEST = "bad_request"
BAD_RESULT = "bad_result"
TRANSIENT_KINDS = frozenset({BUSY, UNAVAILABLE, SHUTTING_DOWN, DEADLINE})
"""Error kinds the caller retries elsewhere (``TransientRpcError``)."""
ERROR_KINDS = TRANSIENT_KINDS | {HANDLER, UNKNOWN_HANDLER, BAD_REQUEST, BAD_RESULT}
"""Every error kind; the others are the worker's answer to the task (``WorkerError``)."""

# An error message longer than this is cut, so an error answer always fits any sane limit.
_MAX_ERROR_MESSAGE_CHARS = 8 * 1024


class FrameTooLarge(MalformedMessage):
    """A peer sent a frame over the limit (``limit`` bytes; 0, and no message, when not
    given)."""

    def __init__(self, limit: int = 0) -> None:
        super().__init__(*((f"a frame over the limit of {limit} bytes",) if limit else ()))
        self.limit = limit


class VersionMismatch(MalformedMessage):
    """A peer's hello announces another protocol version than :data:`PROTOCOL_VERSION`."""


class FrameDecoder(MsgpackReader):
    """Turns the bytes read from a socket into messages, whatever the split.

    ``feed(data)`` returns the messages completed by ``data``; :class:`FrameTooLarge` when a
    message would exceed ``max_frame_bytes``, :class:`MalformedMessage` when the bytes are not
    msgpack this protocol reads (an extension type, a map key neither str nor bytes, a string
    not UTF-8, more than 1024 containers nested). After either, the decoder is unusable (the
    stream has lost its framing) and the connection must be closed.

    ``max_items`` (None: no bound) bounds the items of a message (each value, container and
    map key counts one; a payload or result bin one): a message of more is refused with
    :class:`MalformedMessage` (a message taken apart, below, is not counted: it holds ten at
    most). ``max_inner_items`` bounds those of the payload or result a
    fast message (see below) carries: one of more comes out as the plain message, its payload
    or result still a bin, for the caller to refuse (see :func:`unpack_value`).

    Each message is its decoded value (lists, dicts, str, bytes, int, float, bool, None),
    except, with ``fast="requests"``, a well-formed dispatch request after the first message
    whose payload is readable and whose msgid is at most :data:`MAX_MSGID`, which is
    ``(msgid, handler, argument, timeout, deadline)``
    (``argument`` the value packed in the payload bin, as :func:`unpack_value` reads it,
    ``timeout`` None or seconds as :func:`read_timeout` reads them, ``deadline`` None when
    the request has three params or a nil one, else a finite float), and with
    ``fast="answers"`` a successful answer after the first message whose result is readable,
    ``(msgid, value)`` (``value`` read likewise); any other message, well-formed or not, is
    its decoded value.

    ``progress`` is ``(fed, read, unfinished)``: the bytes fed and the messages read so far,
    and the bytes held of a message not finished yet.

    Implementation notes: the Rust core's ``MsgpackReader`` does a read's work in one call:
    it finds each message's end (resuming an unfinished one where it stopped), refuses one
    over the limit as soon as its headers show it cannot fit (each item still due counts a
    byte) or its bytes pass the limit, and builds the values. A frame of exactly the limit
    decodes whatever the socket's read size, and one byte more does not.
    """

    def __new__(
        cls,
        max_frame_bytes: int,
        fast: Literal["requests", "answers"] | None = None,
        max_items: int | None = None,
        max_inner_items: int | None = None,
    ) -> FrameDecoder:
        return super().__new__(
            cls, max_frame_bytes, fast, MalformedMessage, FrameTooLarge, max_items, max_inner_items
        )


class _Packers(threading.local):
    """A msgpack ``Packer`` per thread, reused: ``packb`` builds one for every message, which
    cost more than the packing (1.6 µs against 0.3 µs for a request). Per thread because a
    packer's buffer is shared state (msgpack's pure-Python fallback, and a free-threaded
    interpreter, would interleave two threads' messages in it)."""

    def __init__(self) -> None:
        self.packer = msgpack.Packer(use_bin_type=True, datetime=False)


_packers = _Packers()


def pack(message: Any) -> bytes:
    """One message; ``TypeError`` or ``ValueError`` when msgpack cannot carry it."""
    data: bytes = _packers.packer.pack(message)
    return data


def pack_value(value: Any, what: str, handler: str) -> bytes:
    """A payload or result packed on its own; ``TypeError`` or ``ValueError`` (naming
    ``what`` and the ``handler``) when msgpack cannot carry it: a type it does not know, a str
    holding a surrogate code point, nesting deeper than it packs.

    Implementation notes: a plain value (see :data:`answer`) is packed by the Rust core, byte
    for byte as msgpack-python packs it; any other by msgpack-python."""
    packed = msgpack_plain(value)  # a plain value, packed in the Rust core
    if packed is not None:
        return packed
    try:
        return pack(value)
    except (TypeError, ValueError, OverflowError) as error:
        # rebuilt as the base type: UnicodeEncodeError's constructor takes five arguments
        kind = TypeError if isinstance(error, TypeError) else ValueError
        raise kind(f"{what} for handler {handler!r} is not msgpack: {error}") from None


def unpack_value(data: bytes, what: str, max_items: int | None = None) -> Any:
    """A payload or result; :class:`MalformedMessage` naming ``what`` when it is not one
    msgpack value this protocol reads (what :class:`FrameDecoder` reads in a message), or holds
    more than ``max_items`` items (None: no bound)."""
    try:
        return msgpack_unpack(data, max_items)
    except ValueError as error:
        raise MalformedMessage(f"{what} is unreadable: {error}") from None


def describe(value: Any) -> str:
    """``value`` (read from the network) as an error message shows it, in at most 64
    characters: a number, nil or a short str as itself, anything else by its type and size,
    so describing a message never costs more than its size says (a full ``repr`` of four
    million ints takes half a second)."""
    if value is None or isinstance(value, bool | int | float):
        return repr(value)
    if isinstance(value, str):
        # (escapes make a repr up to ten times its str)
        shown = repr(value) if len(value) <= 40 else ""
        return shown if 0 < len(shown) <= 64 else f"a str of {len(value)} chars"
    if isinstance(value, bytes):
        return f"a bin of {len(value)} bytes"
    if isinstance(value, list):
        return f"an array of {len(value)} items"
    if isinstance(value, dict):
        return f"a map of {len(value)} entries"
    return f"a {type(value).__name__}"


def hello(max_frame_bytes: int, clock: float | None = None) -> bytes:
    """A hello announcing ``max_frame_bytes`` and ``clock`` (the sender's event loop's
    ``time()`` now); without a clock, a hello as the first release sent it."""
    announced: dict[str, Any] = {"version": PROTOCOL_VERSION, "max_frame_bytes": max_frame_bytes}
    if clock is not None:
        announced["clock"] = clock
    return pack([NOTIFICATION, HELLO, announced])


class Hello(NamedTuple):
    """What a peer's hello announced: its frame limit, and its clock (None when it sent none,
    as a peer of the first release does: a worker then reads no deadline param)."""

    max_frame_bytes: int
    clock: float | None


def read_hello(message: Any, peer: str) -> Hello:
    """What a hello announces; :class:`MalformedMessage` naming ``peer`` when the message is
    not a hello, or its limit or clock is not one (:class:`VersionMismatch` when it is a
    hello of another version)."""
    if not (
        isinstance(message, list)
        and len(message) == 3
        and message[0] == NOTIFICATION
        and message[1] == HELLO
        and isinstance(message[2], dict)
    ):
        raise MalformedMessage(
            f"{peer} did not open with a {HELLO} notification: {describe(message)}"
        )
    version, limit = message[2].get("version"), message[2].get("max_frame_bytes")
    if version != PROTOCOL_VERSION:
        raise VersionMismatch(
            f"{peer} speaks shardline msgpack-rpc version {describe(version)}, "
            f"this side speaks version {PROTOCOL_VERSION}"
        )
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise MalformedMessage(f"{peer} announced max_frame_bytes {describe(limit)}")
    clock = message[2].get("clock")
    if clock is not None and not _finite(clock):
        raise MalformedMessage(f"{peer} announced the clock {describe(clock)}")
    return Hello(limit, None if clock is None else float(clock))


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


request = msgpack_request
"""``request(msgid, handler, payload, timeout, deadline=None)``: the dispatch request ``[0,
msgid, "shardline.dispatch", [handler, payload bin, timeout, deadline]]`` packed (in the Rust
core); with no deadline, the three params ``[handler, payload bin, timeout]`` a worker of the
first release reads."""


call = msgpack_call
"""``call(msgid, handler, value, timeout, deadline=None)``: :func:`request` with ``value``
packed as the
payload (both in the Rust core, byte for byte as msgpack-python packs them) and ``timeout``
the seconds left, a negative count sent as 0; None unless ``value`` is a plain value (see
:data:`answer`), ``handler`` a str UTF-8 can carry and ``timeout`` None, a float or an int
(exactly those types): the caller then packs and checks the call step by step (see
:func:`pack_value`), which sends it or says why not."""


def ping(msgid: int) -> bytes:
    return pack([REQUEST, msgid, PING, []])


def cancel(msgid: int) -> bytes:
    return pack([NOTIFICATION, CANCEL, [msgid]])


result = msgpack_result
"""``result(msgid, value)``: the answer ``[1, msgid, nil, value bin or nil]`` packed (in the
Rust core)."""


answer = msgpack_answer
"""``answer(msgid, value)``: :func:`result` with ``value`` packed (both in the Rust core,
byte for byte as msgpack-python packs them) when ``value`` is made only of None, bool, int,
float, str, bytes, list, tuple and dict, each of exactly that type, at most 64 containers deep;
None for any other value, which :func:`pack_value` then packs or refuses."""


def error(
    msgid: int,
    kind: str,
    type_name: str,
    message: str,
    *,
    started: bool | None = None,
    builtin: str | None = None,
    traceback: str | None = None,
) -> bytes:
    """An error answer, saying whether the handler had ``started`` unless that is None, and
    carrying the ``builtin`` type and ``traceback`` of a handler's exception unless None. It
    never fails: what UTF-8 cannot carry (a surrogate code point) is sent as ``?``, and a
    long message is cut (a traceback comes bounded)."""
    if len(message) > _MAX_ERROR_MESSAGE_CHARS:
        message = message[:_MAX_ERROR_MESSAGE_CHARS] + "… (cut)"
    fields: dict[str, Any] = {
        "kind": kind,
        "type": _legible(type_name),
        "message": _legible(message),
    }
    if started is not None:
        fields["started"] = started
    if builtin is not None:
        fields["builtin"] = _legible(builtin)
    if traceback is not None:
        fields["traceback"] = _legible(traceback)
    return pack([RESPONSE, msgid, fields, None])


def _legible(text: str) -> str:
    return text.encode("utf-8", "replace").decode("utf-8")


def read_timeout(value: Any) -> float | None:
    """A request's timeout: nil, or a number of seconds (non-finite or negative is refused)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise MalformedMessage(
            f"the request's timeout is not a number of seconds: {describe(value)}"
        )
    if math.isinf(value) and value > 0:
        return None
    return max(float(value), 0.0)


def read_deadline(value: Any) -> float | None:
    """A request's deadline: nil, or a finite number (on the client's clock)."""
    if value is None:
        return None
    if not _finite(value):
        raise MalformedMessage(f"the request's deadline is not a finite number: {describe(value)}")
    return float(value)


class ErrorAnswer(NamedTuple):
    """An error answer as :func:`read_error` reads it: ``started`` None when the answer does
    not say; ``builtin`` and ``traceback`` None when it carries none (a worker of an earlier
    release, or another kind than ``handler``)."""

    kind: str
    type: str
    message: str
    started: bool | None
    builtin: str | None
    traceback: str | None


def read_error(error: Any) -> ErrorAnswer:
    """The error of an error answer; :class:`MalformedMessage` when it is not a well-formed
    one of a known kind. Keys this version does not know are ignored."""
    if isinstance(error, dict):
        kind, type_name, message = error.get("kind"), error.get("type"), error.get("message")
        started = error.get("started")
        builtin, traceback = error.get("builtin"), error.get("traceback")
        if (
            kind in ERROR_KINDS
            and isinstance(type_name, str)
            and isinstance(message, str)
            and (started is None or isinstance(started, bool))
            and (builtin is None or isinstance(builtin, str))
            and (traceback is None or isinstance(traceback, str))
        ):
            return ErrorAnswer(kind, type_name, message, started, builtin, traceback)
    raise MalformedMessage(f"the answer carries an error this side cannot read: {describe(error)}")


TCP_SCHEME = "msgpack+tcp://"
TLS_SCHEME = "msgpack+tls://"
"""A worker served with TLS over TCP (see :mod:`shardline.transport.tls`)."""
UNIX_SCHEME = "msgpack+unix://"


def record_address(address: str) -> tuple[str, int] | str:
    """Where a published ``msgpack+tcp://host:port``, ``msgpack+tls://host:port`` or
    ``msgpack+unix:///path`` address is: ``(host, port)`` (an IPv6 host without its brackets)
    or the socket's path; :class:`~shardline.errors.InvalidAddress` (a ``ValueError``) naming
    it otherwise."""
    reason = None
    if address.startswith(UNIX_SCHEME):
        path = address[len(UNIX_SCHEME) :]
        if path.startswith("/") and "\0" not in path:
            return path
    elif address.startswith((TCP_SCHEME, TLS_SCHEME)):
        try:
            return split_host_port(address.partition("://")[2])
        except InvalidAddress as error:
            reason = error.reason
    raise InvalidAddress(
        "a msgpack worker's address is msgpack+tcp://host:port, msgpack+tls://host:port or"
        f" msgpack+unix:///absolute/path, not {address!r}" + (f": {reason}" if reason else ""),
        reason=reason,
    )


def tcp_address(host: str, port: int, *, tls: bool = False) -> str:
    """The published form of a TCP worker's address, ``msgpack+tcp://host:port``, or
    ``msgpack+tls://host:port`` for one served with TLS."""
    return (TLS_SCHEME if tls else TCP_SCHEME) + join_host_port(host, port)


def keep_alive(transport: Any) -> None:
    """Turns on TCP keepalive for a TCP transport's socket (a no-op for a Unix socket), so a
    peer that vanished without a word (a host down, a cable cut) is found on an idle
    connection within about :data:`KEEPALIVE_SECONDS`."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        keep_alive_socket(sock)


def keep_alive_socket(sock: Any) -> None:
    """:func:`keep_alive` for a socket (a server's listening one: on Linux, the sockets it
    accepts inherit the options)."""
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    # Linux names these; elsewhere the system's keepalive timing applies.
    for option, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, option):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


KEEPALIVE_SECONDS = 10 + 5 * 3
"""About how long an idle TCP connection to a vanished peer lasts with :func:`keep_alive`:
10 s idle, then 3 probes 5 s apart (where the system lets them be set)."""
