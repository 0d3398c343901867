"""shardline: a client-side, converged view of a cluster that routes every call to the live node
that should serve it.

The hot state (bucket maps, hashing) lives in the Rust extension ``shardline._core``; this package
re-exports it with the events, errors and tools around it.
"""

from shardline._core import bucket_id
from shardline.balancers import LoadBalancerLike, RoundRobinLoadBalancer
from shardline.errors import InvalidEvent, ShardlineError, UnhashableKey, UnknownTier
from shardline.pool import LoadBalancerContext, LoadBalancerContextView, WorkerMetadata
from shardline.topology import (
    BucketEvent,
    Instance,
    InstanceEvent,
    Replicaset,
    ReplicasetEvent,
    Topology,
)

__all__ = [
    "BucketEvent",
    "Instance",
    "InstanceEvent",
    "InvalidEvent",
    "LoadBalancerContext",
    "LoadBalancerContextView",
    "LoadBalancerLike",
    "Replicaset",
    "ReplicasetEvent",
    "RoundRobinLoadBalancer",
    "ShardlineError",
    "Topology",
    "UnhashableKey",
    "UnknownTier",
    "WorkerMetadata",
    "bucket_id",
]
