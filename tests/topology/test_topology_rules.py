"""The event rules of the topology, one named test each (issue rules 1-7 and 10)."""

from __future__ import annotations

from shardline import BucketEvent, Instance, InstanceEvent, ReplicasetEvent, Topology
from support.replicasets import add_replicaset, inst_uuid, names, rs_uuid


def bucket(n: int, start: int, end: int, tier: str = "default") -> BucketEvent:
    return BucketEvent(tier, start, end, rs_uuid(n))


def three_replicasets(topology: Topology) -> None:
    for n in (1, 2, 3):
        add_replicaset(topology, n)
    for n, (start, end) in zip((1, 2, 3), [(1, 1000), (1001, 2000), (2001, 3000)], strict=True):
        topology.apply(bucket(n, start, end))


def test_rule1_instance_replace_upserts_given_fields_and_delete_removes(topology: Topology) -> None:
    i = inst_uuid(1)
    topology.apply(InstanceEvent("replace", i, replicaset_uuid=rs_uuid(1), current_state="Offline"))
    assert topology.instances[i] == Instance(i, rs_uuid(1), "Offline", None)
    assert not topology.instances[i].is_online
    topology.apply(InstanceEvent("replace", i, current_state="Online", address="127.0.0.1:3301"))
    assert topology.instances[i] == Instance(i, rs_uuid(1), "Online", "127.0.0.1:3301")
    assert topology.instances[i].is_online
    topology.apply(InstanceEvent("delete", i))
    assert i not in topology.instances
    topology.apply(InstanceEvent("delete", i))
    assert topology.instances == {}


def test_rule1_instances_never_touch_bucket_maps(topology: Topology) -> None:
    three_replicasets(topology)
    epoch = topology.epoch("default")
    topology.apply(InstanceEvent("replace", inst_uuid(2), current_state="Offline"))
    topology.apply(InstanceEvent("delete", inst_uuid(3)))
    assert names(topology) == [(1, 1000, "R1"), (1001, 2000, "R2"), (2001, 3000, "R3")]
    assert topology.epoch("default") == epoch


def test_rule2_replicaset_delete_removes_it_and_clears_its_tier(topology: Topology) -> None:
    three_replicasets(topology)
    add_replicaset(topology, 4, tier="other")
    topology.apply(bucket(4, 1, 3000, tier="other"))
    topology.apply(ReplicasetEvent("delete", rs_uuid(2)))
    assert rs_uuid(2) not in topology.replicasets
    assert topology.ranges("default") == []
    assert names(topology, "other") == [(1, 3000, "R4")]


def test_rule3_new_replicaset_in_registered_tier_clears_its_map(topology: Topology) -> None:
    three_replicasets(topology)
    topology.apply(ReplicasetEvent("replace", rs_uuid(4), tier="default"))
    assert topology.ranges("default") == []
    assert topology.replicasets[rs_uuid(4)].tier == "default"


def test_rule3_new_replicaset_in_new_tier_creates_an_empty_map() -> None:
    topology = Topology()
    topology.apply(ReplicasetEvent("replace", rs_uuid(1), tier="fresh"))
    assert topology.bucket_maps == {"fresh": []}
    assert topology.epoch("fresh") == 0


def test_rule4_known_replicaset_master_switch_leaves_maps_alone(topology: Topology) -> None:
    three_replicasets(topology)
    epoch = topology.epoch("default")
    topology.apply(ReplicasetEvent("replace", rs_uuid(2), current_master_uuid=inst_uuid(9)))
    assert topology.replicasets[rs_uuid(2)].current_master_uuid == inst_uuid(9)
    assert topology.replicasets[rs_uuid(2)].tier == "default"
    assert names(topology) == [(1, 1000, "R1"), (1001, 2000, "R2"), (2001, 3000, "R3")]
    assert topology.epoch("default") == epoch


def test_rule4_tier_change_clears_old_and_new_tier(topology: Topology) -> None:
    three_replicasets(topology)
    add_replicaset(topology, 4, tier="other")
    topology.apply(bucket(4, 1, 3000, tier="other"))
    topology.apply(ReplicasetEvent("replace", rs_uuid(3), tier="other"))
    assert topology.ranges("default") == []
    assert topology.ranges("other") == []
    assert topology.replicasets[rs_uuid(3)].tier == "other"
    assert topology.replicasets[rs_uuid(3)].current_master_uuid == inst_uuid(3)


def test_rule5_overlap_clears_then_upserts(topology: Topology) -> None:
    three_replicasets(topology)
    topology.apply(bucket(1, 900, 1100))
    assert names(topology) == [(900, 1100, "R1")]


def test_rule5_same_bounds_other_replicaset_is_an_overlap(topology: Topology) -> None:
    three_replicasets(topology)
    topology.apply(bucket(3, 1, 1000))
    assert names(topology) == [(1, 1000, "R3")]


def test_rule5_disjoint_range_is_added_without_clearing(topology: Topology) -> None:
    add_replicaset(topology, 1)
    topology.apply(bucket(1, 2001, 3000))
    topology.apply(bucket(1, 1, 1000))
    assert names(topology) == [(1, 1000, "R1"), (2001, 3000, "R1")]


def test_rule5_identical_redelivery_is_a_no_op(topology: Topology) -> None:
    three_replicasets(topology)
    epoch = topology.epoch("default")
    for n, (start, end) in zip((1, 2, 3), [(1, 1000), (1001, 2000), (2001, 3000)], strict=True):
        topology.apply(bucket(n, start, end))
    assert names(topology) == [(1, 1000, "R1"), (1001, 2000, "R2"), (2001, 3000, "R3")]
    assert topology.epoch("default") == epoch


def test_rule5_bucket_delete_removes_identical_and_clears_on_partial(topology: Topology) -> None:
    three_replicasets(topology)
    topology.apply(BucketEvent("default", 1, 1000, rs_uuid(1), op="delete"))
    assert names(topology) == [(1001, 2000, "R2"), (2001, 3000, "R3")]
    topology.apply(BucketEvent("default", 1500, 2500, rs_uuid(2), op="delete"))
    assert topology.ranges("default") == []


def test_rule6_clearing_one_tier_leaves_every_other_tier_untouched(topology: Topology) -> None:
    three_replicasets(topology)
    add_replicaset(topology, 4, tier="other")
    for start in range(1, 3000, 10):
        topology.apply(bucket(4, start, start + 9, tier="other"))
    other_before, other_epoch = topology.ranges("other"), topology.epoch("other")
    topology.apply(ReplicasetEvent("delete", rs_uuid(1)))
    assert topology.ranges("default") == []
    assert topology.ranges("other") == other_before
    assert topology.epoch("other") == other_epoch


def test_rule7_seed_case_replicaset_expelled(topology: Topology) -> None:
    three_replicasets(topology)
    topology.apply(ReplicasetEvent("delete", rs_uuid(2)))
    assert names(topology) == []
    topology.apply(bucket(1, 1, 1500))
    assert names(topology) == [(1, 1500, "R1")]
    topology.apply(bucket(3, 1501, 3000))
    assert names(topology) == [(1, 1500, "R1"), (1501, 3000, "R3")]


def test_rule7_seed_case_replicaset_added(topology: Topology) -> None:
    add_replicaset(topology, 1)
    add_replicaset(topology, 2)
    topology.apply(bucket(1, 1, 1500))
    topology.apply(bucket(2, 1501, 3000))
    add_replicaset(topology, 3)
    assert names(topology) == []
    topology.apply(bucket(1, 1, 1000))
    assert names(topology) == [(1, 1000, "R1")]
    topology.apply(bucket(2, 1001, 2000))
    assert names(topology) == [(1, 1000, "R1"), (1001, 2000, "R2")]
    topology.apply(bucket(3, 2001, 3000))
    assert names(topology) == [(1, 1000, "R1"), (1001, 2000, "R2"), (2001, 3000, "R3")]


def test_rule7_seed_case_weights_changed_without_replicaset_event(topology: Topology) -> None:
    three_replicasets(topology)
    topology.apply(bucket(1, 1, 750))
    assert names(topology) == [(1, 750, "R1")]
    topology.apply(bucket(2, 751, 1500))
    assert names(topology) == [(1, 750, "R1"), (751, 1500, "R2")]
    topology.apply(bucket(3, 1501, 3000))
    assert names(topology) == [(1, 750, "R1"), (751, 1500, "R2"), (1501, 3000, "R3")]


def test_rule10_every_map_change_bumps_the_epoch_and_nothing_else_does(topology: Topology) -> None:
    add_replicaset(topology, 1)
    epochs = [topology.epoch("default")]
    topology.apply(bucket(1, 1, 100))
    epochs.append(topology.epoch("default"))
    topology.apply(bucket(1, 1, 100))
    epochs.append(topology.epoch("default"))
    topology.apply(bucket(1, 101, 200))
    epochs.append(topology.epoch("default"))
    topology.apply(ReplicasetEvent("replace", rs_uuid(1), current_master_uuid=inst_uuid(5)))
    epochs.append(topology.epoch("default"))
    topology.apply(ReplicasetEvent("replace", rs_uuid(2), tier="default"))
    epochs.append(topology.epoch("default"))
    topology.apply(ReplicasetEvent("replace", rs_uuid(3), tier="default"))
    epochs.append(topology.epoch("default"))
    assert epochs == [0, 1, 1, 2, 2, 3, 3]
