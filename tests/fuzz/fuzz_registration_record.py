"""Fuzz target: registration records as the etcd store writes and reads them (``_encode`` and
``_decode`` of ``shardline.registration.etcd_store``).

Contract (their docstrings): ``_decode`` raises only ``InvalidRecord`` (reason ``oversized``,
``malformed`` or ``unknown-schema``), takes only schema 1 (never a bool) and the record of its
own service, and never a ``Record`` the store could not have written (an address on an
unregistered record). ``_encode`` raises only ``ValueError`` (too large); what it writes reads
back as the same ``Record``, and whatever ``_decode`` accepts encodes to the same ``Record``.

Input layout: byte 0 even: the rest is a stored value read for the service ``"svc"`` (a seed is
``b"\\x00" + json``); odd: a record built from the input is written and read back.
"""

from __future__ import annotations

import json

import atheris
from fuzzkit import check, main, nested_text, show, text

from shardline import InvalidRecord
from shardline.registration.etcd_store import _decode, _encode
from shardline.registration.record import Record

REASONS = {"oversized", "malformed", "unknown-schema"}
SERVICE = "svc"


def decode(service: str, data: bytes) -> Record | None:
    try:
        record = _decode(service, data)
    except InvalidRecord as error:
        check(error.reason in REASONS, f"InvalidRecord with the reason {error.reason!r}")
        return None
    schema = json.loads(data).get("schema")
    check(not isinstance(schema, bool), f"accepted the schema {show(schema)}")
    check(
        record.address is None or record.registered,
        f"accepted an address on an unregistered record: {show(record)}",
    )
    return record


def round_trip(service: str, record: Record, what: str) -> None:
    try:
        data = _encode(service, record)
    except ValueError as error:
        check(type(error) is ValueError, f"{what}: _encode raised {show(error)}")
        return
    again = decode(service, data)
    check(again == record, f"{what}: {show(record)} came back as {show(again)}")


def test_one_input(data: bytes) -> None:
    if not data:
        return
    if data[0] & 1:
        fdp = atheris.FuzzedDataProvider(data[1:])
        registered = fdp.ConsumeBool()
        record = Record(
            owner=text(fdp) if fdp.ConsumeBool() else None,
            registered=registered,
            address=text(fdp) if registered and fdp.ConsumeBool() else None,
        )
        round_trip(text(fdp) if fdp.ConsumeBool() else SERVICE, record, "built")
        return
    body = nested_text(data[1:]) if data[0] & 2 else data[1:]
    decoded = decode(SERVICE, body)
    if decoded is not None:
        round_trip(SERVICE, decoded, f"decoded from {show(body)}")


if __name__ == "__main__":
    main(test_one_input)
