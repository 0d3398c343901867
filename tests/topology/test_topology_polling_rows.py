"""Catalog rows into a Membership and events, and apply_change of snapshots: no server needed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from shardline import InstanceEvent, ReplicasetEvent, Topology, UnknownTier
from shardline.topology.sources import BucketSnapshot, TopologySnapshot, apply_change
from shardline.topology.sources.membership import CatalogError, Membership
from support.replicasets import inst_uuid, rs_uuid

TIERS = [("default", 3000), ("other", 100)]


def rows(
    *,
    replicasets: list[tuple[Any, ...]] | None = None,
    instances: list[tuple[Any, ...]] | None = None,
    addresses: list[tuple[Any, ...]] | None = None,
    scope: frozenset[str] | None = None,
) -> Membership:
    """A membership of these rows; a replicaset row of four columns is given the state
    ``"ready"`` as its fifth."""
    if replicasets is None:
        replicasets = [("r1", rs_uuid(1), "default", "i1"), ("r2", rs_uuid(2), "other", "i2")]
    return Membership.from_rows(
        TIERS,
        [(*row, "ready") if len(row) == 4 else row for row in replicasets],
        instances
        if instances is not None
        else [
            ("i1", inst_uuid(1), rs_uuid(1), 1, '["Online", 3]'),
            ("i2", inst_uuid(2), rs_uuid(2), 2, '{"Offline": 1}'),
        ],
        addresses if addresses is not None else [(1, "10.0.0.1:4327"), (2, "10.0.0.2:4327")],
        scope=scope,
    )


def test_rows_become_records() -> None:
    membership = rows()
    assert membership.tiers == {"default": 3000, "other": 100}
    assert membership.replicasets[rs_uuid(1)].current_master_uuid == inst_uuid(1)
    first, second = membership.instances[inst_uuid(1)], membership.instances[inst_uuid(2)]
    assert (first.current_state, first.address) == ("Online", "10.0.0.1:4327")
    assert (second.current_state, second.replicaset_uuid) == ("Offline", rs_uuid(2))


@pytest.mark.parametrize(
    ("state", "name"),
    [
        (["Online", 1], "Online"),
        (("Offline", 2), "Offline"),
        ({"Offline": 0}, "Offline"),
        (b'["Online", 1]', "Online"),
        (None, None),
    ],
)
def test_current_state_in_its_several_forms(state: Any, name: str | None) -> None:
    membership = rows(instances=[("i1", inst_uuid(1), rs_uuid(1), 1, state)])
    assert membership.instances[inst_uuid(1)].current_state == name


def test_uuids_are_made_canonical_and_unknown_masters_are_none() -> None:
    membership = rows(
        replicasets=[("r1", rs_uuid(1).upper(), "default", "gone"), ("r2", rs_uuid(2), "x", "")],
        instances=[("i1", "{" + inst_uuid(1) + "}", rs_uuid(1).upper(), 1, '["Online", 1]')],
    )
    assert set(membership.replicasets) == {rs_uuid(1), rs_uuid(2)}
    assert membership.replicasets[rs_uuid(1)].current_master_uuid is None
    assert membership.replicasets[rs_uuid(2)].current_master_uuid is None
    assert membership.instances[inst_uuid(1)].replicaset_uuid == rs_uuid(1)


def test_an_instance_without_an_address_has_none() -> None:
    assert rows(addresses=[]).instances[inst_uuid(1)].address is None


@pytest.mark.parametrize(
    ("kwargs", "reason", "message"),
    [
        ({"replicasets": [("r1", 42, "default", None)]}, "malformed-row", "uuid"),
        ({"replicasets": [("r1", rs_uuid(1), None, None)]}, "malformed-row", "tier"),
        ({"replicasets": [("r1", rs_uuid(1))]}, "malformed-row", "no column 'tier'"),
        (
            {"replicasets": [("r1", rs_uuid(1), "default", None, None)]},
            "malformed-row",
            "state must be a non-empty string, got None",
        ),
        (
            {"replicasets": [("r1", rs_uuid(1), "default", None, 1)]},
            "malformed-row",
            "state must be a non-empty string, got 1",
        ),
        (
            {"replicasets": [("r1", rs_uuid(1), "default", None)] * 2},
            "malformed-row",
            "duplicate",
        ),
        ({"instances": [("i1", inst_uuid(1), rs_uuid(1), "1", None)]}, "malformed-row", "raft_id"),
        ({"instances": [("i1", inst_uuid(1), rs_uuid(1), True, None)]}, "malformed-row", "raft_id"),
        ({"instances": [("i1", inst_uuid(1), None, 1, 7)]}, "malformed-row", "current_state"),
        ({"addresses": [(1, "a"), (1, "b")]}, "malformed-row", "two addresses"),
        ({"addresses": [(1, "x" * 5000)]}, "too-large", "address"),
    ],
)
def test_malformed_rows_are_refused_with_the_reason(
    kwargs: dict[str, Any], reason: str, message: str
) -> None:
    with pytest.raises(CatalogError, match=message) as caught:
        rows(**kwargs)
    assert caught.value.reason == reason


def test_a_malformed_bucket_count_is_refused() -> None:
    for count in (-1, 2**32, "3000", None, True):
        with pytest.raises(CatalogError, match="bucket_count"):
            Membership.from_rows([("default", count)], [], [], [])


def test_scope_keeps_the_tiers_replicasets_and_their_instances() -> None:
    membership = rows(scope=frozenset({"other"}))
    assert membership.tiers == {"other": 100}
    assert set(membership.replicasets) == {rs_uuid(2)}
    assert set(membership.instances) == {inst_uuid(2)}


def test_events_since_orders_replicasets_then_instances_and_deletes_the_vanished() -> None:
    before = rows()
    after = rows(
        replicasets=[("r1", rs_uuid(1), "default", "i3"), ("r3", rs_uuid(3), "other", None)],
        instances=[
            ("i1", inst_uuid(1), rs_uuid(1), 1, '["Online", 3]'),
            ("i3", inst_uuid(3), rs_uuid(1), 3, '["Online", 1]'),
        ],
    )
    assert after.events_since(before) == [
        ReplicasetEvent(
            "replace", rs_uuid(1), tier="default", current_master_uuid=inst_uuid(3), name="r1"
        ),
        ReplicasetEvent("replace", rs_uuid(3), tier="other", name="r3"),
        ReplicasetEvent("delete", rs_uuid(2)),
        InstanceEvent("replace", inst_uuid(3), rs_uuid(1), "Online", None, name="i3"),
        InstanceEvent("delete", inst_uuid(2)),
    ]
    assert after.events_since(after) == []


def test_an_instance_losing_a_field_is_deleted_then_added() -> None:
    before = rows()
    after = rows(addresses=[(2, "10.0.0.2:4327")])
    assert after.events_since(before) == [
        InstanceEvent("delete", inst_uuid(1)),
        InstanceEvent("replace", inst_uuid(1), rs_uuid(1), "Online", None, name="i1"),
    ]


# apply_change


def snapshot(membership: Membership, **kwargs: Any) -> TopologySnapshot:
    replicasets, instances = membership.events()
    return TopologySnapshot(membership.tiers, replicasets, instances, **kwargs)


def test_a_topology_snapshot_makes_the_topology_exactly_the_snapshot() -> None:
    topology = Topology()
    first = snapshot(rows(), buckets=(BucketSnapshot("default", "[]"),))
    assert apply_change(topology, first) > 0
    assert apply_change(topology, first) == 0  # nothing new
    smaller = rows(
        replicasets=[("r1", rs_uuid(1), "default", "i1")],
        instances=[("i1", inst_uuid(1), rs_uuid(1), 1, None)],
        addresses=[],
    )
    apply_change(topology, snapshot(smaller))
    assert set(topology.replicasets) == {rs_uuid(1)}
    assert set(topology.instances) == {inst_uuid(1)}
    # the fields the snapshot no longer gives are gone, not left as they were
    instance = topology.instances[inst_uuid(1)]
    assert (instance.current_state, instance.address) == (None, None)


def test_a_scoped_snapshot_leaves_other_tiers_alone() -> None:
    topology = Topology()
    apply_change(topology, snapshot(rows()))
    only_other = rows(replicasets=[], instances=[], addresses=[], scope=frozenset({"other"}))
    apply_change(topology, snapshot(only_other, scope=frozenset({"other"})))
    assert set(topology.replicasets) == {rs_uuid(1)}
    assert set(topology.instances) == {inst_uuid(1)}


def test_bucket_maps_of_tiers_the_topology_cannot_hold_are_reported_after_the_rest() -> None:
    topology = Topology()
    topology.apply_tiers({"default": 3000})
    payload = (
        '[{"bucket_id_start": 1, "bucket_id_end": 3000, "tier_name": "default",'
        f' "state": "active", "current_replicaset_uuid": "{rs_uuid(1)}"}}]'
    )
    change = snapshot(
        rows(), buckets=(BucketSnapshot("default", payload), BucketSnapshot("other", "[]"))
    )
    with pytest.raises(UnknownTier, match="'other'"):
        apply_change(topology, change)
    assert topology.ranges("default") == [(1, 3000, rs_uuid(1))]
    assert set(topology.replicasets) == {rs_uuid(1), rs_uuid(2)}


def test_shardline_loads_without_a_pgwire_driver(child_python: Callable[[str], str]) -> None:
    probe = (
        "import sys, shardline, shardline.topology.sources, shardline.cli;"
        "from shardline.topology.sources import TopologySource, apply_change;"
        "print(sorted(m for m in ('asyncpg', 'psycopg') if m in sys.modules))"
    )
    assert child_python(probe) == "[]"
