"""Names of instances and replicasets: carried by events, kept by a replace that omits them."""

from __future__ import annotations

import pytest

from shardline import InvalidEvent, Topology
from shardline.topology import Instance, InstanceEvent, Replicaset, ReplicasetEvent

RS = "00000000-0000-0000-0000-0000000000a1"
I1 = "00000000-0000-0000-0000-0000000000b1"


@pytest.fixture
def named() -> Topology:
    topology = Topology()
    topology.apply_tiers({"default": 16})
    topology.apply(ReplicasetEvent("replace", RS, tier="default", name="storage_1"))
    topology.apply(InstanceEvent("replace", I1, replicaset_uuid=RS, name="storage_1_1"))
    return topology


def test_a_replace_without_a_name_keeps_the_name(named: Topology) -> None:
    named.apply(ReplicasetEvent("replace", RS, current_master_uuid=I1))
    named.apply(InstanceEvent("replace", I1, current_state="Online", address="127.0.0.1:1"))
    assert named.replicasets[RS] == Replicaset(RS, "default", I1, name="storage_1")
    assert named.instances[I1] == Instance(I1, RS, "Online", "127.0.0.1:1", name="storage_1_1")


def test_a_replace_with_a_name_renames(named: Topology) -> None:
    named.apply(ReplicasetEvent("replace", RS, name="renamed"))
    named.apply(InstanceEvent("replace", I1, name="renamed_1"))
    assert named.replicasets[RS].name == "renamed"
    assert named.instances[I1].name == "renamed_1"


def test_a_delete_forgets_the_name(named: Topology) -> None:
    named.apply(InstanceEvent("delete", I1))
    named.apply(InstanceEvent("replace", I1, replicaset_uuid=RS))
    assert named.instances[I1].name is None


@pytest.mark.parametrize("name", [7, b"storage_1", ["storage_1"]])
def test_a_name_that_is_not_a_str_is_refused(named: Topology, name: object) -> None:
    with pytest.raises(InvalidEvent, match="name"):
        named.apply(InstanceEvent("replace", I1, name=name))  # type: ignore[arg-type]
    assert named.instances[I1].name == "storage_1_1"
