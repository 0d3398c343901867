"""Hypothesis strategies for topology events over a small universe of uuids and tiers.

A small universe makes collisions (redeliveries, overlaps, re-registrations) common, which is
where the rules differ from each other.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from shardline import BucketEvent, InstanceEvent, ReplicasetEvent, Topology
from support.replicasets import inst_uuid, rs_uuid

TIERS = {"a": 40, "b": 25}
RS = st.sampled_from([rs_uuid(n) for n in range(5)])
INST = st.sampled_from([inst_uuid(n) for n in range(6)])
TIER = st.sampled_from(sorted(TIERS))
OP = st.sampled_from(["replace", "delete"])


def full_state(topology: Topology) -> tuple[Any, ...]:
    """Everything a caller can observe of a topology."""
    maps = topology.bucket_maps
    return (
        topology.tiers,
        topology.instances,
        topology.replicasets,
        maps,
        {tier: topology.epoch(tier) for tier in maps},
    )


instance_events = st.builds(
    InstanceEvent,
    op=OP,
    instance_uuid=INST,
    replicaset_uuid=st.none() | RS,
    current_state=st.none() | st.sampled_from(["Online", "Offline", "Expelled"]),
    address=st.none() | st.sampled_from(["127.0.0.1:1", "127.0.0.1:2"]),
)
replicaset_events = st.builds(
    ReplicasetEvent,
    op=OP,
    replicaset_uuid=RS,
    tier=TIER,
    current_master_uuid=st.none() | INST,
)


@st.composite
def bucket_events(draw: st.DrawFn, op: st.SearchStrategy[str] = OP) -> BucketEvent:
    tier = draw(TIER)
    start = draw(st.integers(1, TIERS[tier]))
    end = draw(st.integers(start, min(TIERS[tier], start + 12)))
    return BucketEvent(tier, start, end, draw(RS), op=draw(op))


@st.composite
def snapshots(draw: st.DrawFn) -> tuple[str, list[BucketEvent]]:
    """A valid full poll of one tier: disjoint ranges, in a random order."""
    tier = draw(TIER)
    starts = sorted(draw(st.sets(st.integers(1, TIERS[tier]), max_size=8)) | {1})
    ends = [*(start - 1 for start in starts[1:]), TIERS[tier]]
    ranges = [
        BucketEvent(tier, start, end, draw(RS))
        for start, end in zip(starts, ends, strict=True)
        if draw(st.booleans())
    ]
    return tier, draw(st.permutations(ranges))


valid_events = instance_events | replicaset_events | bucket_events()
