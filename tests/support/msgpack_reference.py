"""A reference model of the MessagePack-RPC codec, built on msgpack-python: what the transport's
Rust reader (``msgpack.wire.FrameDecoder``, ``unpack_value``) and writers (``request``,
``result``) must agree with. The property tests and the ``msgpack_wire`` fuzz target share it."""

from __future__ import annotations

import math
from typing import Any

import msgpack  # type: ignore[import-untyped]


class Refused(Exception):
    """The reference refuses the bytes (the codec must raise ``MalformedMessage``)."""


def _refuse_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"extension type {code}")


def _no_timestamps(value: Any) -> None:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, msgpack.Timestamp):
            raise Refused("a timestamp")


def model_unpack(data: bytes) -> Any:
    """The one value ``data`` holds, as the protocol reads it: str or bytes map keys, UTF-8
    strings, no extension type (the timestamp included), msgpack-python's nesting bound;
    :class:`Refused` otherwise."""
    try:
        value = msgpack.unpackb(
            data, raw=False, strict_map_key=True, ext_hook=_refuse_ext, use_list=True
        )
    except (ValueError, msgpack.UnpackException) as error:
        raise Refused(str(error)) from None
    _no_timestamps(value)
    return value


def model_stream(data: bytes) -> tuple[list[Any], list[int]]:
    """The values ``data`` holds back to back, and where each ends (a value cut short at the
    end is not among them); :class:`Refused` when one is unreadable."""
    unpacker = msgpack.Unpacker(
        raw=False, strict_map_key=True, ext_hook=_refuse_ext, use_list=True, max_buffer_size=0
    )
    unpacker.feed(data)
    values = []
    # tell() right after a value: msgpack reads into an unfinished one too
    ends = []
    try:
        for value in unpacker:
            ends.append(unpacker.tell())
            _no_timestamps(value)
            values.append(value)
    except (ValueError, msgpack.UnpackException) as error:
        raise Refused(str(error)) from None
    return values, ends


def timeout(value: Any) -> tuple[bool, float | None]:
    """``(True, seconds)`` for a timeout a worker reads (nil or +inf: none; negative: 0);
    ``(False, None)`` for one it answers ``bad_request``."""
    if value is None:
        return True, None
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return False, None
    if math.isinf(value) and value > 0:
        return True, None
    return True, max(float(value), 0.0)


def deadline(value: Any) -> tuple[bool, float | None]:
    """``(True, seconds)`` for a deadline a worker reads (nil: none; a finite number);
    ``(False, None)`` for one it answers ``bad_request``."""
    if value is None:
        return True, None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return False, None
    return True, float(value)


def _readable(inner: bytes) -> tuple[bool, Any]:
    """``(True, value)`` for a payload or result bin holding one value the protocol reads,
    ``(False, None)`` otherwise."""
    try:
        return True, model_unpack(inner)
    except Refused:
        return False, None


def taken_apart(message: Any, fast: str | None) -> Any:
    """What the decoder hands over for ``message`` (not the stream's first): with
    ``fast="requests"`` a well-formed dispatch with a msgid in 0..2**32 - 1 whose payload is
    readable as ``(msgid, handler, argument, timeout, deadline)``, with ``fast="answers"`` a
    successful answer whose result is readable as ``(msgid, value)`` (``argument`` and
    ``value`` read from their bins); else ``message`` itself."""
    if not (isinstance(message, list) and len(message) == 4):
        return message
    kind, msgid, third, fourth = message
    if isinstance(msgid, bool) or not isinstance(msgid, int) or msgid < 0:
        return message
    # a request's msgid past 32 bits is left whole, for the worker to refuse
    if fast == "requests" and kind == 0 and third == "shardline.dispatch" and msgid < 2**32:
        params = fourth
        if (
            isinstance(params, list)
            and len(params) in (3, 4)
            and isinstance(params[0], str)
            and isinstance(params[1], bytes)
        ):
            readable, seconds = timeout(params[2])
            until = deadline(params[3]) if len(params) == 4 else (True, None)
            if readable and until[0]:
                read, argument = _readable(params[1])
                if read:
                    return (msgid, params[0], argument, seconds, until[1])
    if fast == "answers" and kind == 1 and third is None and isinstance(fourth, bytes):
        read, value = _readable(fourth)
        if read:
            return (msgid, value)
    return message


def packed(value: Any) -> bytes:
    """``value`` packed as the transport packs its messages."""
    data: bytes = msgpack.packb(value, use_bin_type=True, datetime=False)
    return data


def same(a: Any, b: Any) -> bool:
    """Equal, types included (True is not 1, 1 is not 1.0), NaN equal to NaN, a tuple only
    equal to a tuple."""
    pending = [(a, b)]
    while pending:
        x, y = pending.pop()
        if type(x) is not type(y):
            return False
        if isinstance(x, float):
            if not (x == y or (math.isnan(x) and math.isnan(y))):
                return False
        elif isinstance(x, dict):
            if list(x) != list(y):
                return False
            pending.extend((x[k], y[k]) for k in x)
        elif isinstance(x, list | tuple):
            if len(x) != len(y):
                return False
            pending.extend(zip(x, y, strict=True))
        elif x != y:
            return False
    return True
