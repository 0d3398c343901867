"""shardline: a client-side, converged view of a cluster that routes every call to the live node
that should serve it.

The hot state (bucket maps, hashing) lives in the Rust extension ``shardline._core``; this package
re-exports it with the events, errors and tools around it.

Importing the package loads only the extension and the errors: ``from shardline import Topology,
bucket_id`` needs nothing more (no asyncio). Every other name here is imported with its module
the first time it is read; a name whose module needs an extra that is not installed raises
:class:`MissingExtra` then.
"""

from shardline._core import (
    BucketRange,
    Instance,
    MapStats,
    Replicaset,
    RouteExplanation,
    RouteStats,
    Topology,
    WorkerPool,
    bucket_id,
)
from shardline._lazy import lazy_exports
from shardline.errors import (
    DeadlineExceeded,
    InstanceUnavailable,
    InvalidAddress,
    InvalidArgument,
    InvalidArgumentType,
    InvalidEvent,
    InvalidRecord,
    MissingExtra,
    NoWorkersAvailable,
    OutcomeUnknown,
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

# `typing` alone costs about half of the import budget; type checkers honour this name as well
TYPE_CHECKING = False
if TYPE_CHECKING:
    from shardline._version import __version__ as __version__
    from shardline.balancers import (
        AffinityLoadBalancer,
        BucketLoadBalancer,
        DispatchExplanation,
        LeastLoadedLoadBalancer,
        LoadBalancerLike,
        RoundRobinLoadBalancer,
        SelectLoadBalancer,
        WeightedRoundRobinLoadBalancer,
    )
    from shardline.discovery.topology import TopologyDiscovery
    from shardline.pool import LoadBalancerContext, LoadBalancerContextView
    from shardline.proxy import ProxyStats, WorkerProxy
    from shardline.topology import BucketEvent, InstanceEvent, ReplicasetEvent
    from shardline.transport.local.pool import LocalPool
    from shardline.workers import DiscoveryEvent, WorkerMetadata

__all__ = [
    "AffinityLoadBalancer",
    "BucketEvent",
    "BucketLoadBalancer",
    "BucketRange",
    "DeadlineExceeded",
    "DiscoveryEvent",
    "DispatchExplanation",
    "Instance",
    "InstanceEvent",
    "InstanceUnavailable",
    "InvalidAddress",
    "InvalidArgument",
    "InvalidArgumentType",
    "InvalidEvent",
    "InvalidRecord",
    "LeastLoadedLoadBalancer",
    "LoadBalancerContext",
    "LoadBalancerContextView",
    "LoadBalancerLike",
    "LocalPool",
    "MapStats",
    "MissingExtra",
    "NoWorkersAvailable",
    "OutcomeUnknown",
    "PoolTimeout",
    "ProxyStats",
    "Replicaset",
    "ReplicasetEvent",
    "RoundRobinLoadBalancer",
    "RouteExplanation",
    "RouteStats",
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

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "shardline._version": ["__version__"],
        "shardline.balancers": [
            "AffinityLoadBalancer",
            "BucketLoadBalancer",
            "DispatchExplanation",
            "LeastLoadedLoadBalancer",
            "LoadBalancerLike",
            "RoundRobinLoadBalancer",
            "SelectLoadBalancer",
            "WeightedRoundRobinLoadBalancer",
        ],
        "shardline.discovery.topology": ["TopologyDiscovery"],
        "shardline.pool": ["LoadBalancerContext", "LoadBalancerContextView"],
        "shardline.proxy": ["ProxyStats", "WorkerProxy"],
        "shardline.topology": ["BucketEvent", "InstanceEvent", "ReplicasetEvent"],
        "shardline.workers": ["DiscoveryEvent", "WorkerMetadata"],
        "shardline.transport.local.pool": ["LocalPool"],
    },
)
