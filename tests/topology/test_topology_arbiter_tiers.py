"""Tiers without buckets (``bucket_count`` 0, Picodata's "arbiter" tiers) in the Topology.

Picodata 26.1 allows a tier with ``bucket_count: 0`` (picodata/picodata ``src/tier.rs``
``Tier::has_buckets``: "A tier with `bucket_count == 0` is an "arbiter" tier that only stores
global system tables and participates in Raft consensus"; test/int/test_expelling.py
``test_expel_zero_bucket_tier``). Its members are followed; no key routes to it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from shardline import (
    BucketEvent,
    InstanceEvent,
    InvalidEvent,
    ReplicasetEvent,
    ShardlineError,
    TierWithoutBuckets,
    Topology,
    UnknownTier,
)
from shardline.topology.sources.changes import BucketSnapshot, TopologySnapshot, apply_change
from support.replicasets import inst_uuid, rs_uuid
from support.strategies import full_state

ROUTING: list[tuple[str, Callable[[Topology], Any]]] = [
    ("bucket_id", lambda t: t.bucket_id("arbiter", 7)),
    ("route", lambda t: t.route("arbiter", 7)),
    ("route_many", lambda t: t.route_many("arbiter", [7, "x"])),
    ("route_many of an array", lambda t: t.route_many("arbiter", memoryview(b"\x01\x02"))),
    ("owner", lambda t: t.owner("arbiter", 1)),
    ("owners", lambda t: t.owners("arbiter", [1, 2])),
    ("find_bucket_master", lambda t: t.find_bucket_master("arbiter", 1)),
]


def arbiter_topology() -> Topology:
    topology = Topology()
    assert topology.apply_tiers({"arbiter": 0, "storage": 30})
    topology.apply(ReplicasetEvent("replace", rs_uuid(1), tier="arbiter"))
    topology.apply(ReplicasetEvent("replace", rs_uuid(1), current_master_uuid=inst_uuid(1)))
    topology.apply(InstanceEvent("replace", inst_uuid(1), rs_uuid(1), "Online", "10.0.0.1:4327"))
    topology.apply(ReplicasetEvent("replace", rs_uuid(2), tier="storage"))
    topology.apply(ReplicasetEvent("replace", rs_uuid(2), current_master_uuid=inst_uuid(2)))
    topology.apply(InstanceEvent("replace", inst_uuid(2), rs_uuid(2), "Online", "10.0.0.2:4327"))
    topology.apply(BucketEvent("storage", 1, 30, rs_uuid(2)))
    return topology


def test_a_tier_without_buckets_is_configured_and_its_members_are_kept() -> None:
    topology = arbiter_topology()
    assert topology.tiers == {"arbiter": 0, "storage": 30}
    assert topology.replicasets[rs_uuid(1)].tier == "arbiter"
    assert topology.replicasets[rs_uuid(1)].current_master_uuid == inst_uuid(1)
    assert topology.instances[inst_uuid(1)].address == "10.0.0.1:4327"
    assert topology.bucket_maps["arbiter"] == []
    assert topology.ranges("arbiter") == []
    assert topology.epoch("arbiter") == 0
    route = topology.route("storage", 7)
    assert route is not None
    assert route.uuid == inst_uuid(2)


@pytest.mark.parametrize(("name", "call"), ROUTING, ids=[name for name, _ in ROUTING])
def test_routing_in_a_tier_without_buckets_raises_naming_it(
    name: str, call: Callable[[Topology], Any]
) -> None:
    topology = arbiter_topology()
    with pytest.raises(TierWithoutBuckets, match=r"tier 'arbiter' has no buckets \(bucket_count 0"):
        call(topology)
    # the last tier found is cached by identity: a second lookup must raise all the same
    with pytest.raises(TierWithoutBuckets):
        call(topology)


def test_tier_without_buckets_is_an_unknown_tier_and_a_shardline_error() -> None:
    assert issubclass(TierWithoutBuckets, UnknownTier)
    assert issubclass(TierWithoutBuckets, LookupError)
    assert issubclass(TierWithoutBuckets, ShardlineError)


@pytest.mark.parametrize(
    "change",
    [
        BucketEvent("arbiter", 1, 1, rs_uuid(1)),
        BucketEvent("arbiter", 1, 1, rs_uuid(1), op="delete"),
        BucketSnapshot("arbiter", (BucketEvent("arbiter", 1, 3, rs_uuid(1)),)),
        BucketSnapshot(
            "arbiter",
            json.dumps(
                [
                    {
                        "bucket_id_start": 1,
                        "bucket_id_end": 3,
                        "tier_name": "arbiter",
                        "state": "active",
                        "current_replicaset_uuid": rs_uuid(1),
                    }
                ]
            ),
        ),
    ],
    ids=["replace", "delete", "snapshot of events", "snapshot text"],
)
def test_bucket_ranges_for_a_tier_without_buckets_are_refused(change: Any) -> None:
    topology = arbiter_topology()
    before = full_state(topology)
    with pytest.raises(TierWithoutBuckets, match="tier 'arbiter' has no buckets"):
        apply_change(topology, change)
    assert full_state(topology) == before


@pytest.mark.parametrize("empty", [(), "[]", b"[]"])
def test_an_empty_snapshot_of_a_tier_without_buckets_changes_nothing(empty: Any) -> None:
    topology = arbiter_topology()
    assert not topology.apply_bucket_snapshot("arbiter", empty)
    assert topology.ranges("arbiter") == []


def test_a_tier_that_already_maps_buckets_cannot_be_configured_without_any() -> None:
    topology = Topology()
    topology.apply(BucketEvent("arbiter", 1, 5, rs_uuid(1)))
    with pytest.raises(InvalidEvent, match="'arbiter' already maps bucket 5 beyond bucket_count 0"):
        topology.apply_tiers({"arbiter": 0})
    assert topology.tiers == {}


def test_a_snapshot_with_a_tier_without_buckets_applies_its_members() -> None:
    topology = Topology()
    apply_change(
        topology,
        TopologySnapshot(
            tiers={"arbiter": 0, "storage": 30},
            replicasets=(
                ReplicasetEvent("replace", rs_uuid(1), tier="arbiter"),
                ReplicasetEvent("replace", rs_uuid(2), tier="storage"),
            ),
            instances=(InstanceEvent("replace", inst_uuid(1), rs_uuid(1), "Online", "a:1"),),
            buckets=(BucketSnapshot("storage", (BucketEvent("storage", 1, 30, rs_uuid(2)),)),),
        ),
    )
    assert topology.tiers == {"arbiter": 0, "storage": 30}
    assert set(topology.replicasets) == {rs_uuid(1), rs_uuid(2)}
    assert topology.owner("storage", 30) == rs_uuid(2)
    with pytest.raises(TierWithoutBuckets):
        topology.owner("arbiter", 1)


def test_the_live_demo_shows_a_tier_without_buckets_instead_of_failing() -> None:
    from shardline.demo.live import LiveDemo, _Snapshot

    topology = arbiter_topology()
    keys = [f"user:{i}" for i in range(10)]
    snapshot = _Snapshot.of(topology, keys)
    assert snapshot.routes["arbiter"] == []
    assert len(snapshot.routes["storage"]) == 10
    arbiter, storage = snapshot.tier_states(None)
    assert (arbiter.tier, arbiter.bucket_count) == ("arbiter", 0)
    assert storage.tier == "storage"
    samples = LiveDemo("postgresql://unused", samples=2)._samples(topology)
    assert {sample.tier for sample in samples} == {"storage"}
