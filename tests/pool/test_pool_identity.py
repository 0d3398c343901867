"""The pool finds the pooled uid object itself without reading ``uid.int`` (issue 12, section 3),
from the first lookup made with it on, and answers exactly as by key for every other object
that names a worker. A
:class:`WorkerMetadata` carries its uid and key from when it was made, so admitting, refreshing
and evicting it read neither ``metadata.uid`` nor ``uid.int``; any other record type is read."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import pickle
import uuid
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardline import LoadBalancerContext, WorkerMetadata
from shardline._core import KeyedRecord


class CountingUid:
    """A uid that counts how often its ``int`` is read (the pool keys workers by ``uid.int``)."""

    def __init__(self, value: int) -> None:
        self.value = value
        self.reads = 0

    @property
    def int(self) -> int:
        self.reads += 1
        return self.value


class Record:
    """The one attribute the pool reads of a record: ``uid``."""

    def __init__(self, uid: Any) -> None:
        self.uid = uid


def test_the_pooled_uid_object_is_found_without_reading_its_int_from_its_first_lookup_on() -> None:
    pool = LoadBalancerContext()
    uid = CountingUid(7)
    record = Record(uid)
    pool.add_worker(record, "conn")
    assert uid.reads == 1  # once, to key the entry
    assert uid in pool  # the first lookup with it finds it by key, and indexes its address
    assert uid.reads == 2
    assert uid in pool
    assert pool.entry(uid) == (record, "conn")
    assert pool.begin_dispatch(uid) == (record, "conn")
    pool.end_dispatch(uid, 0.5)
    assert pool.load(uid) == (0, 0.5)
    assert pool.uids() == [uid]
    pool.remove_worker(record)
    assert uid.reads == 2
    assert uid not in pool  # no longer pooled: found by key, which reads it again
    assert uid.reads == 3


def test_a_worker_no_lookup_was_made_with_is_evicted_by_its_key() -> None:
    pool = LoadBalancerContext()
    uid = CountingUid(7)
    pool.add_worker(Record(uid), "conn")
    pool.remove_worker(Record(uid))
    assert (uid.reads, len(pool)) == (2, 0)
    assert uid not in pool


def test_an_equal_uid_object_still_finds_the_worker_and_takes_over_the_address_index() -> None:
    pool = LoadBalancerContext()
    first, twin = CountingUid(7), CountingUid(7)
    pool.add_worker(Record(first), "a")
    assert first in pool  # indexed
    assert twin in pool
    assert pool.entry(twin)[1] == "a"
    # A refresh through the twin makes it the pooled object; from its first lookup on it is
    # found by address, and the first object (no longer pooled) by key.
    pool.add_worker(Record(twin), "b")
    assert pool.uids() == [twin]
    assert pool.entry(twin)[1] == "b"
    reads = twin.reads
    assert pool.entry(twin)[1] == "b"
    assert twin.reads == reads
    reads = first.reads
    assert pool.entry(first)[1] == "b"
    assert first.reads == reads + 1
    pool.remove_worker(Record(first))
    assert len(pool) == 0
    assert twin not in pool


class CountingMetadata(WorkerMetadata):
    """A WorkerMetadata that counts how often its ``uid`` attribute is read."""

    uid_reads = 0

    def __getattribute__(self, name: str) -> Any:
        if name == "uid":
            type(self).uid_reads += 1
        return super().__getattribute__(name)


def test_a_worker_metadata_is_admitted_refreshed_and_evicted_on_the_key_it_was_made_with() -> None:
    pool = LoadBalancerContext()
    uid = CountingUid(7)
    record = CountingMetadata(uid=uid, address="h:1", pid=1, version="1")  # type: ignore[arg-type]
    assert uid.reads == 1  # made: the key is read once
    CountingMetadata.uid_reads = 0
    pool.add_worker(record, "a")
    assert pool.update_worker(record, "b")
    assert pool.workers[uuid.UUID(int=7)] == (record, "b")  # type: ignore[index]
    pool.remove_worker(record)
    assert len(pool) == 0
    assert (uid.reads, CountingMetadata.uid_reads) == (1, 0)
    # an equal uid in a distinct record, not the pooled one: evicted by the key it carries
    pool.add_worker(record, "a")
    twin = CountingMetadata(uid=CountingUid(7), address="h:2", pid=2, version="1")  # type: ignore[arg-type]
    pool.remove_worker(twin)
    assert len(pool) == 0
    assert CountingMetadata.uid_reads == 0


def test_the_record_base_names_the_fields_of_worker_metadata_in_order() -> None:
    # the base matches these keywords in place; one it does not name would cost a dict
    named = list(inspect.signature(KeyedRecord).parameters)
    fields = [field.name for field in dataclasses.fields(WorkerMetadata)]
    assert named[: len(fields)] == fields


def test_copies_pickles_and_replacements_of_a_record_carry_its_key() -> None:
    record = WorkerMetadata(
        uid=uuid.UUID(int=7),
        address="h:1",
        pid=1,
        version="1",
        tags=frozenset({"gpu"}),
        extra=MappingProxyType({"zone": "a"}),  # read-only, as discovery makes it
        published=12.5,
    )
    pool = LoadBalancerContext()
    pool.add_worker(record, "a")
    copies = [
        copy.copy(record),
        copy.deepcopy(record),
        dataclasses.replace(record, address="h:2"),
        *(pickle.loads(pickle.dumps(record, protocol)) for protocol in range(6)),
    ]
    for made in copies:
        assert made == record or made.address == "h:2"
        assert (made.uid, made.published, type(made.extra)) == (record.uid, 12.5, MappingProxyType)
        assert made.extra == {"zone": "a"}
        assert pool.update_worker(made, "b")
        assert pool.workers[record.uid] == (made, "b")
    uid = CountingUid(7)
    counted = pickle.loads(pickle.dumps(CountingMetadata(uid=uid, address="h", pid=1, version="1")))  # type: ignore[arg-type]
    assert type(counted) is CountingMetadata
    CountingMetadata.uid_reads = 0
    pool.remove_worker(counted)
    assert (len(pool), CountingMetadata.uid_reads) == (0, 0)


def test_a_record_whose_uid_has_no_int_is_made_and_refused_by_the_pool_as_before() -> None:
    record = WorkerMetadata(uid="not-a-uuid", address="h:1", pid=1, version="1")  # type: ignore[arg-type]
    pool = LoadBalancerContext()
    with pytest.raises(AttributeError):
        pool.add_worker(record, "a")
    with pytest.raises(AttributeError):
        pool.add_worker(Record("not-a-uuid"), "a")
    assert len(pool) == 0


# Operations on a few workers, each named through one of two equal uid objects, so that both
# lookups (by the pooled object's address, and by key) are exercised against each other, and
# carried by a WorkerMetadata (which brings its key) or by a record of another type (read).
operations = st.lists(
    st.tuples(
        st.sampled_from(["add", "update", "remove", "contains", "entry", "begin", "end"]),
        st.integers(0, 4),  # worker
        st.integers(0, 1),  # which of its two uid objects
        st.booleans(),  # a WorkerMetadata, or a record of another type
    ),
    max_size=120,
)


@given(ops=operations)
def test_lookups_by_any_uid_object_equal_a_uid_keyed_model(
    ops: list[tuple[str, int, int, bool]],
) -> None:
    uids = [(uuid.UUID(int=n + 1), uuid.UUID(int=n + 1)) for n in range(5)]
    pool = LoadBalancerContext()
    model: dict[uuid.UUID, tuple[Any, str]] = {}
    inflight: dict[uuid.UUID, int] = {}
    for step, (op, n, which, keyed) in enumerate(ops):
        uid = uids[n][which]
        record = (
            WorkerMetadata(uid=uid, address=f"h:{step}", pid=step, version="1")
            if keyed
            else Record(uid)
        )
        connection = f"conn-{step}"
        if op == "add":
            pool.add_worker(record, connection)
            if uid not in model:
                inflight[uid] = 0
            model[uid] = (record, connection)
        elif op == "update":
            assert pool.update_worker(record, connection) == (uid in model)
            if uid in model:
                model[uid] = (record, connection)
        elif op == "remove":
            pool.remove_worker(record)
            model.pop(uid, None)
            inflight.pop(uid, None)
        elif op == "contains":
            assert (uid in pool) == (uid in model)
        elif op in ("entry", "begin"):
            if uid in model:
                call = pool.entry if op == "entry" else pool.begin_dispatch
                assert call(uid) == model[uid]
                if op == "begin":
                    inflight[uid] += 1
            else:
                try:
                    pool.entry(uid)
                except KeyError:
                    pass
                else:
                    raise AssertionError("entry of a worker not pooled")
        else:
            pool.end_dispatch(uid, 0.25)
            if inflight.get(uid):
                inflight[uid] -= 1
        assert list(pool.workers.items()) == list(model.items())
        for twins in uids:
            for candidate in twins:
                assert (candidate in pool) == (candidate in model)
                expected = inflight.get(candidate, 0) if candidate in model else 0
                assert pool.load(candidate)[0] == expected
