"""Balancers: they order candidate workers by uid; the proxy dispatches."""

from shardline.balancers.protocol import LoadBalancerLike
from shardline.balancers.round_robin import RoundRobinLoadBalancer

__all__ = ["LoadBalancerLike", "RoundRobinLoadBalancer"]
