"""SQL on a Picodata cluster, routed by sharding key: :func:`connect` gives a :class:`Client`
whose keyed queries go over pgwire (asyncpg, the ``pg`` extra) to the master owning the key."""

from shardline.errors import NotPicodata
from shardline.picodata.client import DEFAULT_TIMEOUT, HEALTH_POLICY, Client, connect
from shardline.picodata.instance_pool import InstancePool
from shardline.picodata.sharding_keys import ShardingKey
from shardline.picodata.stats import ClientStats, Explanation, PoolStats

__all__ = [
    "DEFAULT_TIMEOUT",
    "HEALTH_POLICY",
    "Client",
    "ClientStats",
    "Explanation",
    "InstancePool",
    "NotPicodata",
    "PoolStats",
    "ShardingKey",
    "connect",
]
