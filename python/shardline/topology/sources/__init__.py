"""Topology sources: where a :class:`shardline.Topology` learns the cluster from.

Every source is a :class:`TopologySource`: an async iterable of :data:`TopologyChange` with a
``run(topology)`` helper, ``refresh()``, ``trigger()`` and a ``state`` report.
:class:`PollingSource` polls Picodata's system tables over pgwire; :class:`NotificationSource`
applies pushed topology events in raft order, through a transport (``PgNotifyTransport``: the
PostgreSQL ``LISTEN``/``NOTIFY`` stand-in). Both need the ``pg`` extra only to talk PostgreSQL;
the modules that import its driver load on first use, so this package loads without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardline._core import BucketPayload
from shardline._lazy import lazy_exports
from shardline.topology.sources.changes import (
    BucketSnapshot,
    TopologyChange,
    TopologySnapshot,
    apply_change,
)
from shardline.topology.sources.empty_maps import EMPTY_MAP_WARNING_AFTER
from shardline.topology.sources.notification import DeliveryStats, NotificationSource
from shardline.topology.sources.notification_documents import RaftPosition
from shardline.topology.sources.notification_transport import (
    NotificationSession,
    NotificationTransport,
    TransportError,
)
from shardline.topology.sources.source import TopologySource
from shardline.topology.sources.state import FailureReason, SourceState

if TYPE_CHECKING:
    from shardline.topology.sources.pg_notify import PgNotifyTransport
    from shardline.topology.sources.polling import PollingSource

__all__ = [
    "EMPTY_MAP_WARNING_AFTER",
    "BucketPayload",
    "BucketSnapshot",
    "DeliveryStats",
    "FailureReason",
    "NotificationSession",
    "NotificationSource",
    "NotificationTransport",
    "PgNotifyTransport",
    "PollingSource",
    "RaftPosition",
    "SourceState",
    "TopologyChange",
    "TopologySnapshot",
    "TopologySource",
    "TransportError",
    "apply_change",
]


# the pg extra is optional: import its driver only for a caller that talks to PostgreSQL
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "shardline.topology.sources.polling": ["PollingSource"],
        "shardline.topology.sources.pg_notify": ["PgNotifyTransport"],
    },
)
