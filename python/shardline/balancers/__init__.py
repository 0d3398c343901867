"""Balancers: they order candidate workers by uid; the proxy dispatches (the two protocols:
:mod:`shardline.balancers.protocol`)."""

from shardline.balancers.affinity import AffinityLoadBalancer
from shardline.balancers.bucket import BucketLoadBalancer
from shardline.balancers.explanation import (
    Candidate,
    CandidateOrder,
    DispatchExplanation,
    Excluded,
)
from shardline.balancers.least_loaded import LeastLoadedLoadBalancer
from shardline.balancers.protocol import LoadBalancerLike, SelectLoadBalancer
from shardline.balancers.registry import balancer_names, create_balancer
from shardline.balancers.round_robin import RoundRobinLoadBalancer
from shardline.balancers.weighted import WeightedRoundRobinLoadBalancer

__all__ = [
    "AffinityLoadBalancer",
    "BucketLoadBalancer",
    "Candidate",
    "CandidateOrder",
    "DispatchExplanation",
    "Excluded",
    "LeastLoadedLoadBalancer",
    "LoadBalancerLike",
    "RoundRobinLoadBalancer",
    "SelectLoadBalancer",
    "WeightedRoundRobinLoadBalancer",
    "balancer_names",
    "create_balancer",
]
