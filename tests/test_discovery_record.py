"""The record wire form and the per-subscriber feed every backend shares."""

from __future__ import annotations

import json
import uuid
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_pool_context import worker

from shardline.discovery.event import DiscoveryEvent
from shardline.discovery.record import MAX_RECORD_BYTES, decode_record, encode_record
from shardline.discovery.subscription import RecordFeed
from shardline.errors import InvalidRecord
from shardline.pool.metadata import WorkerMetadata

json_scalars = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)
records = st.builds(
    WorkerMetadata,
    uid=st.uuids(),
    address=st.text(min_size=1, max_size=30),
    pid=st.integers(0, 2**31),
    version=st.text(max_size=10),
    tags=st.frozensets(st.text(max_size=8), max_size=4),
    extra=st.dictionaries(st.text(max_size=8), json_values, max_size=4).map(MappingProxyType),
)


@given(records)
def test_a_record_round_trips_through_its_wire_form(metadata: WorkerMetadata) -> None:
    assert decode_record(encode_record(metadata)) == metadata


def test_the_wire_form_is_documented_json_with_a_schema_version() -> None:
    document = json.loads(encode_record(worker(1, tags=frozenset({"b", "a"}))))
    assert document == {
        "schema": 1,
        "uid": str(uuid.UUID(int=1)),
        "address": "127.0.0.1:5001",
        "pid": 101,
        "version": "1.0",
        "tags": ["a", "b"],
        "extra": {},
    }


def document(**changes: Any) -> bytes:
    base: dict[str, Any] = json.loads(encode_record(worker(1)))
    base.update(changes)
    return json.dumps({k: v for k, v in base.items() if v is not ...}).encode()


@pytest.mark.parametrize(
    ("data", "reason", "names"),
    [
        (b"{not json", "malformed", "not JSON"),
        (b"\xff\xfe", "malformed", "not JSON"),
        (b"[1, 2]", "malformed", "list"),
        (document(schema=2), "unknown-schema", "schema 2"),
        (document(schema=...), "unknown-schema", "schema None"),
        (document(uid="worker-1"), "malformed", "'worker-1'"),
        (document(uid=...), "malformed", "'uid'"),
        (document(pid="12"), "malformed", "'pid'"),
        (document(pid=True), "malformed", "'pid'"),
        (document(address=None), "malformed", "'address'"),
        (document(tags=["a", 1]), "malformed", "'tags'"),
        (document(extra=[1]), "malformed", "'extra'"),
        (b" " * (MAX_RECORD_BYTES + 1), "oversized", str(MAX_RECORD_BYTES)),
    ],
)
def test_an_unreadable_record_is_refused_with_its_reason(
    data: bytes, reason: str, names: str
) -> None:
    with pytest.raises(InvalidRecord, match=names) as caught:
        decode_record(data)
    assert caught.value.reason == reason


def test_unknown_fields_are_ignored_so_writers_can_add_optional_ones() -> None:
    assert decode_record(document(zone="eu-1")) == worker(1)


def test_a_record_too_large_or_not_json_is_refused_at_publish_time() -> None:
    with pytest.raises(InvalidRecord, match="exceeds") as caught:
        encode_record(worker(1, extra=MappingProxyType({"blob": "x" * MAX_RECORD_BYTES})))
    assert caught.value.reason == "oversized"
    with pytest.raises(InvalidRecord, match="JSON-serialisable"):
        encode_record(worker(1, extra=MappingProxyType({"when": object()})))


def test_the_feed_skips_and_counts_unreadable_records_and_a_uid_stored_under_another(
    caplog: pytest.LogCaptureFixture,
) -> None:
    feed = RecordFeed()
    assert feed.decode(b"{", origin="key-a") is None
    assert feed.decode(document(schema=9), origin="key-b") is None
    assert feed.decode(encode_record(worker(1)), origin="key-c", uid=uuid.UUID(int=2)) is None
    assert feed.decode(encode_record(worker(1)), origin="key-d", uid=uuid.UUID(int=1)) == worker(1)
    assert feed.skipped == {"malformed": 2, "unknown-schema": 1}
    assert [record.message.split(":")[0] for record in caplog.records] == [
        "skipped the discovery record at key-a",
        "skipped the discovery record at key-b",
        "skipped the discovery record at key-c",
    ]


# The feed against a reference model: the subscriber's view (its events applied to a dict) is
# always the filtered truth, and an event is emitted exactly when that view changes.

uids = st.integers(1, 4).map(lambda n: uuid.UUID(int=n))
versions = st.builds(
    lambda uid, pid, gpu: WorkerMetadata(
        uid=uid, address="a", pid=pid, version="1", tags=frozenset({"gpu"} if gpu else ())
    ),
    uids,
    st.integers(0, 2),
    st.booleans(),
)
steps = st.one_of(
    st.tuples(st.just("put"), versions),
    st.tuples(st.just("remove"), uids),
    st.tuples(st.just("resync"), st.lists(versions, max_size=4)),
)


def apply(view: dict[uuid.UUID, WorkerMetadata], events: list[DiscoveryEvent]) -> None:
    for event in events:
        uid = event.metadata.uid
        if event.type == "worker-added":
            assert uid not in view
            view[uid] = event.metadata
        elif event.type == "worker-updated":
            assert uid in view
            assert view[uid] != event.metadata
            view[uid] = event.metadata
        else:
            assert view.pop(uid) == event.metadata  # a drop carries the last record shown


@given(st.lists(steps, max_size=30), st.booleans())
def test_the_feed_shows_exactly_the_filtered_truth(steps: list[Any], filtered: bool) -> None:
    def accepts(metadata: WorkerMetadata) -> bool:
        return not filtered or "gpu" in metadata.tags

    feed = RecordFeed(accepts if filtered else None)
    truth: dict[uuid.UUID, WorkerMetadata] = {}
    view: dict[uuid.UUID, WorkerMetadata] = {}
    for action, argument in steps:
        before = dict(view)
        if action == "put":
            truth[argument.uid] = argument
            events = feed.put(argument)
        elif action == "remove":
            truth.pop(argument, None)
            events = feed.remove(argument)
        else:
            truth = {metadata.uid: metadata for metadata in argument}
            events = feed.resync(truth)
        apply(view, events)
        assert view == {uid: m for uid, m in truth.items() if accepts(m)}
        assert view == feed.shown
        assert bool(events) == (view != before)
