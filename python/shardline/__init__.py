"""shardline: a client-side, converged view of a cluster that routes every call to the live node
that should serve it.

The hot state (bucket maps, hashing) lives in the Rust extension ``shardline._core``; this package
re-exports it with the events, errors and tools around it.
"""

from typing import TYPE_CHECKING, Any

from shardline._core import bucket_id
from shardline.balancers import (
    AffinityLoadBalancer,
    BucketLoadBalancer,
    LeastLoadedLoadBalancer,
    LoadBalancerLike,
    RoundRobinLoadBalancer,
    SelectLoadBalancer,
    WeightedRoundRobinLoadBalancer,
)
from shardline.discovery import DiscoveryEvent
from shardline.errors import (
    InstanceUnavailable,
    InvalidArgument,
    InvalidEvent,
    InvalidRecord,
    NoWorkersAvailable,
    PoolTimeout,
    RpcError,
    ShardlineError,
    TierWithoutBuckets,
    TransientRpcError,
    UnhashableKey,
    UnknownTier,
    WorkerError,
    WorkerStartError,
)
from shardline.pool import (
    LoadBalancerContext,
    LoadBalancerContextView,
    WorkerMetadata,
    WorkerPool,
)
from shardline.pool.proxy import WorkerProxy
from shardline.topology import (
    BucketEvent,
    BucketRange,
    Instance,
    InstanceEvent,
    Replicaset,
    ReplicasetEvent,
    Topology,
    TopologyDiscovery,
)

__all__ = [
    "AffinityLoadBalancer",
    "BucketEvent",
    "BucketLoadBalancer",
    "BucketRange",
    "DiscoveryEvent",
    "Instance",
    "InstanceEvent",
    "InstanceUnavailable",
    "InvalidArgument",
    "InvalidEvent",
    "InvalidRecord",
    "LeastLoadedLoadBalancer",
    "LoadBalancerContext",
    "LoadBalancerContextView",
    "LoadBalancerLike",
    "LocalPool",
    "NoWorkersAvailable",
    "PoolTimeout",
    "Replicaset",
    "ReplicasetEvent",
    "RoundRobinLoadBalancer",
    "RpcError",
    "SelectLoadBalancer",
    "ShardlineError",
    "TierWithoutBuckets",
    "Topology",
    "TopologyDiscovery",
    "TransientRpcError",
    "UnhashableKey",
    "UnknownTier",
    "WeightedRoundRobinLoadBalancer",
    "WorkerError",
    "WorkerMetadata",
    "WorkerPool",
    "WorkerProxy",
    "WorkerStartError",
    "bucket_id",
]

if TYPE_CHECKING:
    from shardline.transport.local_pool import LocalPool


__version__: str
"""The installed distribution's version (``"unknown"`` in a source tree never installed)."""


def __getattr__(name: str) -> Any:
    # a transport's dependencies are an optional extra: import it only for a caller that uses it
    if name == "LocalPool":
        from shardline.transport.local_pool import LocalPool

        return LocalPool
    # read from the package metadata on first use: importing importlib.metadata costs more
    # than the rest of `import shardline`
    if name == "__version__":
        import importlib.metadata

        try:
            return importlib.metadata.version("shardline")
        except importlib.metadata.PackageNotFoundError:
            return "unknown"
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
