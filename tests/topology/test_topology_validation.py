"""Rule 9: bad input never corrupts state; the error names the field and the value."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardline import (
    BucketEvent,
    InstanceEvent,
    InvalidEvent,
    ReplicasetEvent,
    Topology,
    UnknownTier,
)
from support.replicasets import inst_uuid, rs_uuid
from support.strategies import TIERS, full_state, valid_events

BAD_EVENTS: list[tuple[Any, str]] = [
    (BucketEvent("a", 10, 9, rs_uuid(1)), "start 10 is greater than end 9"),
    (BucketEvent("a", 0, 9, rs_uuid(1)), "field 'start'.*0"),
    (BucketEvent("a", -5, 9, rs_uuid(1)), "field 'start'.*-5"),
    (BucketEvent("a", 1, TIERS["a"] + 1, rs_uuid(1)), f"end {TIERS['a'] + 1} exceeds"),
    (BucketEvent("", 1, 9, rs_uuid(1)), "field 'tier' must not be empty"),
    (BucketEvent("a", 1, 9, "not-a-uuid"), "field 'current_replicaset_uuid'.*'not-a-uuid'"),
    (BucketEvent("a", 1, 9, rs_uuid(1), op="upsert"), "field 'op'.*'upsert'"),  # type: ignore[arg-type]
    (BucketEvent("a", "1", 9, rs_uuid(1)), "field 'start'.*'1'"),  # type: ignore[arg-type]
    (BucketEvent("a", True, 9, rs_uuid(1)), "field 'start'.*True"),  # type: ignore[arg-type]
    (InstanceEvent("replace", "xyz"), "field 'instance_uuid'.*'xyz'"),
    (InstanceEvent("replace", inst_uuid(1), replicaset_uuid="r1"), "field 'replicaset_uuid'.*'r1'"),
    (InstanceEvent("replace", inst_uuid(1), address=5), "field 'address'.*5"),  # type: ignore[arg-type]
    (InstanceEvent("insert", inst_uuid(1)), "field 'op'.*'insert'"),  # type: ignore[arg-type]
    (ReplicasetEvent("replace", "r1", tier="a"), "field 'replicaset_uuid'.*'r1'"),
    (ReplicasetEvent("replace", rs_uuid(1), tier=""), "field 'tier' must not be empty"),
    (ReplicasetEvent("replace", rs_uuid(1), tier="a", current_master_uuid="m"), "'m'"),
    (ReplicasetEvent("replace", rs_uuid(99)), "field 'tier' is required"),
    (ReplicasetEvent("remove", rs_uuid(1)), "field 'op'.*'remove'"),  # type: ignore[arg-type]
    # A str holding a lone surrogate is not text: it cannot be encoded.
    (BucketEvent("\ud800", 1, 9, rs_uuid(1)), r"field 'tier' must be valid text.*\\ud800"),
    (BucketEvent("a", 1, 9, "\ud800"), "field 'current_replicaset_uuid'"),
    (BucketEvent("a", 1, 9, rs_uuid(1), op="\ud800"), "field 'op'"),  # type: ignore[arg-type]
    (InstanceEvent("replace", "\ud800"), "field 'instance_uuid'"),
    (InstanceEvent("replace", inst_uuid(1), replicaset_uuid="\ud800"), "field 'replicaset_uuid'"),
    (InstanceEvent("replace", inst_uuid(1), current_state="\ud800"), "field 'current_state'"),
    (InstanceEvent("replace", inst_uuid(1), address="h\udfff:1"), "field 'address'"),
    (ReplicasetEvent("replace", rs_uuid(1), tier="\ud800"), "field 'tier' must be valid text"),
    (ReplicasetEvent("replace", rs_uuid(1), tier="a", current_master_uuid="\ud800"), "master"),
]


def fresh() -> Topology:
    topology = Topology()
    topology.apply_tiers(TIERS)
    return topology


@pytest.mark.parametrize(("event", "message"), BAD_EVENTS)
def test_bad_event_raises_invalid_event_naming_the_field(event: Any, message: str) -> None:
    topology = fresh()
    with pytest.raises(InvalidEvent, match=message):
        topology.apply(event)


@given(history=st.lists(valid_events, max_size=30), bad=st.sampled_from(BAD_EVENTS))
def test_bad_event_leaves_the_whole_topology_as_it_was(history: list[Any], bad: Any) -> None:
    topology = fresh()
    for event in history:
        topology.apply(event)
    before = full_state(topology)
    with pytest.raises(InvalidEvent):
        topology.apply(bad[0])
    assert full_state(topology) == before


def test_invalid_event_is_a_value_error_and_a_shardline_error() -> None:
    from shardline import ShardlineError

    with pytest.raises(ValueError, match="op") as caught:
        fresh().apply(InstanceEvent("nope", inst_uuid(1)))  # type: ignore[arg-type]
    assert isinstance(caught.value, ShardlineError)


def test_not_an_event_is_rejected() -> None:
    with pytest.raises(InvalidEvent, match="not a topology event: dict"):
        fresh().apply({"op": "replace"})


class _DeclaredBucketEvent:
    """Not one of shardline's classes: Topology.apply goes by the kind a class declares."""

    topology_event = "bucket"
    op = "replace"
    state = "active"

    def __init__(self, tier: str, start: int, end: int, owner: str) -> None:
        self.tier, self.start, self.end, self.current_replicaset_uuid = tier, start, end, owner


def test_apply_dispatches_on_the_kind_an_event_class_declares() -> None:
    topology = fresh()
    topology.apply(ReplicasetEvent("replace", rs_uuid(1), tier="a"))
    topology.apply(_DeclaredBucketEvent("a", 1, 9, rs_uuid(1)))
    assert topology.owner("a", 5) == rs_uuid(1)


@pytest.mark.parametrize("declared", ["tier", "", b"bucket", None, 3])
def test_an_unknown_declared_kind_is_not_a_topology_event(declared: object) -> None:
    event = _DeclaredBucketEvent("a", 1, 9, rs_uuid(1))
    type(event).topology_event = declared  # type: ignore[assignment]
    try:
        with pytest.raises(InvalidEvent, match="not a topology event: _DeclaredBucketEvent"):
            fresh().apply(event)
    finally:
        _DeclaredBucketEvent.topology_event = "bucket"


@pytest.mark.parametrize(
    ("tiers", "message"),
    [
        ({"": 3}, "empty"),
        ({"a": -1}, "'a' has an invalid bucket_count -1"),
        ({"a": "x"}, "str to an int"),
        ({"a": 2.0}, "str to an int"),
        ({"a": True}, "'a' has an invalid bucket_count True"),
        ({"a": False}, "'a' has an invalid bucket_count False"),
        ({"a": 2**32}, f"'a' has an invalid bucket_count {2**32}"),
    ],
)
def test_bad_tier_configuration_is_rejected_and_can_be_retried(
    tiers: dict[str, Any], message: str
) -> None:
    topology = Topology()
    with pytest.raises(InvalidEvent, match=message):
        topology.apply_tiers(tiers)
    assert topology.tiers == {}
    assert topology.apply_tiers({"a": 3})
    assert topology.tiers == {"a": 3}


def test_tiers_are_set_once_and_later_calls_are_ignored() -> None:
    topology = fresh()
    assert not topology.apply_tiers({"a": 1, "c": 7})
    assert topology.tiers == TIERS


def test_tiers_smaller_than_an_existing_map_are_rejected() -> None:
    topology = Topology()
    topology.apply(BucketEvent("a", 1, 50, rs_uuid(1)))
    with pytest.raises(InvalidEvent, match="beyond bucket_count 40"):
        topology.apply_tiers({"a": 40})
    assert topology.tiers == {}


def test_an_event_of_a_tier_outside_the_configuration_raises_unknown_tier() -> None:
    topology = fresh()
    topology.apply(BucketEvent("a", 1, 5, rs_uuid(1)))
    before = full_state(topology)
    for event in (
        BucketEvent("zz", 1, 5, rs_uuid(1)),
        BucketEvent("zz", 1, 5, rs_uuid(1), op="delete"),
    ):
        with pytest.raises(UnknownTier, match="'zz' is not in apply_tiers"):
            topology.apply(event)
    for poll in ([], [BucketEvent("zz", 1, 5, rs_uuid(1))], "[]", b"[]"):
        with pytest.raises(UnknownTier, match="'zz' is not in apply_tiers"):
            topology.apply_bucket_snapshot("zz", poll)
    assert full_state(topology) == before
    assert "zz" not in topology.bucket_maps


def test_before_the_configuration_any_tier_may_be_mapped() -> None:
    topology = Topology()
    topology.apply(BucketEvent("zz", 1, 5, rs_uuid(1)))
    assert topology.apply_bucket_snapshot("yy", [BucketEvent("yy", 1, 500, rs_uuid(1))])
    assert topology.ranges("zz") == [(1, 5, rs_uuid(1))]
    assert topology.ranges("yy") == [(1, 500, rs_uuid(1))]


def test_tier_lookups_among_many_tiers_find_each_one() -> None:
    topology = Topology()
    counts = {f"tier-{i}": 10 + i % 7 for i in range(20_000)}
    topology.apply_tiers(counts)
    some = list(counts)[::997]
    for i, name in enumerate(some):
        topology.apply(BucketEvent(name, 1, 10, rs_uuid(i)))
    for i, name in enumerate(some):
        runtime_name = "".join(["tier-", name[5:]])  # equal text, another object
        assert topology.owner(runtime_name, 10) == rs_uuid(i)
        assert topology.owner(name, 10) == rs_uuid(i)
        assert 1 <= topology.bucket_id(runtime_name, "k") <= counts[name]
    assert topology.owner("tier-1", 10) is None
    with pytest.raises(UnknownTier, match="'tier-20000'"):
        topology.owner("tier-20000", 1)
