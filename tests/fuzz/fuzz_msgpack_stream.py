"""Fuzz target: the MessagePack-RPC stream messages (``shardline.transport.msgpack.stream_wire``:
the readers a worker and a client apply to a stream request's, an item's and a credit's params,
the writers of the three) through the Rust core's reader (``FrameDecoder``).

Contract (the module's docstrings, docs/msgpack-rpc.md "Streaming", and
``tests/support/msgpack_reference.py``): ``read_stream_request``, ``read_item`` and
``read_credit`` raise only ``MalformedMessage``, whatever the params, and accept exactly the
params the protocol allows (a model below says which, field by field); the frames
``stream_request``, ``item`` and ``credit`` write are msgpack-python's bytes of the message,
which ``FrameDecoder`` hands over in every mode as that message (never taken apart as a
dispatch or an answer), and whose params the readers read back into the fields written.

Input layout: byte 0 mod 2 picks the case: 0, the rest is a stream read by ``FrameDecoder``
(no limit, the general mode): the params of every message read go through the three readers
(a seed is ``b"\\x00" + msgpack bytes``); 1, the three messages built from the input
(structure-aware), written, read back and read.
"""

from __future__ import annotations

import math
from typing import Any

import atheris
from fuzzkit import check, main, show, text

from shardline.transport.msgpack import wire
from shardline.transport.task import MalformedMessage
from support.msgpack_reference import deadline, packed, same, taken_apart, timeout

with atheris.instrument_imports(include=["shardline.transport.msgpack.stream_wire"]):
    from shardline.transport.msgpack import stream_wire

MODES = (None, "requests", "answers")


def is_msgid(value: Any) -> bool:
    return type(value) is int and 0 <= value <= 0xFFFFFFFF


def model_request(params: Any) -> bool:
    """Whether the protocol accepts these stream params."""
    return (
        isinstance(params, list)
        and len(params) == 5
        and isinstance(params[0], str)
        and isinstance(params[1], bytes)
        and timeout(params[2])[0]
        and deadline(params[3])[0]
        and type(params[4]) is int
        and 1 <= params[4] <= stream_wire.MAX_WINDOW
    )


def model_item(params: Any) -> bool:
    return (
        isinstance(params, list)
        and len(params) == 2
        and is_msgid(params[0])
        and isinstance(params[1], bytes)
    )


def model_credit(params: Any) -> bool:
    return (
        isinstance(params, list)
        and len(params) == 2
        and is_msgid(params[0])
        and type(params[1]) is int
        and 1 <= params[1] <= stream_wire.MAX_WINDOW
    )


READERS = (
    (stream_wire.read_stream_request, model_request),
    (stream_wire.read_item, model_item),
    (stream_wire.read_credit, model_credit),
)


def read_params(params: Any) -> None:
    for reader, model in READERS:
        try:
            reader(params)
        except MalformedMessage:
            check(not model(params), f"{reader.__name__} refused {show(params)}")
        else:
            check(model(params), f"{reader.__name__} read {show(params)}")


def read_stream(data: bytes) -> None:
    try:
        messages = wire.FrameDecoder(len(data) + 1).feed(data)
    except MalformedMessage:
        return
    for message in messages:
        read_params(message)
        if isinstance(message, list) and message:
            read_params(message[-1])


def frames(fdp: atheris.FuzzedDataProvider) -> None:
    msgid = fdp.ConsumeIntInRange(0, 0xFFFFFFFF)
    handler = text(fdp)
    payload = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 300))
    seconds = None if fdp.ConsumeBool() else fdp.PickValueInList([0.0, 1.5, 30, math.inf])
    until = None if fdp.ConsumeBool() else fdp.PickValueInList([0.0, -2.5, 12345.678, 7])
    # the writers' domain: the connection checks a window before it writes one
    window = fdp.ConsumeIntInRange(1, stream_wire.MAX_WINDOW)
    granted = fdp.ConsumeIntInRange(1, stream_wire.MAX_WINDOW)
    written: list[tuple[bytes, list[Any], Any]] = []
    try:
        request = stream_wire.stream_request(msgid, handler, payload, seconds, until, window)
    except ValueError:
        check(any("\ud800" <= c <= "\udfff" for c in handler), f"refused {show(handler)}")
    else:
        params = [handler, payload, seconds, until, window]
        written.append((request, [0, msgid, stream_wire.STREAM, params], params))
    written.append(
        (
            stream_wire.item(msgid, payload),
            [2, stream_wire.ITEM, [msgid, payload]],
            [msgid, payload],
        )
    )
    grant = stream_wire.credit(msgid, granted)
    written.append((grant, [2, stream_wire.CREDIT, [msgid, granted]], [msgid, granted]))
    for frame, message, params in written:
        check(frame == packed(message), f"{show(message)} packed as {show(frame)}")
        for fast in MODES:
            # the second message is past the first, where the fast readers apply
            got = wire.FrameDecoder(len(frame), fast).feed(frame + frame)
            check(same(got, [message, message]), f"{show(frame)} read back as {show(got)}")
            check(taken_apart(message, fast) is message, f"{show(message)} taken apart")
        read_params(params)
    if model_request(written[0][2]):
        read = stream_wire.read_stream_request(written[0][2])
        check(
            read == (handler, payload, timeout(seconds)[1], until, window),
            f"stream request read back as {show(read)}",
        )


def test_one_input(data: bytes) -> None:
    if not data:
        return
    if data[0] % 2 == 0:
        read_stream(data[1:])
    else:
        frames(atheris.FuzzedDataProvider(data[1:]))


if __name__ == "__main__":
    main(test_one_input)
