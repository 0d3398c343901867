"""Fuzz target: the MessagePack-RPC codec (``shardline.transport.msgpack.wire``: the Rust core's
reader behind ``FrameDecoder`` and ``unpack_value``, its writers ``request`` and ``result``).

Contract (the docstrings, and ``tests/support/msgpack_reference.py``, the msgpack-python model the
property tests share): ``unpack_value`` raises only ``MalformedMessage`` and reads what the model
reads, refusing what it refuses; ``FrameDecoder.feed`` raises only ``MalformedMessage`` (or its
``FrameTooLarge``), hands over the same messages however the bytes are split (a refusal
included), never a message over its limit, and, for a stream the model reads whole, the
model's values, with the hot path's requests or answers taken apart as the model says; and the
frames ``request`` and ``result`` write are msgpack-python's bytes, which the decoder takes apart
back into their fields (a request's msgid only in 0..2**32 - 1); an ``error`` answer (a
handler's built-in type and traceback in it or not) reads back through ``read_error``. With
item bounds (``max_items``, ``max_inner_items``), a stream the model reads is read the same
when every message is within them; a message of more items than ``max_items`` (one not taken
apart) is refused as ``MalformedMessage`` naming the bound, and a dispatch or answer whose
payload or result holds more than ``max_inner_items`` comes out as the plain message.
``describe`` says any value read in at most 64 characters.

Input layout: byte 0 mod 3 picks the case: 0, the rest of the input is a value for
``unpack_value``; 1, byte 1 picks the decoder's mode (mod 3: none, requests, answers) and its
limit (``byte 1 * 4 + 1``, 0 for no limit), byte 2 how many reads the stream is cut into
(mod 8) and whether the item bounds are one below the stream's largest counts (bit 3), and the
rest is the stream (a seed is ``b"\\x01\\x00\\x00" + msgpack bytes``); 2, a request and an
answer built from the input (structure-aware).
"""

from __future__ import annotations

import math
from typing import Any

import atheris
import msgpack  # type: ignore[import-untyped]
from fuzzkit import check, main, show, text

from shardline.transport.msgpack import wire
from shardline.transport.task import MalformedMessage
from support.msgpack_reference import Refused, model_stream, model_unpack, packed, same, taken_apart

MODES = (None, "requests", "answers")


def read_value(data: bytes) -> None:
    try:
        value = wire.unpack_value(data, "the payload")
    except MalformedMessage:
        try:
            expected = model_unpack(data)
        except Refused:
            return
        raise AssertionError(f"refused {show(data)}, which msgpack-python reads") from None
    try:
        expected = model_unpack(data)
    except Refused as refused:
        raise AssertionError(
            f"read {show(data)}, which msgpack-python refuses ({refused})"
        ) from None
    check(same(value, expected), f"{show(data)} read as {show(value)}, not {show(expected)}")


def read(decoder: wire.FrameDecoder, data: bytes, cuts: list[int]) -> tuple[list[Any], Any]:
    """What the decoder hands over when ``data`` comes in the reads ``cuts`` make, and the
    refusal it ended with (None if none)."""
    decoded: list[Any] = []
    try:
        for start, end in zip([0, *cuts], [*cuts, len(data)], strict=True):
            decoded.extend(decoder.feed(data[start:end]))
    except MalformedMessage as refusal:
        return decoded, refusal
    return decoded, None


# Nils enough to finish any message left open that fits in 16-bit lengths.
PADDING = b"\xc0" * 70_000


def read_stream(options: bytes, data: bytes) -> None:
    fast = MODES[options[0] % 3]
    limit = options[0] // 3 * 4 + 1 if options[0] >= 3 else len(data) + 1
    pieces = options[1] % 8 + 1
    cuts = sorted({len(data) * n // pieces for n in range(1, pieces)})
    whole, whole_refusal = read(wire.FrameDecoder(limit, fast), data, [])
    split, split_refusal = read(wire.FrameDecoder(limit, fast), data, cuts)
    check(
        type(whole_refusal) is type(split_refusal),
        f"{show(data)}: refused {show(whole_refusal)} whole, {show(split_refusal)} split {cuts}",
    )
    # a refusal drops the messages its read completed, so only then may the two differ
    if whole_refusal is None:
        check(same(whole, split), f"{show(data)} split {cuts}: {show(split)}")
    try:
        values, ends = model_stream(data)
    except Refused:
        if whole_refusal is None:
            # only if the model refused inside the message the decoder waits to finish: which
            # it must refuse too once that message is finished
            padded = data + PADDING
            _, refusal = read(wire.FrameDecoder(len(padded), fast), padded, [])
            check(refusal is not None, f"{show(data)}: read, though msgpack refuses it")
        return
    sizes = [end - start for start, end in zip([0, *ends], ends, strict=False)]
    if any(size > limit for size in sizes):
        check(
            isinstance(whole_refusal, wire.FrameTooLarge),
            f"{show(data)}: messages of {sizes} bytes, over the limit of {limit}, not refused",
        )
        return
    if ends[-1:] != [len(data)] and whole_refusal is not None:
        return  # refused from the headers of the unfinished message at the end
    check(whole_refusal is None, f"{show(data)} refused ({show(whole_refusal)}) but readable")
    expected = [*values[:1], *(taken_apart(v, fast) for v in values[1:])]
    check(same(whole, expected), f"{show(data)} read as {show(whole)}")
    for value in whole:
        said = wire.describe(value)
        check(len(said) <= 64, f"{show(value)} described in {len(said)} characters")
    if values:
        # the whole messages only: the unfinished one's items are not all known
        whole_messages = data[: ends[-1]]
        counts = [
            items(unpack_pairs(data[start:end]))
            for start, end in zip([0, *ends], ends, strict=False)
        ]
        read_within_items(whole_messages, fast, limit, counts, values, expected, options[1] & 8)


class Pairs(list[tuple[Any, Any]]):
    """A map's entries as read, a key repeated included."""


def unpack_pairs(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=True, strict_map_key=False, object_pairs_hook=Pairs)


def items(value: Any) -> int:
    """The items of a value (a map's entries as :class:`Pairs`) as the reader counts them:
    each value, container and key one (a bin one, whatever it holds)."""
    if isinstance(value, Pairs):
        return 1 + sum(items(k) + items(v) for k, v in value)
    if isinstance(value, list):
        return 1 + sum(map(items, value))
    return 1


def inner_items(message: Any) -> int:
    """The items of the payload or result bin of a dispatch or answer (as the model reads it)."""
    return items(unpack_pairs(message[3][1] if message[0] == 0 else message[3]))


def read_within_items(
    data: bytes,
    fast: Any,
    limit: int,
    counts: list[int],
    values: list[Any],
    expected: list[Any],
    below: int,
) -> None:
    """``data`` (readable, its messages ``values`` of ``counts`` items, read as ``expected``)
    read again under item bounds at the stream's largest counts, or one below them."""
    # a message taken apart (ten items at most) is not counted
    most = max(
        (n for n, m in zip(counts, expected, strict=True) if type(m) is not tuple), default=1
    )
    taken = [v for v, m in zip(values, expected, strict=True) if type(m) is tuple]
    most_inner = max(map(inner_items, taken), default=1)
    cap, inner_cap = (max(1, most - 1), max(1, most_inner - 1)) if below else (most, most_inner)
    got, refusal = read(wire.FrameDecoder(limit, fast, cap, inner_cap), data, [])
    if most > cap:
        check(
            type(refusal) is MalformedMessage and f"more than {cap} items" in str(refusal),
            f"{show(data)}: a message of {most} items, over {cap}, refused as {show(refusal)}",
        )
        return
    check(refusal is None, f"{show(data)} refused ({show(refusal)}) within {cap} items")
    plain = [*values[:1], *(
        v if type(m) is tuple and inner_items(v) > inner_cap else m
        for v, m in zip(values[1:], expected[1:], strict=True)
    )]  # fmt: skip
    check(same(got, plain), f"{show(data)} within {cap}/{inner_cap} items read as {show(got)}")


def frames(fdp: atheris.FuzzedDataProvider) -> None:
    msgid = fdp.ConsumeIntInRange(0, 2**64 - 1)
    handler = text(fdp)
    payload = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 300))
    timeout = (
        None
        if fdp.ConsumeBool()
        else fdp.PickValueInList([0.0, -1.0, 1.5, math.inf, -math.inf, math.nan, 1e300])
    )
    deadline = (
        None
        if fdp.ConsumeBool()
        else fdp.PickValueInList([0.0, -2.5, 12345.678, 1e300, math.inf, math.nan])
    )
    try:
        request = wire.request(msgid, handler, payload, timeout, deadline)
    except ValueError:
        check(any("\ud800" <= c <= "\udfff" for c in handler), f"request refused {show(handler)}")
        return
    # no deadline: the three params a worker of the first release reads
    params = [handler, payload, timeout] + ([] if deadline is None else [deadline])
    message = [0, msgid, "shardline.dispatch", params]
    check(request == packed(message), f"request {show(message)} packed as {show(request)}")
    answer = wire.result(msgid, payload or None)
    check(
        answer == packed([1, msgid, None, payload or None]),
        f"result({msgid}, {show(payload)}) packed as {show(answer)}",
    )
    for fast, frame, model in (
        ("requests", request, message),
        ("answers", answer, [1, msgid, None, payload or None]),
    ):
        decoder = wire.FrameDecoder(len(frame), fast)
        got = decoder.feed(frame + frame)
        expected = [model, taken_apart(model, fast)]
        check(same(got, expected), f"{show(frame)} read back as {show(got)}")
    error_answer(msgid, fdp)


def error_answer(msgid: int, fdp: atheris.FuzzedDataProvider) -> None:
    """An error answer, a handler's built-in type and traceback in it or not, reads back."""
    kind = fdp.PickValueInList(sorted(wire.ERROR_KINDS))
    type_name, message = text(fdp), text(fdp)
    started = fdp.PickValueInList([None, True, False])
    builtin = text(fdp) if fdp.ConsumeBool() else None
    traceback = text(fdp) * fdp.ConsumeIntInRange(1, 3) if fdp.ConsumeBool() else None
    frame = wire.error(
        msgid, kind, type_name, message, started=started, builtin=builtin, traceback=traceback
    )
    ((_, got_msgid, error, result),) = wire.FrameDecoder(len(frame)).feed(frame)
    got = wire.read_error(error)
    sent = (kind, type_name, message, started, builtin, traceback)
    check(
        (got_msgid, result) == (msgid, None)
        and (got.kind, got.started) == (kind, started)
        and all(
            (a is None and b is None)
            or (isinstance(a, str) and isinstance(b, str) and legible(a) == legible(b))
            for a, b in zip(sent[1:], got[1:], strict=True)
            if not isinstance(a, bool)
        ),
        f"error answer {show(sent)} read back as {show(got)}",
    )


def legible(text: str) -> str:
    """``text`` as UTF-8 carries it: each surrogate sent as ``?``."""
    return text.encode("utf-8", "replace").decode("utf-8")


def test_one_input(data: bytes) -> None:
    if not data:
        return
    case = data[0] % 3
    if case == 0:
        read_value(data[1:])
    elif case == 1:
        if len(data) >= 3:
            read_stream(data[1:3], data[3:])
    else:
        frames(atheris.FuzzedDataProvider(data[1:]))


if __name__ == "__main__":
    main(test_one_input)
