"""The wire form of a worker record: versioned JSON, bounded in size, never pickle.

Schema version 1 is one JSON object, UTF-8 encoded::

    {"schema": 1, "uid": "<uuid>", "address": "host:port", "pid": 4242, "version": "1.2.0",
     "tags": ["gpu", "eu"], "extra": {"weight": 3}}

``uid``, ``address``, ``pid`` and ``version`` are required; ``tags`` (a list of strings) and
``extra`` (an object) default to empty. Fields this version does not know are ignored, so a
newer writer can add optional fields without a version bump; a change that older readers
must not misread bumps ``schema``, and readers skip versions they do not know.
"""

from __future__ import annotations

import json
import uuid
from types import MappingProxyType
from typing import Any

from shardline.errors import InvalidRecord
from shardline.pool.metadata import WorkerMetadata

__all__ = ["MAX_RECORD_BYTES", "SCHEMA_VERSION", "decode_record", "encode_record"]

SCHEMA_VERSION = 1
MAX_RECORD_BYTES = 64 * 1024


def encode_record(metadata: WorkerMetadata) -> bytes:
    """The record of ``metadata`` in schema version 1.

    Raises :class:`InvalidRecord` when ``extra`` is not JSON-serialisable or the encoded record
    exceeds :data:`MAX_RECORD_BYTES`, so a worker learns at publish time what no reader would
    accept.
    """
    document = {
        "schema": SCHEMA_VERSION,
        "uid": str(metadata.uid),
        "address": metadata.address,
        "pid": metadata.pid,
        "version": metadata.version,
        "tags": sorted(metadata.tags),
        "extra": dict(metadata.extra),
    }
    try:
        data = json.dumps(document, separators=(",", ":"), sort_keys=True).encode()
    except (TypeError, ValueError) as error:
        raise InvalidRecord(
            "malformed", f"worker {metadata.uid}: extra is not JSON-serialisable ({error})"
        ) from None
    if len(data) > MAX_RECORD_BYTES:
        raise InvalidRecord(
            "oversized",
            f"worker {metadata.uid}: record of {len(data)} bytes exceeds {MAX_RECORD_BYTES}",
        )
    return data


def decode_record(data: bytes) -> WorkerMetadata:
    """The worker described by ``data``; :class:`InvalidRecord` names what is wrong with it."""
    if len(data) > MAX_RECORD_BYTES:
        raise InvalidRecord("oversized", f"record of {len(data)} bytes exceeds {MAX_RECORD_BYTES}")
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, ValueError) as error:
        raise InvalidRecord("malformed", f"record is not JSON: {error}") from None
    if not isinstance(document, dict):
        raise InvalidRecord("malformed", f"record is a {type(document).__name__}, not an object")
    schema = document.get("schema")
    if schema != SCHEMA_VERSION:
        raise InvalidRecord("unknown-schema", f"record has schema {schema!r}, not 1")
    uid = _field(document, "uid", str)
    try:
        parsed_uid = uuid.UUID(uid)
    except ValueError:
        raise InvalidRecord("malformed", f"record field 'uid' is not a uuid: {uid!r}") from None
    pid = _field(document, "pid", int)
    tags = document.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(tag, str) for tag in tags):
        raise InvalidRecord("malformed", f"record field 'tags' is not a list of str: {tags!r}")
    extra = document.get("extra", {})
    if not isinstance(extra, dict):
        raise InvalidRecord("malformed", f"record field 'extra' is not an object: {extra!r}")
    return WorkerMetadata(
        uid=parsed_uid,
        address=_field(document, "address", str),
        pid=pid,
        version=_field(document, "version", str),
        tags=frozenset(tags),
        extra=MappingProxyType(extra),
    )


def _field(document: dict[str, Any], name: str, kind: type[Any]) -> Any:
    value = document.get(name)
    # bool is an int to isinstance, but never a pid
    if not isinstance(value, kind) or isinstance(value, bool):
        raise InvalidRecord(
            "malformed", f"record field {name!r} is not a {kind.__name__}: {value!r}"
        )
    return value
