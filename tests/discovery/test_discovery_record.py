"""The record wire form and the per-subscriber feed every backend shares."""

from __future__ import annotations

import contextlib
import json
import uuid
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardline.discovery.record import (
    MAX_DEPTH,
    MAX_RECORD_BYTES,
    decode_record,
    encode_record,
)
from shardline.discovery.subscription import RecordFeed
from shardline.errors import InvalidRecord
from shardline.workers import DiscoveryEvent, WorkerMetadata
from support.workers import worker

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


def nested(levels: int) -> Any:
    """A JSON value ``levels`` arrays deep."""
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


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
        (document(schema=True), "unknown-schema", "schema True"),
        (document(schema=1.0), "unknown-schema", "schema 1.0"),
        (b"[" * 20_000 + b"]" * 20_000, "malformed", "nests deeper than 32"),
        (document(extra=nested(MAX_DEPTH)), "malformed", "nests deeper than 32"),
        # in UTF-16, U+2200 holds the byte of '"': the depth is read from the decoded text
        (('["\u2200", ' + "[" * 5000).encode("utf-16"), "malformed", "nests deeper than 32"),
        (document(uid="worker-1"), "malformed", "'worker-1'"),
        (document(uid=...), "malformed", "'uid'"),
        (document(pid="12"), "malformed", "'pid'"),
        (document(pid=True), "malformed", "'pid'"),
        (document(address=None), "malformed", "'address'"),
        (document(tags=["a", 1]), "malformed", "'tags'"),
        (document(extra=[1]), "malformed", "'extra'"),
        (b" " * (MAX_RECORD_BYTES + 1), "oversized", str(MAX_RECORD_BYTES)),
        # a lone surrogate, as a JSON escape or as bytes (UTF-8 has none): no Unicode text
        (document(address="a\ud800"), "malformed", r"'a\\ud800'.*not Unicode text"),
        (document(extra={"\udfff": 1}), "malformed", r"'\\udfff'.*not Unicode text"),
        (document(tags=["x\ud83d"]), "malformed", "not Unicode text"),
        (
            '{"version": "\ud83d\ude00"}'.encode("utf-8", "surrogatepass"),
            "malformed",
            "not Unicode",
        ),
    ],
)
def test_an_unreadable_record_is_refused_with_its_reason(
    data: bytes, reason: str, names: str
) -> None:
    with pytest.raises(InvalidRecord, match=names) as caught:
        decode_record(data)
    assert caught.value.reason == reason


def test_nesting_is_counted_by_brackets_outside_strings() -> None:
    # the record is level 1, extra level 2: extra holds at most MAX_DEPTH - 2 more levels
    deepest = worker(1, extra=MappingProxyType({"x": nested(MAX_DEPTH - 2)}))
    assert decode_record(encode_record(deepest)) == deepest
    # brackets, quotes and backslashes inside a string: escaped, and never counted
    texts = worker(1, extra=MappingProxyType({"x": '[{"\\' * 2000}))
    assert decode_record(encode_record(texts)) == texts


@given(st.binary(max_size=200) | st.binary(max_size=40).map(lambda b: b"[" * 5000 + b))
def test_reading_any_bytes_raises_nothing_but_invalid_record(data: bytes) -> None:
    with contextlib.suppress(InvalidRecord):
        decode_record(data)


loose_records = st.builds(
    WorkerMetadata,
    uid=st.uuids() | st.text(max_size=4),
    address=st.text(max_size=10) | st.integers(),
    pid=st.integers(-1, 10) | st.booleans() | st.floats(),
    version=st.text(max_size=5) | st.none(),
    tags=st.frozensets(st.text(max_size=3) | st.integers(), max_size=3),
    extra=st.dictionaries(
        st.text(max_size=3),
        json_values | st.integers(0, 60).map(nested) | st.just(float("nan")),
        max_size=3,
    ).map(MappingProxyType),
)


@given(loose_records)
def test_publishing_refuses_exactly_what_readers_refuse(metadata: WorkerMetadata) -> None:
    try:
        data = encode_record(metadata)
    except InvalidRecord:
        return
    decode_record(data)  # every record a publisher may write, every reader reads


def test_publishing_refuses_a_bool_pid_and_nesting_too_deep_even_to_serialise() -> None:
    with pytest.raises(InvalidRecord, match="'pid'") as caught:
        encode_record(worker(1, pid=True))
    assert caught.value.reason == "malformed"
    with pytest.raises(InvalidRecord, match="nests deeper than 32"):
        encode_record(worker(1, extra=MappingProxyType({"x": nested(MAX_DEPTH)})))
    with pytest.raises(InvalidRecord, match="not JSON-serialisable"):
        encode_record(worker(1, extra=MappingProxyType({"x": nested(100_000)})))


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        # the two halves of a pair as two code points: their escapes read back as one
        ({"extra": MappingProxyType({"\ud83d\ude00": 1})}, "extra"),
        ({"extra": MappingProxyType({"k": [{"x": "\ud83d\ude00"}]})}, "extra"),
        ({"extra": MappingProxyType({"k": "lone \udc00"})}, "extra"),
        ({"address": "host\ud800:1"}, "address"),
        ({"version": "\ud83d\ude00"}, "version"),
        ({"tags": frozenset({"ok", "\udfff"})}, "tags"),
    ],
)
def test_publishing_refuses_a_str_that_is_not_unicode_text_naming_the_field(
    changes: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidRecord, match=f"field '{field}' holds .*not Unicode text") as caught:
        encode_record(worker(1, **changes))
    assert caught.value.reason == "malformed"


def test_a_pair_written_whole_or_escaped_reads_back_as_one_code_point() -> None:
    whole = worker(1, version="\U0001f600", extra=MappingProxyType({"\U0001f600": "\U0001f600"}))
    assert decode_record(encode_record(whole)) == whole
    assert decode_record(document(version="\U0001f600")).version == "\U0001f600"
    assert decode_record(b"{" + document()[1:-1] + b', "zone": "\\ud83d\\ude00"}') == worker(1)


# a pair as two code points, a lone half, and the same pair as one code point
halves = st.sampled_from(["\ud83d\ude00", "\udfff", "\U0001f600"])
surrogate_texts = st.lists(st.characters() | halves, max_size=4).map("".join)


@given(
    st.builds(
        WorkerMetadata,
        uid=st.uuids(),
        address=surrogate_texts,
        pid=st.integers(0, 10),
        version=surrogate_texts,
        tags=st.frozensets(surrogate_texts, max_size=3),
        extra=st.dictionaries(surrogate_texts, surrogate_texts, max_size=3).map(MappingProxyType),
    )
)
def test_whatever_publishing_accepts_reads_back_exactly(metadata: WorkerMetadata) -> None:
    try:
        data = encode_record(metadata)
    except InvalidRecord:
        return
    assert decode_record(data) == metadata


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


def test_a_filter_that_raises_skips_that_record_only(caplog: pytest.LogCaptureFixture) -> None:
    feed = RecordFeed(lambda metadata: metadata.extra["zone"] == "eu")
    eu = worker(1, extra=MappingProxyType({"zone": "eu"}))
    assert [event.type for event in feed.put(eu)] == ["worker-added"]
    # a record the filter raises on counts as absent: a record shown before is dropped
    assert [event.type for event in feed.put(worker(1))] == ["worker-dropped"]
    assert feed.put(worker(2)) == []
    assert [event.type for event in feed.put(worker(3, extra=eu.extra))] == ["worker-added"]
    assert feed.skipped == {"filter-error": 2}
    assert sum("filter raised" in record.message for record in caplog.records) == 2


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
