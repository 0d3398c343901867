"""The wire form of a worker record: versioned JSON, bounded in size, never pickle.

Schema version 1 is one JSON object, UTF-8 encoded::

    {"schema": 1, "uid": "<uuid>", "address": "host:port", "pid": 4242, "version": "1.2.0",
     "tags": ["gpu", "eu"], "extra": {"weight": 3}}

``uid``, ``address``, ``pid`` and ``version`` are required; ``tags`` (a list of strings) and
``extra`` (an object) default to empty. ``schema`` and ``pid`` are JSON integers (``true`` is
not 1). ``published`` (optional: a record without it reads as before, and readers older than
it ignore it) is the wall-clock time, in seconds since the epoch, at which the publisher
published this version of the record: a JSON number from 0 to :data:`MAX_PUBLISHED` (a
reader refuses any other value as malformed); the backends' publishers set it
(:func:`stamped`). Fields this version does not know are ignored, so a newer writer can add
optional fields without a version bump; a change that older readers must not misread bumps
``schema``, and readers skip versions they do not know.

Every string in a record (keys included) is Unicode text: one holding a surrogate code point
(written as two halves of a pair, or alone) is refused on both sides, since its JSON escapes
would read back as another string, or as one no UTF-8 encoder accepts.

A record is at most :data:`MAX_RECORD_BYTES` long and nests arrays and objects at most
:data:`MAX_DEPTH` levels deep (the record's own object is level 1); a reader refuses a deeper
one before decoding it, so no record can exhaust the reader's stack. :func:`encode_record`
refuses whatever :func:`decode_record` would, so a worker learns at publish time what no
reader would accept.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time
import uuid
from types import MappingProxyType
from typing import Any

from shardline.errors import InvalidRecord
from shardline.workers import WorkerMetadata

__all__ = [
    "MAX_DEPTH",
    "MAX_PUBLISHED",
    "MAX_RECORD_BYTES",
    "SCHEMA_VERSION",
    "decode_record",
    "encode_record",
    "load_document",
    "load_json",
    "stamped",
]

SCHEMA_VERSION = 1
MAX_RECORD_BYTES = 64 * 1024
"""The longest record, encoded, in bytes: longer is refused on both sides."""
MAX_DEPTH = 32
"""The deepest nesting of arrays and objects a record may have, its own object included."""
MAX_PUBLISHED = 32_503_680_000.0
"""The latest publish time a record may carry (the year 3000): a bound on what a reader
accepts, not a clock check."""

_SURROGATE = re.compile("[\ud800-\udfff]")

# a bracket, or a whole string (to the end of the text if it is never closed), matched without
# backtracking so that the scan stays linear whatever the text
_TOKEN = re.compile(r'[\[\]{}]|"(?:[^"\\]++|\\.)*+"?', re.DOTALL)


def encode_record(metadata: WorkerMetadata) -> bytes:
    """The record of ``metadata`` in schema version 1.

    Raises :class:`InvalidRecord` for a record no reader would accept, with the reason a reader
    would give: ``extra`` not JSON-serialisable or nested deeper than :data:`MAX_DEPTH`, a field
    of the wrong type (a ``bool`` pid, say), a str holding a surrogate code point (the message
    names the field), or a record over :data:`MAX_RECORD_BYTES`.

    Implementation notes:
        The encoded record is read back with :func:`decode_record`, so the two cannot disagree
        on what a reader accepts.
    """
    try:
        document = {
            "schema": SCHEMA_VERSION,
            "uid": str(metadata.uid),
            "address": metadata.address,
            "pid": metadata.pid,
            "version": metadata.version,
            "tags": sorted(metadata.tags),
            "extra": dict(metadata.extra),
        }
        if metadata.published is not None:
            document["published"] = metadata.published
        data = json.dumps(document, separators=(",", ":"), sort_keys=True).encode()
    except (TypeError, ValueError, RecursionError) as error:
        raise InvalidRecord(
            "malformed",
            f"worker {metadata.uid}: tags or extra is not JSON-serialisable"
            f" ({type(error).__name__}: {error})",
        ) from None
    for name in ("address", "version", "tags", "extra"):
        text = _surrogate_text(document[name])
        if text is not None:
            raise InvalidRecord(
                "malformed",
                f"worker {metadata.uid}: record field {name!r} holds {text!r}, which is not"
                " Unicode text (a surrogate code point)",
            )
    try:
        decode_record(data)
    except InvalidRecord as error:
        raise InvalidRecord(error.reason, f"worker {metadata.uid}: {error}") from None
    return data


def decode_record(data: bytes) -> WorkerMetadata:
    """The worker described by ``data``; :class:`InvalidRecord` names what is wrong with it.

    This is the only exception it raises, whatever ``data`` holds.
    """
    document = load_document(data, "record", max_bytes=MAX_RECORD_BYTES, schema=SCHEMA_VERSION)
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
    published = document.get("published")
    if published is not None and not (
        (_is_int(published) or isinstance(published, float))
        and math.isfinite(published)
        and 0 <= published <= MAX_PUBLISHED
    ):
        raise InvalidRecord(
            "malformed",
            f"record field 'published' is not a time from 0 to {MAX_PUBLISHED:.0f}: {published!r}",
        )
    return WorkerMetadata(
        uid=parsed_uid,
        address=_field(document, "address", str),
        pid=pid,
        version=_field(document, "version", str),
        tags=frozenset(tags),
        extra=MappingProxyType(extra),
        published=None if published is None else float(published),
    )


def stamped(metadata: WorkerMetadata) -> WorkerMetadata:
    """``metadata`` with ``published`` set to now (``time.time()``): what a publisher puts."""
    return dataclasses.replace(metadata, published=time.time())


def load_document(data: bytes, what: str, *, max_bytes: int, schema: int) -> dict[str, Any]:
    """``data`` read as a JSON object of schema version ``schema`` (its ``"schema"`` field), the
    versioned form every stored record here takes; :class:`InvalidRecord` otherwise, with the
    reason ``"oversized"`` (over ``max_bytes``), ``"malformed"`` (see :func:`load_json`; or not
    an object) or ``"unknown-schema"`` (no version, or another one)."""
    if len(data) > max_bytes:
        raise InvalidRecord("oversized", f"{what} of {len(data)} bytes exceeds {max_bytes}")
    document = load_json(data, what)
    if not isinstance(document, dict):
        raise InvalidRecord("malformed", f"{what} is a {type(document).__name__}, not an object")
    version = document.get("schema")
    if not _is_int(version) or version != schema:
        raise InvalidRecord("unknown-schema", f"{what} has schema {version!r}, not {schema}")
    return document


def load_json(data: bytes, what: str, *, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON value in ``data``, refused as :class:`InvalidRecord` (``"malformed"``, the
    message starting with ``what``) if it is not JSON, nests deeper than ``max_depth`` or holds
    a str (a key or a value) that is not Unicode text (a lone surrogate, escaped or not).

    Implementation notes:
        The text is decoded as ``json.loads`` would decode the bytes, then its depth measured
        by a linear scan of its brackets and strings (a few milliseconds at worst for
        :data:`MAX_RECORD_BYTES`), so the decoder, which recurses once per level, never meets a
        deeper document.
    """
    try:
        text = data.decode(json.detect_encoding(data), "surrogatepass")
    except UnicodeDecodeError as error:
        raise InvalidRecord("malformed", f"{what} is not JSON: {error}") from None
    if _deeper_than(text, max_depth):
        raise InvalidRecord("malformed", f"{what} nests deeper than {max_depth} levels")
    try:
        document = json.loads(text)
    except ValueError as error:
        raise InvalidRecord("malformed", f"{what} is not JSON: {error}") from None
    lone = _surrogate_text(document)
    if lone is not None:
        raise InvalidRecord(
            "malformed", f"{what} holds {lone!r}, which is not Unicode text (a lone surrogate)"
        )
    return document


def _surrogate_text(value: Any) -> str | None:
    """The first str in the JSON-serialisable ``value`` (dict keys included) that holds a
    surrogate code point, or ``None``. Iterative, so any nesting ``json.dumps`` took is fine."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return item
        elif isinstance(item, dict):
            pending.extend(item)
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)
    return None


def _deeper_than(text: str, limit: int) -> bool:
    """Whether the arrays and objects of the JSON ``text`` nest deeper than ``limit``
    (brackets inside strings do not count; invalid JSON is left for the decoder to refuse)."""
    if text.count("[") + text.count("{") <= limit:
        return False
    depth = 0
    for token in _TOKEN.findall(text):
        if token == "[" or token == "{":
            depth += 1
            if depth > limit:
                return True
        elif token == "]" or token == "}":
            depth -= 1
    return False


def _is_int(value: object) -> bool:
    # bool is an int to isinstance, but never a count, a version or a pid
    return isinstance(value, int) and not isinstance(value, bool)


def _field(document: dict[str, Any], name: str, kind: type[Any]) -> Any:
    value = document.get(name)
    if not (_is_int(value) if kind is int else isinstance(value, kind)):
        raise InvalidRecord(
            "malformed", f"record field {name!r} is not a {kind.__name__}: {value!r}"
        )
    return value
