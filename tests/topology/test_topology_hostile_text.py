"""A str that is not text (it holds a lone surrogate, so it cannot be encoded) is rejected with
the documented error types: `UnknownTier` where a tier is looked up, `InvalidEvent` where an
event, a row or a tier configuration is read. Nothing changes on rejection."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from shardline import (
    BucketEvent,
    InstanceEvent,
    InvalidEvent,
    ReplicasetEvent,
    Topology,
    UnknownTier,
)
from support.replicasets import inst_uuid, rs_uuid
from support.strategies import TIERS, full_state

SURROGATE = "\ud800"
# Not text: a lone surrogate alone, and after a valid prefix (a configured tier's name).
NOT_TEXT = [SURROGATE, "a" + SURROGATE, "\udfff"]


def populated() -> Topology:
    topology = Topology()
    topology.apply_tiers(TIERS)
    topology.apply(
        ReplicasetEvent("replace", rs_uuid(1), tier="a", current_master_uuid=inst_uuid(1))
    )
    topology.apply(InstanceEvent("replace", inst_uuid(1), replicaset_uuid=rs_uuid(1)))
    topology.apply(BucketEvent("a", 1, 20, rs_uuid(1)))
    return topology


LOOKUPS: dict[str, Callable[[Topology, str], Any]] = {
    "owner": lambda t, tier: t.owner(tier, 5),
    "find_bucket_master": lambda t, tier: t.find_bucket_master(tier, 5),
    "epoch": lambda t, tier: t.epoch(tier),
    "ranges": lambda t, tier: t.ranges(tier),
    "bucket_id": lambda t, tier: t.bucket_id(tier, "key"),
    "route": lambda t, tier: t.route(tier, "key"),
    "owners": lambda t, tier: t.owners(tier, [1, 5]),
    "route_many": lambda t, tier: t.route_many(tier, ["key", 5]),
}


@pytest.mark.parametrize("tier", NOT_TEXT)
@pytest.mark.parametrize("lookup", sorted(LOOKUPS))
def test_a_lookup_of_a_tier_that_is_not_text_raises_unknown_tier(lookup: str, tier: str) -> None:
    topology = populated()
    with pytest.raises(UnknownTier, match=r"\\ud800|\\udfff"):
        LOOKUPS[lookup](topology, tier)


def row(**changes: Any) -> dict[str, Any]:
    fields = {
        "bucket_id_start": 1,
        "bucket_id_end": 10,
        "current_replicaset_uuid": rs_uuid(2),
        "state": "active",
        "tier_name": "a",
    }
    return {**fields, **changes}


SNAPSHOTS: list[tuple[str, list[Any], str]] = [
    ("a", [row(tier_name=SURROGATE)], "field 'tier_name' must be valid text"),
    ("a", [row(tier_name="a" + SURROGATE)], "field 'tier_name' must be valid text"),
    ("a", [row(current_replicaset_uuid=SURROGATE)], "field 'current_replicaset_uuid'"),
    ("a", [BucketEvent(SURROGATE, 1, 10, rs_uuid(2))], "field 'tier' must be valid text"),
    ("a", [BucketEvent("a", 1, 10, rs_uuid(2), op=SURROGATE)], "field 'op'"),  # type: ignore[arg-type]
    (SURROGATE, [], "field 'tier' must be valid text"),
    ("a" + SURROGATE, [row()], "field 'tier' must be valid text"),
]


@pytest.mark.parametrize(("tier", "poll", "message"), SNAPSHOTS)
def test_a_snapshot_with_text_that_is_not_text_raises_invalid_event(
    tier: str, poll: list[Any], message: str
) -> None:
    for topology in (populated(), Topology()):  # with tiers configured, and before
        before = full_state(topology)
        with pytest.raises(InvalidEvent, match=message):
            topology.apply_bucket_snapshot(tier, poll)
        assert full_state(topology) == before


def test_a_row_whose_tier_is_not_text_is_not_an_event() -> None:
    with pytest.raises(InvalidEvent, match="field 'tier_name' must be valid text"):
        BucketEvent.from_row(row(tier_name=SURROGATE))


@pytest.mark.parametrize(
    "tiers",
    [{SURROGATE: 5}, {"a" + SURROGATE: 5}, {"a": 5, SURROGATE: 5}],
)
def test_a_tier_configuration_naming_a_tier_that_is_not_text_is_rejected(
    tiers: dict[str, int],
) -> None:
    topology = Topology()
    with pytest.raises(InvalidEvent, match="a tier must map a str to an int"):
        topology.apply_tiers(tiers)
    assert topology.tiers == {}
    assert topology.bucket_maps == {}
