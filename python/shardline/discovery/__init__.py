"""Discovery: where the pool learns which workers exist.

Backends: :class:`InProcessDiscovery` (one process), :class:`LocalDiscovery` (processes on one
machine, no server) and ``EtcdDiscovery`` (an etcd cluster; needs the ``etcd`` extra, and is
imported only when first used). All follow the :class:`Discovery` contract and exchange records
in the schema of :mod:`shardline.discovery.record`.
"""

from typing import TYPE_CHECKING

from shardline._lazy import lazy_exports
from shardline.discovery.event import DiscoveryEvent, DiscoveryEventType
from shardline.discovery.in_process import InProcessDiscovery
from shardline.discovery.local import LocalDiscovery
from shardline.discovery.protocol import Discovery, DiscoveryPublisher, RecordFilter
from shardline.discovery.subscription import Subscription

if TYPE_CHECKING:
    from shardline.discovery.etcd import EtcdDiscovery

__all__ = [
    "Discovery",
    "DiscoveryEvent",
    "DiscoveryEventType",
    "DiscoveryPublisher",
    "EtcdDiscovery",
    "InProcessDiscovery",
    "LocalDiscovery",
    "RecordFilter",
    "Subscription",
]


# grpcio and aetcd are an optional extra: import them only for a caller that uses etcd
__getattr__ = lazy_exports(__name__, {"shardline.discovery.etcd": ["EtcdDiscovery"]})
