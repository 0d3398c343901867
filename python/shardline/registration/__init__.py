"""Reachability records that reconverge on the truth: a replica re-asserts its service's record
after each successful probe, so a successor that never came up cannot pin it wrong.

:class:`RecordStore` is the contract (:class:`MemoryRecordStore` within one process);
:class:`RegistrationKeeper` keeps a record from a replica's side; :func:`advertised_address`
reads one; :class:`RegistrationDiscovery` turns records into pool events.
"""

from shardline.registration.clock import Clock, MonotonicClock
from shardline.registration.discovery import (
    SERVICE_UID_NAMESPACE,
    RegistrationDiscovery,
    service_uid,
)
from shardline.registration.keeper import RegistrationKeeper
from shardline.registration.memory_store import MemoryRecordStore
from shardline.registration.reader import Liveness, advertised_address
from shardline.registration.record import Record, RecordStore

# EtcdRecordStore (etcd_store.py, needing the etcd extra) is wired in separately.

__all__ = [
    "SERVICE_UID_NAMESPACE",
    "Clock",
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
