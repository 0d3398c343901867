"""The cluster topology: instances, replicasets, per-tier bucket maps, routing, and the cluster's
instances as pool members (:class:`TopologyDiscovery`). Sources that feed it from a live
cluster are in :mod:`shardline.topology.sources`."""

from shardline._core import BucketRange, Instance, Replicaset, Topology
from shardline.topology.discovery import TopologyDiscovery, instance_record
from shardline.topology.events import BucketEvent, InstanceEvent, Op, ReplicasetEvent

__all__ = [
    "BucketEvent",
    "BucketRange",
    "Instance",
    "InstanceEvent",
    "Op",
    "Replicaset",
    "ReplicasetEvent",
    "Topology",
    "TopologyDiscovery",
    "instance_record",
]
