"""The wire format between `GrpcConnection` and a worker served by `serve`.

One unary-unary gRPC method, ``/shardline.Worker/Dispatch``, carries UTF-8 JSON bytes both ways
(no protobuf, no code generation). The request::

    {"handler": "echo", "payload": <any JSON value>}

The reply is exactly one of::

    {"result": <any JSON value>}
    {"error": {"type": "ValueError", "message": "...", "builtin": "ValueError", "traceback": "..."}}

An ``error`` reply means the worker ran (or refused) the task and is healthy: its handler
raised (``type`` is the exception's class, module-qualified unless it is a builtin), or the
transport itself refused the task, with ``type`` one of
:data:`~shardline.transport.task.UNKNOWN_HANDLER`,
:data:`~shardline.transport.task.BAD_REQUEST` and
:data:`~shardline.transport.task.BAD_RESULT`. Every other failure is a gRPC status. For a
handler's exception the error may also carry ``builtin``, the most derived built-in type of
:data:`~shardline.transport.remote_errors.BUILTIN_TYPES` it derives from, and ``traceback``,
the worker's, bounded (:mod:`shardline.transport.remote_errors`); a reader ignores the keys it
does not know, so a reply without them (an earlier release's) reads the same.

JSON is strict on the way out (no ``NaN`` or ``Infinity``); nothing read from the network is
ever unpickled or evaluated. Each side refuses messages over
:data:`~shardline.transport.task.MAX_MESSAGE_BYTES` (or the limit it was configured with). An
incompatible change of this format gets a new method name, so an old worker answers it
``UNIMPLEMENTED`` instead of misreading it.
"""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

from shardline.errors import InvalidAddress
from shardline.host_port import split_host_port
from shardline.transport.task import (
    MalformedMessage,
    Task,
)

__all__ = [
    "METHOD",
    "SCHEME",
    "TLS_SCHEME",
    "ReplyError",
    "grpc_record_target",
    "grpc_target",
]

METHOD = "/shardline.Worker/Dispatch"
SCHEME = "grpc://"
"""The scheme of a gRPC worker's published address, ``grpc://host:port``."""
TLS_SCHEME = "grpcs://"
"""The scheme of a gRPC worker served with TLS, ``grpcs://host:port``."""
_SURROGATE = re.compile("[\ud800-\udfff]")

# An error message longer than this is cut, so an error reply always fits any sane limit.
_MAX_ERROR_MESSAGE_CHARS = 8 * 1024


def _dumps(document: Any) -> bytes:
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def _legible(text: str) -> str:
    # UTF-8 cannot carry a surrogate code point: an error's type and message carry "?" instead,
    # both ways, so an error reply always encodes and what it reports can always be printed
    return _SURROGATE.sub("?", text)


def _loads(data: bytes, what: str) -> dict[str, Any]:
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise MalformedMessage(f"{what} is not JSON: {error}") from None
    if not isinstance(document, dict):
        raise MalformedMessage(f"{what} is a {type(document).__name__}, not an object")
    return document


def _bounded(data: bytes, limit: int, what: str) -> bytes:
    if len(data) > limit:
        raise ValueError(f"{what} is {len(data)} bytes, over the limit of {limit}")
    return data


def encode_request(task: Task, limit: int) -> bytes:
    """The request for ``task``; ``TypeError`` when its handler is not a str, ``ValueError``
    when it is not Unicode text (it holds a surrogate code point, which UTF-8 cannot carry),
    ``TypeError`` or ``ValueError`` when its payload is not JSON (a str in it holding a
    surrogate, or nested too deep to encode, is not) or the request would exceed ``limit``
    bytes."""
    if not isinstance(task.handler, str):
        raise TypeError(f"a task's handler is a str, not {type(task.handler).__name__}")
    if _SURROGATE.search(task.handler):
        raise ValueError(
            f"a task's handler must be Unicode text, not {task.handler!r} (a surrogate code point)"
        )
    try:
        data = _dumps({"handler": task.handler, "payload": task.payload})
    except (TypeError, ValueError, RecursionError) as error:
        # rebuilt as the base type: UnicodeEncodeError's constructor takes five arguments
        kind = TypeError if isinstance(error, TypeError) else ValueError
        raise kind(f"the payload for handler {task.handler!r} is not JSON: {error}") from None
    return _bounded(data, limit, f"the task for handler {task.handler!r}")


def decode_request(data: bytes) -> Task:
    """The task in a request; :class:`MalformedMessage` when it is not one."""
    document = _loads(data, "the request")
    handler = document.get("handler")
    if not isinstance(handler, str):
        raise MalformedMessage(f"the request's 'handler' is not a str: {handler!r}")
    return Task(handler, document.get("payload"))


def encode_result(result: Any, limit: int) -> bytes:
    """The reply carrying ``result``; ``TypeError`` or ``ValueError`` when it is not JSON or
    the reply would exceed ``limit`` bytes."""
    return _bounded(_dumps({"result": result}), limit, "the result")


def encode_error(
    type_name: str, message: str, *, builtin: str | None = None, traceback: str | None = None
) -> bytes:
    """The reply reporting an error of type ``type_name``, with the ``builtin`` type and
    ``traceback`` of a handler's exception unless None. It never fails: a surrogate code point
    (which UTF-8 cannot carry) is sent as ``?``, and a long message is cut (a traceback comes
    bounded)."""
    if len(message) > _MAX_ERROR_MESSAGE_CHARS:
        message = message[:_MAX_ERROR_MESSAGE_CHARS] + "… (cut)"
    error = {"type": _legible(type_name), "message": _legible(message)}
    if builtin is not None:
        error["builtin"] = _legible(builtin)
    if traceback is not None:
        error["traceback"] = _legible(traceback)
    return _dumps({"error": error})


class ReplyError(NamedTuple):
    """The error of a reply: ``builtin`` and ``traceback`` None when it carries none."""

    type: str
    message: str
    builtin: str | None = None
    traceback: str | None = None


def decode_reply(data: bytes) -> tuple[Any, ReplyError | None]:
    """``(result, None)`` or ``(None, error)``; :class:`MalformedMessage` when the reply is
    neither (an error whose ``builtin`` or ``traceback`` is there but no str is not
    well-formed). A surrogate code point in the error's text (a JSON escape) reads as ``?``,
    as :func:`encode_error` sends it."""
    document = _loads(data, "the reply")
    if "result" in document:
        return document["result"], None
    error = document.get("error")
    if isinstance(error, dict):
        type_name, message = error.get("type"), error.get("message")
        builtin, traceback = error.get("builtin"), error.get("traceback")
        if (
            isinstance(type_name, str)
            and isinstance(message, str)
            and (builtin is None or isinstance(builtin, str))
            and (traceback is None or isinstance(traceback, str))
        ):
            return None, ReplyError(
                _legible(type_name),
                _legible(message),
                None if builtin is None else _legible(builtin),
                None if traceback is None else _legible(traceback),
            )
    raise MalformedMessage(
        f"the reply has neither a result nor a well-formed error: {data[:200]!r}"
    )


def grpc_target(address: str) -> str:
    """The ``host:port`` a gRPC channel dials for a worker's address: ``grpc://host:port`` or
    ``grpcs://host:port`` as :func:`~shardline.transport.grpc.server.serve_grpc` publishes it, or a
    bare ``host:port`` (the form records had before the scheme, and a topology instance's
    address)."""
    return address.partition("://")[2] if address.startswith((SCHEME, TLS_SCHEME)) else address


def grpc_record_target(address: str) -> str:
    """:func:`grpc_target` of a worker's published address, checked:
    :class:`~shardline.errors.InvalidAddress` (a ``ValueError``) naming the address when what
    is left is no ``host:port`` with a port from 1 to 65535."""
    target = grpc_target(address)
    try:
        split_host_port(target)
    except InvalidAddress as error:
        raise InvalidAddress(
            f"a gRPC worker's address is grpc://host:port, grpcs://host:port or host:port,"
            f" not {address!r}" + (f": {error.reason}" if error.reason else ""),
            reason=error.reason,
        ) from None
    return target
