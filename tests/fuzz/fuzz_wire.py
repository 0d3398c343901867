"""Fuzz target: the transport's wire format (``shardline.transport.grpc.wire``).

Contract (the module and function docstrings): ``decode_request`` and ``decode_reply`` raise
only ``MalformedMessage``; a decoded request or reply encodes again (``encode_request`` and
``encode_result`` may refuse a payload that is not strict JSON with ``TypeError``/``ValueError``)
and decodes back equal. ``encode_error`` always produces a reply, which ``decode_reply`` reads
back as that type and message, and built-in type and traceback when given (a lone surrogate
may come back replaced).

Input layout: byte 0 mod 3 picks the case: 0, a request to decode; 1, a reply to decode (the
rest of the input is the message, so a seed is ``b"\\x00" + json``); 2, an error reply built from
the input (structure-aware). With bit 7 of byte 0 set, a message is nested deep first
(``fuzzkit.nested_text``).
"""

from __future__ import annotations

import re

import atheris
from fuzzkit import check, main, nested_text, same, show, text

from shardline.transport.grpc.wire import (
    decode_reply,
    decode_request,
    encode_error,
    encode_request,
    encode_result,
)
from shardline.transport.task import MAX_MESSAGE_BYTES, MalformedMessage


def request(data: bytes) -> None:
    try:
        task = decode_request(data)
    except MalformedMessage:
        return
    check(isinstance(task.handler, str), f"decoded the handler {show(task.handler)}")
    try:
        encoded = encode_request(task, MAX_MESSAGE_BYTES)
    except (TypeError, ValueError):
        return  # a payload json.loads takes but strict JSON does not (NaN, lone surrogates)
    again = decode_request(encoded)
    check(
        again.handler == task.handler and same(again.payload, task.payload),
        f"{show(task)} came back as {show(again)}",
    )


def reply(data: bytes) -> None:
    try:
        result, failure = decode_reply(data)
    except MalformedMessage:
        return
    if failure is not None:
        check(result is None, f"a reply with both an error and a result: {show(data)}")
        encoded = encode_error(
            failure.type, failure.message, builtin=failure.builtin, traceback=failure.traceback
        )
    else:
        try:
            encoded = encode_result(result, MAX_MESSAGE_BYTES)
        except (TypeError, ValueError):
            return
    again = decode_reply(encoded)
    check(
        same(again[0], result) and (again[1] == failure or failure is None),
        f"the reply {show(data)} came back as {show(again)}",
    )


def legible(text: str) -> str:
    """``text`` with each lone surrogate, and what an encoder may put in its place, as U+FFFD: a
    surrogate cannot travel in UTF-8, so a reply may carry a replacement for it instead."""
    return re.sub("[\ud800-\udfff\ufffd?]", "\ufffd", text)


def error_reply(fdp: atheris.FuzzedDataProvider) -> None:
    type_name, message = text(fdp), text(fdp) * fdp.ConsumeIntInRange(1, 3)
    builtin = text(fdp) if fdp.ConsumeBool() else None
    traceback = text(fdp) * fdp.ConsumeIntInRange(1, 3) if fdp.ConsumeBool() else None
    result, failure = decode_reply(
        encode_error(type_name, message, builtin=builtin, traceback=traceback)
    )
    check(
        result is None and failure is not None and legible(failure[0]) == legible(type_name),
        f"encode_error({show(type_name)}, …) came back as {show(failure)}",
    )
    assert failure is not None
    check(
        legible(message).startswith(legible(failure[1].removesuffix("… (cut)"))),
        f"encode_error(…, {show(message)}) came back as {show(failure[1])}",
    )
    for sent, got in ((builtin, failure.builtin), (traceback, failure.traceback)):
        check(
            (sent is None and got is None)
            or (sent is not None and got is not None and legible(got) == legible(sent)),
            f"encode_error(…, {show(sent)}) came back as {show(got)}",
        )


def test_one_input(data: bytes) -> None:
    if not data:
        return
    case = data[0] % 3
    body = nested_text(data[1:]) if data[0] & 0x80 else data[1:]
    if case == 0:
        request(body)
    elif case == 1:
        reply(body)
    else:
        error_reply(atheris.FuzzedDataProvider(data[1:]))


if __name__ == "__main__":
    main(test_one_input)
