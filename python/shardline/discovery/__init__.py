"""Discovery: where the pool learns which workers exist.

Backends: :class:`InProcessDiscovery` (one process), :class:`LocalDiscovery` (processes on one
machine, no server) and ``EtcdDiscovery`` (an etcd cluster; needs the ``etcd`` extra, and is
imported only when first used). All follow the :class:`Discovery` contract and exchange records
in the schema of :mod:`shardline.discovery.record`. :class:`TopologyDiscovery` (imported when
first used) makes a cluster's instances, as a topology source reports them, pool members.
"""

from typing import TYPE_CHECKING

from shardline._lazy import lazy_exports
from shardline.discovery.in_process import InProcessDiscovery
from shardline.discovery.local import LocalDiscovery
from shardline.discovery.protocol import Discovery, DiscoveryPublisher, RecordFilter
from shardline.discovery.subscription import DiscoveryStats, Subscription
from shardline.workers import DiscoveryEvent, DiscoveryEventType

if TYPE_CHECKING:
    from shardline.discovery.etcd import EtcdDiscovery
    from shardline.discovery.topology import TopologyDiscovery, instance_record

__all__ = [
    "Discovery",
    "DiscoveryEvent",
    "DiscoveryEventType",
    "DiscoveryPublisher",
    "DiscoveryStats",
    "EtcdDiscovery",
    "InProcessDiscovery",
    "LocalDiscovery",
    "RecordFilter",
    "Subscription",
    "TopologyDiscovery",
    "instance_record",
]


# grpcio and aetcd are an optional extra: import them only for a caller that uses etcd
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "shardline.discovery.etcd": ["EtcdDiscovery"],
        "shardline.discovery.topology": ["TopologyDiscovery", "instance_record"],
    },
)
