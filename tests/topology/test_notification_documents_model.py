"""The ADR document parser against a small reference written from docs/notifications.md.

Hypothesis draws documents whose every field is either right or one of a few wrong values
(absent, null, wrong type, empty, too long, not a uuid, a bucket id out of range), serialised
with or without the ADR's trailing comma; the reference says what the document must become: an
event, "ignored" (another map), or refused. A second property drives snapshot bursts: the
parser's merge of replace documents against applying them one by one to dictionaries.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import hypothesis
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardline import BucketEvent, InstanceEvent, ReplicasetEvent
from shardline.topology.sources.notification_documents import (
    DocumentError,
    RaftPosition,
    parse_event_document,
    parse_snapshot,
)
from support.notify_documents import Event, event_document
from support.strategies import bucket_events, instance_events, replicaset_events

ABSENT = object()
GOOD_UUID = "9e273105-5af8-4f77-8f47-3d9a68f772ca"


def _either(good: list[Any], bad: list[Any]) -> st.SearchStrategy[Any]:
    """A right value six times in seven, so accepted documents are common."""
    right, wrong = st.sampled_from(good), st.sampled_from(bad)
    return st.integers(0, 6).flatmap(lambda n: right if n else wrong)


SHORT_UUID = "268a62a-8af6-4a3d-9f24-23e6c5f4bb32"
UUIDS = _either(
    [GOOD_UUID, GOOD_UUID.upper(), "{" + GOOD_UUID + "}", None, ABSENT],
    [SHORT_UUID, "r1", "", 5],
)
TEXTS = _either(["default", "Online", "é", None, ABSENT], ["", "x" * 1025, 7, []])
IDS = _either([1, 2, 1000, 2**32 - 1], [0, -1, 2**32, True, "1", 1.0, None, ABSENT])
INTS = _either([0, 1, 7, 2**64 - 1], [2**64, -1, True, "1", None, ABSENT])
TIMESTAMPS = _either(["2025-08-19T11:24:28+00:00", 1.5, 3, ABSENT], [float("nan"), True, [1]])
OPS = _either(["replace", "delete"], ["upsert", None, ABSENT])
MAPS = _either(["replicaset", "instance", "bucket", "plugin"], ["", {"x": 1}, None, ABSENT])
SHAPES = _either(["object"], ["list", ABSENT])


def _put(body: dict[str, Any], name: str, value: Any) -> None:
    if value is not ABSENT:
        body[name] = value


def _put_pair(
    draw: st.DrawFn,
    body: dict[str, Any],
    name: str,
    keys: tuple[str, str],
    values: st.SearchStrategy[Any],
) -> None:
    """``body[name]``: an object of ``keys`` drawn from ``values`` (either absent), a list,
    or absent."""
    shape = draw(SHAPES)
    if shape == "object":
        pair: dict[str, Any] = {}
        for key in keys:
            _put(pair, key, draw(values))
        body[name] = pair
    elif shape == "list":
        body[name] = [1, 2]


@st.composite
def documents(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {}
    _put(body, "op", draw(OPS))
    _put(body, "map", draw(MAPS))
    _put(body, "timestamp", draw(TIMESTAMPS))
    _put_pair(draw, body, "raft", ("term", "index"), INTS)
    for name in ("replicaset_uuid", "instance_uuid", "current_master_uuid"):
        _put(body, name, draw(UUIDS))
    _put(body, "current_replicaset_uuid", draw(UUIDS))
    for name in ("tier", "current_state", "address", "state"):
        _put(body, name, draw(TEXTS))
    _put_pair(draw, body, "bucket_id", ("start", "end"), IDS)
    return body


class Refused(Exception):
    pass


def _uuid(body: dict[str, Any], name: str, required: bool) -> str | None:
    value = body.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise Refused(name)
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise Refused(name) from None


def _text(body: dict[str, Any], name: str, required: bool = False) -> str | None:
    value = body.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= 1024:
        raise Refused(name)
    return value


def _id(value: Any) -> int:
    if type(value) is not int or not 1 <= value <= 2**32 - 1:
        raise Refused("bucket_id")
    return value


def reference(body: dict[str, Any]) -> tuple[RaftPosition, Event | str]:
    """What the document must become; raises Refused if it must be refused."""
    raft = body.get("raft")
    if not isinstance(raft, dict):
        raise Refused("raft")
    term, index = raft.get("term"), raft.get("index")
    for value in (term, index):
        if type(value) is not int or not 0 <= value < 2**64:
            raise Refused("raft")
    op = body.get("op")
    if op not in ("replace", "delete"):
        raise Refused("op")
    name = body.get("map")
    if not isinstance(name, str) or not name:
        raise Refused("map")
    stamp = body.get("timestamp")
    if not (
        stamp is None or isinstance(stamp, str) or (type(stamp) in (int, float) and stamp == stamp)
    ):
        raise Refused("timestamp")
    position = RaftPosition(term, index)
    if name == "replicaset":
        key = _uuid(body, "replicaset_uuid", True)
        assert key is not None
        if op == "delete":
            return position, ReplicasetEvent("delete", key)
        tier = _text(body, "tier")
        return position, ReplicasetEvent(
            "replace", key, tier, _uuid(body, "current_master_uuid", False)
        )
    if name == "instance":
        key = _uuid(body, "instance_uuid", True)
        assert key is not None
        if op == "delete":
            return position, InstanceEvent("delete", key)
        return position, InstanceEvent(
            "replace",
            key,
            _uuid(body, "replicaset_uuid", False),
            _text(body, "current_state"),
            _text(body, "address"),
        )
    if name == "bucket":
        ids = body.get("bucket_id")
        if not isinstance(ids, dict):
            raise Refused("bucket_id")
        start, end = _id(ids.get("start")), _id(ids.get("end"))
        if start > end:
            raise Refused("bucket_id")
        tier = _text(body, "tier", True)
        owner = _uuid(body, "current_replicaset_uuid", True)
        state = _text(body, "state") or "active"
        assert tier is not None
        assert owner is not None
        return position, BucketEvent(tier, start, end, owner, state=state, op=op)
    return position, "ignored"


@settings(max_examples=1500)
@given(body=documents(), trailing_comma=st.booleans(), as_bytes=st.booleans())
def test_the_parser_agrees_with_the_reference(
    body: dict[str, Any], trailing_comma: bool, as_bytes: bool
) -> None:
    text = json.dumps(body)
    if trailing_comma and body:
        text = text[:-1] + ",\n}"
    document: str | bytes = text.encode() if as_bytes else text
    try:
        expected: tuple[RaftPosition, Event | str] | None = reference(body)
    except Refused:
        expected = None
    if expected is None:
        hypothesis.event("refused")
        with pytest.raises(DocumentError) as refused:
            parse_event_document(document)
        assert refused.value.reason == "malformed-row"
        return
    hypothesis.event("accepted")
    decoded = parse_event_document(document)
    position, event = expected
    assert decoded.position == position
    assert decoded.event == (None if event == "ignored" else event)
    assert decoded.map == body["map"]


replace_events = (
    instance_events.filter(lambda e: e.op == "replace")
    | replicaset_events.filter(lambda e: e.op == "replace")
    | bucket_events(op=st.just("replace"))
)


@settings(max_examples=300)
@given(
    drawn=st.lists(st.tuples(replace_events, st.integers(0, 3), st.integers(0, 50)), max_size=12)
)
def test_a_burst_is_its_replace_documents_applied_in_order(
    drawn: list[tuple[Event, int, int]],
) -> None:
    replicasets: dict[str, dict[str, Any]] = {}
    instances: dict[str, dict[str, Any]] = {}
    ranges: dict[tuple[str, int, int], BucketEvent] = {}
    for event, _, _ in drawn:
        if isinstance(event, BucketEvent):
            ranges[(event.tier, event.start, event.end)] = event
            continue
        held = replicasets if isinstance(event, ReplicasetEvent) else instances
        key = event.replicaset_uuid if isinstance(event, ReplicasetEvent) else event.instance_uuid
        fields = {n: getattr(event, n) for n in event.__slots__ if getattr(event, n) is not None}
        held[key] = {**held.get(key, {}), **fields}
    overlap = any(
        a != b and a[0] == b[0] and a[1] <= b[2] and b[1] <= a[2] for a in ranges for b in ranges
    )
    burst = [event_document(event, term, index) for event, term, index in drawn]
    if overlap:
        with pytest.raises(DocumentError, match="overlap") as refused:
            parse_snapshot(burst)
        assert refused.value.reason == "malformed-buckets"
        return
    snapshot = parse_snapshot(burst)
    highest = max((RaftPosition(t, i) for _, t, i in drawn), default=RaftPosition(0, 0))
    assert snapshot.position == highest
    assert {e.replicaset_uuid: e for e in snapshot.replicasets} == {
        key: ReplicasetEvent(**fields) for key, fields in replicasets.items()
    }
    assert {e.instance_uuid: e for e in snapshot.instances} == {
        key: InstanceEvent(**fields) for key, fields in instances.items()
    }
    assert {
        (tier, e.start, e.end): e for tier, found in snapshot.buckets.items() for e in found
    } == ranges
