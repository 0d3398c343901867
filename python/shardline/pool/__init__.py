"""The worker pool: workers keyed by uid, and the view balancers read."""

from shardline._core import WorkerPool
from shardline.pool.context import LoadBalancerContext, LoadBalancerContextView, WorkersView
from shardline.pool.health import HealthPolicy, WorkerHealth
from shardline.workers import WorkerMetadata

__all__ = [
    "HealthPolicy",
    "LoadBalancerContext",
    "LoadBalancerContextView",
    "WorkerHealth",
    "WorkerMetadata",
    "WorkerPool",
    "WorkersView",
]
