"""The documents a :class:`~shardline.topology.sources.NotificationSource` reads: Picodata's
topology notifications as its accepted ADR specifies them, parsed and validated into topology
events.

Picodata has not shipped these notifications yet; the format is the one of the ADR
``doc/adr/2025-09-12-pgproto-topology-notifications.md`` (repository picodata/picodata,
status "accepted"). docs/notifications.md says where the ADR's own examples disagree with it
and what this parser does about each.

The document format (JSON, UTF-8)
=================================

Every document is one flat object: one change to one row of one catalog table::

    {"op": "replace" | "delete",
     "map": "replicaset" | "instance" | "bucket",   # the table, without its "_pico_" prefix
     "timestamp": "2025-08-19T11:24:28+00:00",      # optional, string or number; not used
     "raft": {"term": 1, "index": 2},               # the raft entry the change committed in
     ...fields of the map}

- ``"replicaset"`` (``_pico_replicaset``): ``replicaset_uuid``; in a ``replace`` also
  ``tier`` and ``current_master_uuid``, each optional.
- ``"instance"`` (``_pico_instance`` and ``_pico_peer_address``): ``instance_uuid``; in a
  ``replace`` also ``replicaset_uuid``, ``current_state`` (``"Online"``, ``"Offline"``,
  ``"Expelled"``) and ``address``, each optional.
- ``"bucket"`` (``_pico_bucket``): ``tier``, ``bucket_id: {"start", "end"}`` (inclusive,
  bucket ids from 1), ``current_replicaset_uuid`` and ``state`` (optional, ``"active"`` if
  absent; requests follow ``current_replicaset_uuid`` whatever the state).

In a ``replace`` a field that is absent or ``null`` is left unchanged. Unknown keys are
ignored, and so is a document whose ``map`` is another table (the ADR requires that event
types can be added): it parses to an :class:`EventDocument` whose ``event`` is ``None``.
A trailing comma before a closing brace or bracket is accepted, as every example of the ADR
has one. A text whose escapes decode to a lone surrogate (``"\\ud800"``) is refused.

The *snapshot* is, as in the ADR, a burst of ``replace`` documents (replicasets, then
instances, then bucket ranges) sent before the stream: :func:`parse_snapshot` reads one. It
holds every change up to its raft position (the highest of its documents), and nothing after.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias

from shardline.topology.events import BucketEvent, InstanceEvent, Op, ReplicasetEvent
from shardline.topology.sources.state import CountedFailure, FailureReason

__all__ = [
    "DEFAULT_MAX_DOCUMENT",
    "DEFAULT_MAX_SNAPSHOT",
    "MAPS",
    "MAX_TEXT",
    "DocumentError",
    "EventDocument",
    "MapName",
    "RaftPosition",
    "SnapshotDocument",
    "TopologyEvent",
    "parse_event_document",
    "parse_snapshot",
]

TopologyEvent: TypeAlias = InstanceEvent | ReplicasetEvent | BucketEvent

MapName: TypeAlias = Literal["replicaset", "instance", "bucket"]
"""The maps a notification document may name."""

MAPS: Final[tuple[MapName, ...]] = ("replicaset", "instance", "bucket")
"""The ``map`` values whose documents become events; other maps are ignored."""

MAX_TEXT: Final = 1024
"""Longest name, state, address or tier text accepted in a document."""

MAX_BUCKET_ID: Final = 2**32 - 1

MAX_MAP_NAME: Final = 64
"""Longest ``map`` value accepted (an ignored map's name is logged)."""

DEFAULT_MAX_DOCUMENT: Final = 8000
"""Default bound on one document, in bytes: what PostgreSQL's ``NOTIFY`` accepts. A document
carries one instance, replicaset or bucket range: a few hundred bytes with real names, at most
about 2.3 KB with ASCII texts at :data:`MAX_TEXT`."""

DEFAULT_MAX_SNAPSHOT: Final = 64 << 20
"""Default bound on a whole snapshot burst, in bytes."""


_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")

# a JSON string (kept), or a comma that follows the end of a value and whose next non-blank
# character closes an object or array (dropped): `{,}` and `[1,,]` stay malformed
_STRING_OR_TRAILING_COMMA = re.compile(
    r'"(?:[^"\\]|\\.)*"|(?<=[0-9A-Za-z"}\]])\s*,(?=\s*[}\]])', re.DOTALL
)


# ---------------------------------------------------------------------------------------------
# documents


@dataclass(frozen=True, order=True, slots=True)
class RaftPosition:
    """Where a change sits in the cluster's raft log; positions compare as ``(term, index)``."""

    term: int
    index: int

    def __str__(self) -> str:
        return f"{self.term}:{self.index}"


class DocumentError(CountedFailure, ValueError):
    """A document that cannot be used; ``reason`` is the :class:`FailureReason` it counts as."""


@dataclass(frozen=True, slots=True)
class EventDocument:
    """One decoded document: its raft position, its ``map``, and its event (``None`` for a
    map that is not one of :data:`MAPS`, which the reader ignores)."""

    position: RaftPosition
    map: str
    event: TopologyEvent | None


@dataclass(frozen=True, slots=True)
class SnapshotDocument:
    """One decoded snapshot burst: the whole topology at ``position``.

    ``replicasets`` and ``instances`` hold one event per uuid (documents about the same one
    merged in order, as applying them would); ``buckets`` maps each tier with ranges to them,
    sorted. ``ignored`` counts documents of maps that are not followed.
    """

    position: RaftPosition
    replicasets: tuple[ReplicasetEvent, ...]
    instances: tuple[InstanceEvent, ...]
    buckets: Mapping[str, tuple[BucketEvent, ...]]
    ignored: int = 0


def parse_event_document(
    document: str | bytes, *, max_size: int = DEFAULT_MAX_DOCUMENT
) -> EventDocument:
    """Decodes and validates one document (the format is in the module docstring).

    Raises :class:`DocumentError`: ``too-large`` for a document over ``max_size`` bytes,
    ``malformed-row`` for anything else wrong, naming the field and its value. Uuids come out
    canonical (lower case, hyphenated), so equal events compare equal.
    """
    body = _load(document, max_size)
    position = _position(body)
    op = body.get("op")
    if op not in ("replace", "delete"):
        raise _malformed(f"'op' must be 'replace' or 'delete', got {_show(op)}")
    name = body.get("map")
    if not isinstance(name, str) or not name or len(name) > MAX_MAP_NAME:
        raise _malformed(f"'map' must be a table name such as 'replicaset', got {_show(name)}")
    _timestamp(body)
    event: TopologyEvent | None
    if name == "bucket":
        event = _bucket_event(body, op)
    elif name == "instance":
        event = _instance_event(body, op)
    elif name == "replicaset":
        event = _replicaset_event(body, op)
    else:
        _check_text("map", name)
        event = None
    return EventDocument(position, name, event)


def parse_snapshot(
    documents: Iterable[str | bytes],
    *,
    max_document: int = DEFAULT_MAX_DOCUMENT,
    max_size: int = DEFAULT_MAX_SNAPSHOT,
) -> SnapshotDocument:
    """Decodes and validates a snapshot burst: ``replace`` documents, in any order.

    Each document is read as by :func:`parse_event_document` (bounded by ``max_document``);
    the burst as a whole is bounded by ``max_size`` bytes. Documents about one replicaset or
    instance are merged in order; each tier's bucket ranges must not overlap (the same range
    twice is one). An empty burst is an empty cluster at position 0:0. Raises
    :class:`DocumentError` (``too-large``, ``malformed-row`` — also for a ``delete`` in the
    burst —, or ``malformed-buckets`` for overlapping ranges); nothing of a refused burst is
    used.
    """
    total = 0
    position = RaftPosition(0, 0)
    ignored = 0
    replicasets: dict[str, ReplicasetEvent] = {}
    instances: dict[str, InstanceEvent] = {}
    ranges: dict[str, dict[tuple[int, int], BucketEvent]] = {}
    for number, document in enumerate(documents, 1):
        total += _size(document)
        if total > max_size:
            raise DocumentError(
                FailureReason.TOO_LARGE,
                f"snapshot burst is over the limit of {max_size} bytes at document {number}",
            )
        try:
            decoded = parse_event_document(document, max_size=max_document)
        except DocumentError as error:
            raise DocumentError(error.reason, f"snapshot document {number}: {error}") from None
        position = max(position, decoded.position)
        event = decoded.event
        if event is None:
            ignored += 1
            continue
        if event.op != "replace":
            raise _malformed(
                f"snapshot document {number} is a {event.op!r}: a snapshot is replace events"
            )
        if isinstance(event, ReplicasetEvent):
            known = replicasets.get(event.replicaset_uuid)
            replicasets[event.replicaset_uuid] = event if known is None else _merged(known, event)
        elif isinstance(event, InstanceEvent):
            held = instances.get(event.instance_uuid)
            instances[event.instance_uuid] = event if held is None else _merged(held, event)
        else:
            ranges.setdefault(event.tier, {})[(event.start, event.end)] = event
    buckets: dict[str, tuple[BucketEvent, ...]] = {}
    for tier, by_range in sorted(ranges.items()):
        tier_ranges = sorted(by_range.values(), key=lambda b: (b.start, b.end))
        for before, after in itertools.pairwise(tier_ranges):
            if after.start <= before.end:
                raise DocumentError(
                    FailureReason.MALFORMED_BUCKETS,
                    f"snapshot ranges [{before.start}, {before.end}] and"
                    f" [{after.start}, {after.end}] of tier {tier!r} overlap",
                )
        buckets[tier] = tuple(tier_ranges)
    return SnapshotDocument(
        position=position,
        replicasets=tuple(replicasets.values()),
        instances=tuple(instances.values()),
        buckets=buckets,
        ignored=ignored,
    )


def _merged(held: ReplicasetEvent | InstanceEvent, later: ReplicasetEvent | InstanceEvent) -> Any:
    """``held`` with the fields ``later`` gives (a replace leaves an absent field unchanged)."""
    changes = {
        name: value for name in held.__slots__ if (value := getattr(later, name)) is not None
    }
    return type(held)(**{name: getattr(held, name) for name in held.__slots__} | changes)


def _size(document: str | bytes) -> int:
    if isinstance(document, str):
        if document.isascii():
            return len(document)
        # surrogatepass: a lone surrogate is sized here, and refused by the field holding it
        return len(document.encode("utf-8", "surrogatepass"))
    if isinstance(document, bytes | bytearray):
        return len(document)
    raise _malformed(f"a document must be str or bytes, got {type(document).__name__}")


def _load(document: str | bytes, max_size: int) -> dict[str, Any]:
    size = _size(document)
    if size > max_size:
        raise DocumentError(
            FailureReason.TOO_LARGE, f"document of {size} bytes is over the limit of {max_size}"
        )
    try:
        body = json.loads(document)
    except RecursionError as error:
        raise _malformed(f"document is not JSON: {error}") from None
    except ValueError as error:
        body = _without_trailing_commas(document, error)
    if not isinstance(body, dict):
        raise _malformed(f"document must be a JSON object, got {type(body).__name__}")
    return body


def _without_trailing_commas(document: str | bytes, error: ValueError) -> Any:
    """The document read once more with its trailing commas dropped (the ADR's examples all
    have one); the first error if it is still not JSON."""
    text = document
    if not isinstance(text, str):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError:
            raise _malformed(f"document is not JSON: {error}") from None
    stripped = _STRING_OR_TRAILING_COMMA.sub(lambda m: m[0] if m[0][0] == '"' else "", text)
    if stripped == text:
        raise _malformed(f"document is not JSON: {error}") from None
    try:
        return json.loads(stripped)
    except (ValueError, RecursionError):
        raise _malformed(f"document is not JSON: {error}") from None


def _malformed(message: str) -> DocumentError:
    return DocumentError(FailureReason.MALFORMED_ROW, message)


def _show(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:80] + "…"


def _position(body: Mapping[str, Any]) -> RaftPosition:
    raft = body.get("raft")
    if not isinstance(raft, dict):
        raise _malformed(f"'raft' must be an object {{term, index}}, got {_show(raft)}")
    parts = []
    for name in ("term", "index"):
        value = raft.get(name)
        # the ADR's Raft struct holds two u64
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
            raise _malformed(f"'raft.{name}' must be an unsigned 64-bit int, got {_show(value)}")
        parts.append(value)
    return RaftPosition(parts[0], parts[1])


def _timestamp(body: Mapping[str, Any]) -> None:
    value = body.get("timestamp")
    if value is None or isinstance(value, str):
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _malformed(f"'timestamp' must be a string or a number, got {_show(value)}")


def _check_text(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise _malformed(f"'{name}' must be a non-empty string, got {_show(value)}")
    if len(value) > MAX_TEXT:
        raise _malformed(f"'{name}' of length {len(value)} is over the limit of {MAX_TEXT}")
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:
            raise _malformed(f"'{name}' holds a lone surrogate: {_show(value)}") from None
    return value


def _text(fields: Mapping[str, Any], name: str, *, required: bool = False) -> str | None:
    value = fields.get(name)
    if value is None and not required:
        return None
    return _check_text(name, value)


def _uuid(fields: Mapping[str, Any], name: str, *, required: bool = False) -> str | None:
    value = fields.get(name)
    if value is None and not required:
        return None
    if isinstance(value, str) and _CANONICAL_UUID.match(value):
        return value
    if isinstance(value, str) and len(value) <= 64:
        with contextlib.suppress(ValueError):
            return str(uuid.UUID(value))
    raise _malformed(f"'{name}' must be a UUID string, got {_show(value)}")


def _bound(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_BUCKET_ID:
        raise _malformed(f"'bucket_id.{name}' must be a bucket id (int >= 1), got {_show(value)}")
    return value


def _bucket_event(fields: Mapping[str, Any], op: Op) -> BucketEvent:
    ids = fields.get("bucket_id")
    if not isinstance(ids, dict):
        raise _malformed(f"'bucket_id' must be an object {{start, end}}, got {_show(ids)}")
    start, end = _bound(ids.get("start"), "start"), _bound(ids.get("end"), "end")
    if start > end:
        raise _malformed(f"bucket range start {start} is greater than end {end}")
    tier = _text(fields, "tier", required=True)
    owner = _uuid(fields, "current_replicaset_uuid", required=True)
    state = _text(fields, "state") or "active"
    assert tier is not None
    assert owner is not None
    return BucketEvent(tier, start, end, owner, state=state, op=op)


def _instance_event(fields: Mapping[str, Any], op: Op) -> InstanceEvent:
    key = _uuid(fields, "instance_uuid", required=True)
    assert key is not None
    if op == "delete":
        return InstanceEvent("delete", key)
    return InstanceEvent(
        "replace",
        key,
        replicaset_uuid=_uuid(fields, "replicaset_uuid"),
        current_state=_text(fields, "current_state"),
        address=_text(fields, "address"),
    )


def _replicaset_event(fields: Mapping[str, Any], op: Op) -> ReplicasetEvent:
    key = _uuid(fields, "replicaset_uuid", required=True)
    assert key is not None
    if op == "delete":
        return ReplicasetEvent("delete", key)
    return ReplicasetEvent(
        "replace",
        key,
        tier=_text(fields, "tier"),
        current_master_uuid=_uuid(fields, "current_master_uuid"),
    )
