"""Reachability records that reconverge on the truth: a replica re-asserts its service's record
after each successful probe, so a successor that never came up cannot pin it wrong.

:class:`RecordStore` is the contract (:class:`MemoryRecordStore` within one process,
``EtcdRecordStore`` across machines: the ``etcd`` extra, imported on first use);
:class:`RegistrationKeeper` keeps a record from a replica's side; :func:`advertised_address`
reads one; :class:`RegistrationDiscovery` turns records into pool events.
"""

from typing import TYPE_CHECKING

from shardline._lazy import lazy_exports
from shardline.registration.clock import Clock, MonotonicClock
from shardline.registration.discovery import (
    SERVICE_UID_NAMESPACE,
    RegistrationDiscovery,
    service_uid,
)
from shardline.registration.keeper import (
    KEEPER_STATES,
    KeeperState,
    KeeperStats,
    RegistrationKeeper,
)
from shardline.registration.memory_store import MemoryRecordStore
from shardline.registration.reader import Liveness, advertised_address
from shardline.registration.record import Record, RecordStore

if TYPE_CHECKING:
    from shardline.registration.etcd_store import EtcdRecordStore

__all__ = [
    "KEEPER_STATES",
    "SERVICE_UID_NAMESPACE",
    "Clock",
    "EtcdRecordStore",
    "KeeperState",
    "KeeperStats",
    "Liveness",
    "MemoryRecordStore",
    "MonotonicClock",
    "Record",
    "RecordStore",
    "RegistrationDiscovery",
    "RegistrationKeeper",
    "advertised_address",
    "service_uid",
]


# grpcio and aetcd are an optional extra: import them only for a caller that uses etcd
__getattr__, __dir__ = lazy_exports(
    __name__, {"shardline.registration.etcd_store": ["EtcdRecordStore"]}
)
