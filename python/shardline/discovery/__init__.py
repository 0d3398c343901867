"""Discovery: where the pool learns which workers exist.

Backends: :class:`InProcessDiscovery` (one process), ``LocalDiscovery`` (processes on one
machine, no server) and ``EtcdDiscovery`` (an etcd cluster; needs the ``etcd`` extra). All
follow the :class:`Discovery` contract and exchange records in the schema of
:mod:`shardline.discovery.record`.
"""

from shardline.discovery.event import DiscoveryEvent, DiscoveryEventType
from shardline.discovery.in_process import InProcessDiscovery
from shardline.discovery.protocol import Discovery, DiscoveryPublisher, RecordFilter
from shardline.discovery.subscription import Subscription

__all__ = [
    "Discovery",
    "DiscoveryEvent",
    "DiscoveryEventType",
    "DiscoveryPublisher",
    "InProcessDiscovery",
    "RecordFilter",
    "Subscription",
]
