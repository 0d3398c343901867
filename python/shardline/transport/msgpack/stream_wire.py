"""The MessagePack-RPC messages of a streamed call (docs/msgpack-rpc.md, "Streaming").

A stream is a request whose answer comes last, its items before it as notifications::

    stream    [0, msgid, "shardline.stream", [handler, payload, timeout, deadline, window]]
    item      [2, "shardline.item", [msgid, item]]          worker -> client, item a bin
    credit    [2, "shardline.credit", [msgid, n]]           client -> worker
    end       [1, msgid, nil, nil]                          worker -> client
    error     [1, msgid, {"kind": ...}, nil]                worker -> client
    cancel    [2, "shardline.cancel", [msgid]]              client -> worker (as for dispatch)

``payload``, ``timeout`` and ``deadline`` are read as a dispatch's; ``window`` is the items the
worker may send before it is granted more, each ``credit`` granting ``n`` more.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from shardline.transport.msgpack import wire
from shardline.transport.task import MalformedMessage

__all__ = [
    "CREDIT",
    "DEFAULT_WINDOW",
    "ITEM",
    "MAX_WINDOW",
    "STREAM",
    "StreamRequest",
    "credit",
    "item",
    "read_credit",
    "read_item",
    "read_stream_request",
    "stream_request",
]

STREAM = "shardline.stream"
ITEM = "shardline.item"
CREDIT = "shardline.credit"

DEFAULT_WINDOW = 64
"""The items a worker may send ahead of the caller's reading unless the caller says otherwise:
enough that a caller reading as fast as items come never waits on a grant (one is sent per
half window read, so a round trip is hidden behind 32 items), few enough that a caller that
stops reading holds at most 64 items of memory on each side."""

MAX_WINDOW = 1 << 16
"""The largest window a caller may ask for, and the most credit a worker holds at once."""


class StreamRequest(NamedTuple):
    """A stream request's params, read: the handler's name, the payload bin, the timeout and
    deadline as a dispatch's, and the window."""

    handler: str
    payload: bytes
    timeout: float | None
    deadline: float | None
    window: int


def stream_request(
    msgid: int,
    handler: str,
    payload: bytes,
    timeout: float | None,
    deadline: float | None,
    window: int,
) -> bytes:
    """The stream request of call ``msgid``; ``payload`` is the task's payload packed on its own."""
    return wire.pack([wire.REQUEST, msgid, STREAM, [handler, payload, timeout, deadline, window]])


def read_stream_request(params: Any) -> StreamRequest:
    """A stream request's params; :class:`MalformedMessage` saying what is wrong with them."""
    if not (
        isinstance(params, list)
        and len(params) == 5
        and isinstance(params[0], str)
        and isinstance(params[1], bytes)
    ):
        raise MalformedMessage(
            f"stream takes [handler, payload bin, timeout, deadline, window], got {params!r:.200}"
        )
    window = params[4]
    if not _count(window) or window > MAX_WINDOW:
        raise MalformedMessage(
            f"a stream's window is an int from 1 to {MAX_WINDOW}, not {window!r:.50}"
        )
    return StreamRequest(
        params[0],
        params[1],
        wire.read_timeout(params[2]),
        wire.read_deadline(params[3]),
        window,
    )


def item(msgid: int, packed: bytes) -> bytes:
    """The notification carrying one item of stream ``msgid``, ``packed`` on its own."""
    return wire.pack([wire.NOTIFICATION, ITEM, [msgid, packed]])


def read_item(params: Any) -> tuple[int, bytes]:
    """``(msgid, packed item)`` of an item notification's params; :class:`MalformedMessage`
    otherwise."""
    if (
        isinstance(params, list)
        and len(params) == 2
        and _msgid(params[0])
        and isinstance(params[1], bytes)
    ):
        return params[0], params[1]
    raise MalformedMessage(f"{ITEM} takes [msgid, item bin], got {params!r:.100}")


def credit(msgid: int, granted: int) -> bytes:
    """The notification granting stream ``msgid`` ``granted`` more items."""
    return wire.pack([wire.NOTIFICATION, CREDIT, [msgid, granted]])


def read_credit(params: Any) -> tuple[int, int]:
    """``(msgid, items granted)`` of a credit notification's params; :class:`MalformedMessage`
    otherwise (a grant is at least 1 and at most :data:`MAX_WINDOW`)."""
    if (
        isinstance(params, list)
        and len(params) == 2
        and _msgid(params[0])
        and _count(params[1])
        and params[1] <= MAX_WINDOW
    ):
        return params[0], params[1]
    raise MalformedMessage(
        f"{CREDIT} takes [msgid, items from 1 to {MAX_WINDOW}], got {params!r:.100}"
    )


def _msgid(value: Any) -> bool:
    return type(value) is int and 0 <= value <= 0xFFFFFFFF


def _count(value: Any) -> bool:
    return type(value) is int and value >= 1
