"""Lookups and routing: bucket → replicaset → master instance, one key or many."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardline import (
    BucketEvent,
    Instance,
    InstanceEvent,
    ReplicasetEvent,
    Topology,
    UnhashableKey,
    UnknownTier,
    bucket_id,
)
from support.replicasets import add_replicaset, inst_uuid, rs_uuid


@pytest.fixture
def routed(topology: Topology) -> Topology:
    for n in (1, 2, 3):
        add_replicaset(topology, n)
    for n, (start, end) in zip((1, 2, 3), [(1, 1000), (1001, 2000), (2001, 2900)], strict=True):
        topology.apply(BucketEvent("default", start, end, rs_uuid(n)))
    return topology


def master(n: int) -> Instance:
    return Instance(inst_uuid(n), rs_uuid(n), "Online", f"127.0.0.1:{3300 + n}")


def test_owner_and_master_of_covered_buckets(routed: Topology) -> None:
    assert routed.owner("default", 1) == rs_uuid(1)
    assert routed.owner("default", 1000) == rs_uuid(1)
    assert routed.owner("default", 1001) == rs_uuid(2)
    assert routed.find_bucket_master("default", 2900) == master(3)


def test_uncovered_bucket_has_no_owner(routed: Topology) -> None:
    assert routed.owner("default", 2901) is None
    assert routed.find_bucket_master("default", 2901) is None
    assert routed.owner("default", 0) is None


@pytest.mark.parametrize(
    "break_link",
    [
        ReplicasetEvent("delete", rs_uuid(2)),  # the replicaset (this also clears the map)
        InstanceEvent("delete", inst_uuid(2)),  # the master instance
    ],
)
def test_master_is_none_when_a_link_is_unknown(routed: Topology, break_link: object) -> None:
    routed.apply(break_link)
    assert routed.find_bucket_master("default", 1500) is None


def test_master_is_none_while_the_replicaset_has_no_master() -> None:
    topology = Topology()
    topology.apply(ReplicasetEvent("replace", rs_uuid(1), tier="t"))
    topology.apply(BucketEvent("t", 1, 10, rs_uuid(1)))
    assert topology.owner("t", 5) == rs_uuid(1)
    assert topology.find_bucket_master("t", 5) is None


def test_master_switch_reroutes_without_touching_the_map(routed: Topology) -> None:
    routed.apply(InstanceEvent("replace", inst_uuid(7), replicaset_uuid=rs_uuid(2), address="x:7"))
    routed.apply(ReplicasetEvent("replace", rs_uuid(2), current_master_uuid=inst_uuid(7)))
    assert routed.find_bucket_master("default", 1500) == Instance(
        inst_uuid(7), rs_uuid(2), None, "x:7"
    )


@pytest.mark.parametrize(
    "lookup",
    [
        lambda t: t.owner("nope", 1),
        lambda t: t.find_bucket_master("nope", 1),
        lambda t: t.ranges("nope"),
        lambda t: t.epoch("nope"),
        lambda t: t.route("nope", "key"),
        lambda t: t.bucket_id("nope", "key"),
        lambda t: t.owners("nope", [1]),
        lambda t: t.route_many("nope", ["key"]),
    ],
)
def test_unknown_tier_raises(routed: Topology, lookup: object) -> None:
    with pytest.raises(UnknownTier, match="'nope'"):
        lookup(routed)  # type: ignore[operator]


def test_hashing_needs_the_tier_bucket_count() -> None:
    topology = Topology()
    topology.apply(ReplicasetEvent("replace", rs_uuid(1), tier="t"))
    with pytest.raises(UnknownTier, match="'t' has no bucket count"):
        topology.route("t", "key")
    assert isinstance(UnknownTier("x"), LookupError)


keys = st.one_of(
    st.text(max_size=20),
    st.integers(-(2**63), 2**64 - 1),
    st.tuples(st.text(max_size=5), st.integers(0, 1000), st.booleans() | st.none()),
)


@given(key=keys)
def test_route_is_bucket_id_then_find_bucket_master(key: object) -> None:
    topology = Topology()
    topology.apply_tiers({"default": 3000})
    for n in (1, 2, 3):
        add_replicaset(topology, n)
    topology.apply_bucket_snapshot(
        "default",
        [BucketEvent("default", s, e, rs_uuid(n)) for n, s, e in [(1, 1, 1000), (2, 1001, 2000)]],
    )
    bucket = bucket_id(key, 3000)
    assert topology.bucket_id("default", key) == bucket
    assert topology.route("default", key) == topology.find_bucket_master("default", bucket)


def test_batch_forms_agree_with_single_lookups(routed: Topology) -> None:
    buckets = list(range(0, 3002, 7))
    assert routed.owners("default", buckets) == [routed.owner("default", b) for b in buckets]
    assert routed.owners("default", np.array(buckets, dtype=np.int64)) == routed.owners(
        "default", buckets
    )
    str_keys = [f"user:{i}" for i in range(500)]
    assert routed.route_many("default", str_keys) == [routed.route("default", k) for k in str_keys]
    int_keys = list(range(-250, 250))
    expected = [routed.route("default", k) for k in int_keys]
    assert routed.route_many("default", int_keys) == expected
    assert routed.route_many("default", np.array(int_keys, dtype=np.int64)) == expected
    composite = [("a", i, None) for i in range(50)]
    assert routed.route_many("default", composite) == [
        routed.route("default", k) for k in composite
    ]


def test_batch_with_an_unhashable_key_raises_and_names_it(routed: Topology) -> None:
    with pytest.raises(UnhashableKey, match="list"):
        routed.route_many("default", ["ok", ["not", "a", "key"]])


def test_owners_of_uncovered_ids_in_an_array_are_none(routed: Topology) -> None:
    # Ids outside 0..2**32-1 raise InvalidArgument instead:
    # tests/topology/test_hostile_arguments.py.
    assert routed.owners("default", np.array([0, 5, 2901, 2**32 - 1], dtype=np.int64)) == [
        None,
        rs_uuid(1),
        None,
        None,
    ]


def test_a_tier_name_built_at_run_time_finds_the_same_tier(routed: Topology) -> None:
    name = "".join(["de", "fault"])  # equal to the literal, but a distinct, non-interned object
    assert routed.owner(name, 1) == rs_uuid(1)
    assert routed.find_bucket_master(name, 2900) == master(3)
    assert routed.route_many(name, ["k"]) == [routed.route("default", "k")]
    with pytest.raises(UnknownTier):
        routed.owner("".join(["no", "pe"]), 1)
