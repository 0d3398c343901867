"""The cluster topology: instances, replicasets, per-tier bucket maps and routing. Sources that
feed it from a live cluster are in :mod:`shardline.topology.sources`; the cluster's instances
as pool members are :class:`shardline.discovery.TopologyDiscovery`."""

from shardline._core import BucketRange, Instance, Replicaset, RouteExplanation, Topology
from shardline.topology.events import BucketEvent, InstanceEvent, Op, ReplicasetEvent

__all__ = [
    "BucketEvent",
    "BucketRange",
    "Instance",
    "InstanceEvent",
    "Op",
    "Replicaset",
    "ReplicasetEvent",
    "RouteExplanation",
    "Topology",
]
