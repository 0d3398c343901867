"""The documents a :class:`~shardline.topology.sources.NotificationSource` reads: parsing and
validating event and snapshot documents into topology events.

The document format (JSON, UTF-8)
=================================

An *event document* is one ADR event::

    {"op": "replace" | "delete",
     "map": {...},                       # the fields of one EventInstance / EventReplicaset /
                                         # EventBuckets, told apart by their keys (below)
     "timestamp": 1767225600.25,         # optional, number or string; informational only
     "raft": {"term": 3, "index": 1042}} # the raft entry the change was committed in

``map`` is an *EventBuckets* if it has ``bucket_id``: ``{"tier", "bucket_id": {"start", "end"},
"current_replicaset_uuid", "state"?}``; else an *EventInstance* if it has ``instance_uuid``:
``{"instance_uuid", "replicaset_uuid"?, "current_state"?, "address"?}``; else an
*EventReplicaset* if it has ``replicaset_uuid``: ``{"replicaset_uuid", "tier"?,
"current_master_uuid"?}``. In a ``"replace"`` a field that is absent or ``null`` is left
unchanged. Unknown keys are ignored, so fields can be added without breaking readers. A text
whose escapes decode to a lone surrogate (``"\\ud800"``) makes the document malformed.

The *snapshot document* is the whole topology at one raft position::

    {"raft": {"term": 3, "index": 1040},
     "timestamp": ...,                   # optional
     "tiers": {"default": 3000, ...},    # tier name -> bucket count
     "replicasets": [{EventReplicaset map}, ...],   # every replicaset (with its tier)
     "instances": [{EventInstance map}, ...],       # every instance
     "buckets": [{EventBuckets map}, ...]}          # every bucket range of every tier

It holds every change up to and including its position, and nothing after.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

from shardline.topology.events import BucketEvent, InstanceEvent, Op, ReplicasetEvent
from shardline.topology.sources.state import FailureReason

__all__ = [
    "DEFAULT_MAX_DOCUMENT",
    "DEFAULT_MAX_SNAPSHOT",
    "MAX_TEXT",
    "DocumentError",
    "EventDocument",
    "RaftPosition",
    "SnapshotDocument",
    "TopologyEvent",
    "parse_event_document",
    "parse_snapshot_document",
]

TopologyEvent: TypeAlias = InstanceEvent | ReplicasetEvent | BucketEvent

MAX_TEXT: Final = 1024
"""Longest name, state, address or tier text accepted in a document."""

MAX_BUCKET_ID: Final = 2**32 - 1

DEFAULT_MAX_DOCUMENT: Final = 8000
"""Default bound on an event document, in bytes: what PostgreSQL's ``NOTIFY`` accepts. An event
carries one instance, replicaset or bucket range: a few hundred bytes with real names, at most
about 2.3 KB with ASCII texts at :data:`MAX_TEXT`; so an event is never chunked."""

DEFAULT_MAX_SNAPSHOT: Final = 64 << 20
"""Default bound on a snapshot document, in bytes."""


_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")


# ---------------------------------------------------------------------------------------------
# documents


@dataclass(frozen=True, order=True, slots=True)
class RaftPosition:
    """Where a change sits in the cluster's raft log; positions compare as ``(term, index)``."""

    term: int
    index: int

    def __str__(self) -> str:
        return f"{self.term}:{self.index}"


class DocumentError(ValueError):
    """A document that cannot be used; ``reason`` is the :class:`FailureReason` it counts as."""

    def __init__(self, reason: FailureReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class EventDocument:
    """One decoded event document: the event and the raft position it was committed at."""

    position: RaftPosition
    event: TopologyEvent


@dataclass(frozen=True, slots=True)
class SnapshotDocument:
    """One decoded snapshot document: the whole topology at ``position``.

    ``buckets`` maps every tier of ``tiers`` to its ranges (empty for a tier without any).
    """

    position: RaftPosition
    tiers: Mapping[str, int]
    replicasets: tuple[ReplicasetEvent, ...]
    instances: tuple[InstanceEvent, ...]
    buckets: Mapping[str, tuple[BucketEvent, ...]]


def parse_event_document(
    document: str | bytes, *, max_size: int = DEFAULT_MAX_DOCUMENT
) -> EventDocument:
    """Decodes and validates one event document (the format is in the module docstring).

    Raises :class:`DocumentError`: ``too-large`` for a document over ``max_size`` bytes,
    ``malformed-row`` for anything else wrong, naming the field. Uuids come out canonical
    (lower case, hyphenated), so equal events compare equal.
    """
    body = _load(document, max_size, "event document")
    position = _position(body)
    op = body.get("op")
    if op not in ("replace", "delete"):
        raise _malformed(f"'op' must be 'replace' or 'delete', got {_show(op)}")
    fields = body.get("map")
    if not isinstance(fields, dict):
        raise _malformed(f"'map' must be an object, got {_show(fields)}")
    _timestamp(body)
    kind = _kind(fields)
    event: TopologyEvent
    if kind == "buckets":
        event = _bucket_event(fields, op)
    elif kind == "instance":
        event = _instance_event(fields, op)
    else:
        event = _replicaset_event(fields, op)
    return EventDocument(position, event)


def parse_snapshot_document(
    document: str | bytes, *, max_size: int = DEFAULT_MAX_SNAPSHOT
) -> SnapshotDocument:
    """Decodes and validates a snapshot document (the format is in the module docstring).

    Besides each entry's fields, checks that uuids are unique, every replicaset names its
    tier, and every bucket range lies in a listed tier, within its bucket count, without
    overlapping another. Raises :class:`DocumentError` (``too-large``, ``malformed-row``, or
    ``malformed-buckets`` for the ranges).
    """
    body = _load(document, max_size, "snapshot document")
    position = _position(body)
    _timestamp(body)
    tiers = body.get("tiers")
    if not isinstance(tiers, dict):
        raise _malformed(f"snapshot 'tiers' must be an object, got {_show(tiers)}")
    counts: dict[str, int] = {}
    for name, count in tiers.items():
        _check_text("tiers", name)
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_BUCKET_ID:
            raise _malformed(f"tier {name!r} has bucket count {_show(count)}")
        counts[name] = count

    replicasets: dict[str, ReplicasetEvent] = {}
    for fields in _entries(body, "replicasets"):
        event = _replicaset_event(fields, "replace")
        if event.tier is None:
            raise _malformed(f"snapshot replicaset {event.replicaset_uuid} has no 'tier'")
        if replicasets.setdefault(event.replicaset_uuid, event) is not event:
            raise _malformed(f"snapshot lists replicaset {event.replicaset_uuid} twice")
    instances: dict[str, InstanceEvent] = {}
    for fields in _entries(body, "instances"):
        instance = _instance_event(fields, "replace")
        if instances.setdefault(instance.instance_uuid, instance) is not instance:
            raise _malformed(f"snapshot lists instance {instance.instance_uuid} twice")
    ranges: dict[str, list[BucketEvent]] = {name: [] for name in counts}
    for fields in _entries(body, "buckets"):
        bucket = _bucket_event(fields, "replace")
        if bucket.tier not in ranges:
            raise DocumentError(
                FailureReason.MALFORMED_BUCKETS,
                f"snapshot range [{bucket.start}, {bucket.end}] is in tier {bucket.tier!r},"
                " which is not in 'tiers'",
            )
        ranges[bucket.tier].append(bucket)
    buckets: dict[str, tuple[BucketEvent, ...]] = {}
    for tier, tier_ranges in ranges.items():
        tier_ranges.sort(key=lambda b: b.start)
        for before, after in itertools.pairwise(tier_ranges):
            if after.start <= before.end:
                raise DocumentError(
                    FailureReason.MALFORMED_BUCKETS,
                    f"snapshot ranges [{before.start}, {before.end}] and"
                    f" [{after.start}, {after.end}] of tier {tier!r} overlap",
                )
        if tier_ranges and tier_ranges[-1].end > counts[tier]:
            last = tier_ranges[-1]
            raise DocumentError(
                FailureReason.MALFORMED_BUCKETS,
                f"snapshot range [{last.start}, {last.end}] is beyond the bucket count"
                f" {counts[tier]} of tier {tier!r}",
            )
        buckets[tier] = tuple(tier_ranges)
    return SnapshotDocument(
        position=position,
        tiers=counts,
        replicasets=tuple(replicasets.values()),
        instances=tuple(instances.values()),
        buckets=buckets,
    )


def _load(document: str | bytes, max_size: int, what: str) -> dict[str, Any]:
    if isinstance(document, str):
        size = len(document)
        if not document.isascii():
            # surrogatepass: a lone surrogate is sized here, and refused by the field holding it
            size = len(document.encode("utf-8", "surrogatepass"))
    elif isinstance(document, bytes | bytearray):
        size = len(document)
    else:
        raise _malformed(f"{what} must be str or bytes, got {type(document).__name__}")
    if size > max_size:
        raise DocumentError(
            FailureReason.TOO_LARGE, f"{what} of {size} bytes is over the limit of {max_size}"
        )
    try:
        body = json.loads(document)
    except (ValueError, RecursionError) as error:
        raise _malformed(f"{what} is not JSON: {error}") from None
    if not isinstance(body, dict):
        raise _malformed(f"{what} must be a JSON object, got {type(body).__name__}")
    return body


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
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
            raise _malformed(f"'raft.{name}' must be a non-negative int, got {_show(value)}")
        parts.append(value)
    return RaftPosition(parts[0], parts[1])


def _timestamp(body: Mapping[str, Any]) -> None:
    value = body.get("timestamp")
    if value is None or isinstance(value, str):
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _malformed(f"'timestamp' must be a number or a string, got {_show(value)}")


def _kind(fields: Mapping[str, Any]) -> str:
    if "bucket_id" in fields:
        if "instance_uuid" in fields:
            raise _malformed("'map' has both 'bucket_id' and 'instance_uuid'")
        return "buckets"
    if "instance_uuid" in fields:
        return "instance"
    if "replicaset_uuid" in fields:
        return "replicaset"
    raise _malformed(
        "'map' is none of EventBuckets (bucket_id), EventInstance (instance_uuid) or"
        f" EventReplicaset (replicaset_uuid): keys {sorted(map(str, fields))[:8]}"
    )


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


def _entries(body: Mapping[str, Any], name: str) -> list[dict[str, Any]]:
    entries = body.get(name, [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise _malformed(f"snapshot '{name}' must be an array of objects")
    return entries


# ---------------------------------------------------------------------------------------------
# the transport
