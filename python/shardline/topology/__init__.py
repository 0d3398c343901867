"""The cluster topology: instances, replicasets, per-tier bucket maps, and routing."""

from shardline._core import Instance, Replicaset, Topology
from shardline.topology.events import BucketEvent, InstanceEvent, Op, ReplicasetEvent

__all__ = [
    "BucketEvent",
    "Instance",
    "InstanceEvent",
    "Op",
    "Replicaset",
    "ReplicasetEvent",
    "Topology",
]
