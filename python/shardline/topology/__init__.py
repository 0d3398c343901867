"""The cluster topology: instances, replicasets, per-tier bucket maps, routing, and the cluster's
instances as pool members (:class:`TopologyDiscovery`, imported on first use: it brings asyncio
and the pool). Sources that feed it from a live cluster are in :mod:`shardline.topology.sources`."""

from typing import TYPE_CHECKING

from shardline._core import BucketRange, Instance, Replicaset, Topology
from shardline._lazy import lazy_exports
from shardline.topology.events import BucketEvent, InstanceEvent, Op, ReplicasetEvent

if TYPE_CHECKING:
    from shardline.topology.discovery import TopologyDiscovery, instance_record

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

__getattr__ = lazy_exports(
    __name__, {"shardline.topology.discovery": ["TopologyDiscovery", "instance_record"]}
)
