"""Fuzz target: discovery worker records, ``decode_record`` and ``encode_record``.

Contract (the module and function docstrings, and ``InvalidRecord``'s): ``decode_record`` raises
only ``InvalidRecord`` (reason ``oversized``, ``malformed`` or ``unknown-schema``); it takes only
schema 1 (never a bool), with the required fields of the right types. ``encode_record`` raises
only ``InvalidRecord``; whatever it encodes decodes back to an equal record, and whatever
``decode_record`` accepts encodes again (or is refused as ``InvalidRecord``) to an equal record.

Input layout: byte 0 even: the rest is a record to decode (a seed is ``b"\\x00" + json``; with
bit 1 of byte 0 set, it is nested deep first, see ``fuzzkit.nested_text``);
odd: a ``WorkerMetadata`` built from the input is encoded (structure-aware).
"""

from __future__ import annotations

import json
import uuid
from types import MappingProxyType
from typing import Any

import atheris
from fuzzkit import check, integer, json_value, main, nested_text, same, show, text

from shardline import InvalidRecord, WorkerMetadata
from shardline.discovery.record import decode_record, encode_record

REASONS = {"oversized", "malformed", "unknown-schema"}


def equal(a: WorkerMetadata, b: WorkerMetadata) -> bool:
    return (
        (a.uid, a.address, a.pid, a.version, a.tags) == (b.uid, b.address, b.pid, b.version, b.tags)
        and type(a.pid) is type(b.pid)
        and same(dict(a.extra), dict(b.extra))
    )


def decode(data: bytes) -> WorkerMetadata | None:
    try:
        decoded = decode_record(data)
    except InvalidRecord as error:
        check(error.reason in REASONS, f"InvalidRecord with the reason {error.reason!r}")
        return None
    schema = json.loads(data).get("schema")
    check(not isinstance(schema, bool), f"accepted the schema {show(schema)}")
    check(type(decoded.pid) is int, f"accepted the pid {show(decoded.pid)}")
    return decoded


def round_trip(metadata: WorkerMetadata, what: str) -> None:
    try:
        data = encode_record(metadata)
    except InvalidRecord as error:
        check(error.reason in REASONS, f"InvalidRecord with the reason {error.reason!r}")
        return
    again = decode(data)
    check(again is not None, f"{what}: encode_record wrote {show(data)}, which it cannot read")
    assert again is not None
    check(equal(again, metadata), f"{what}: {show(metadata)} came back as {show(again)}")


def built(fdp: atheris.FuzzedDataProvider) -> WorkerMetadata:
    extra: dict[str, Any] = {}
    for _ in range(fdp.ConsumeIntInRange(0, 3)):
        extra[text(fdp)] = json_value(fdp)
    return WorkerMetadata(
        uid=uuid.UUID(bytes=fdp.ConsumeBytes(16).ljust(16, b"\0")),
        address=text(fdp),
        pid=integer(fdp),
        version=text(fdp),
        tags=frozenset(text(fdp) for _ in range(fdp.ConsumeIntInRange(0, 3))),
        extra=MappingProxyType(extra),
    )


def test_one_input(data: bytes) -> None:
    if not data:
        return
    if data[0] & 1:
        round_trip(built(atheris.FuzzedDataProvider(data[1:])), "built")
        return
    body = nested_text(data[1:]) if data[0] & 2 else data[1:]
    decoded = decode(body)
    if decoded is not None:
        round_trip(decoded, f"decoded from {show(body)}")


if __name__ == "__main__":
    main(test_one_input)
