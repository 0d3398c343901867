"""Topology sources: where a :class:`shardline.Topology` learns the cluster from.

Every source is a :class:`TopologySource`: an async iterable of :data:`TopologyChange` with a
``run(topology)`` helper, ``refresh()``, ``trigger()`` and a ``state`` report.
:class:`PollingSource` polls Picodata's system tables over pgwire; it needs the ``pg`` extra
(psycopg) and is imported on first use, so this package loads without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardline.topology.sources.changes import (
    BucketSnapshot,
    TopologyChange,
    TopologySnapshot,
    apply_change,
)
from shardline.topology.sources.source import TopologySource
from shardline.topology.sources.state import FailureReason, SourceState

if TYPE_CHECKING:
    from shardline.topology.sources.polling import PollingSource

__all__ = [
    "BucketSnapshot",
    "FailureReason",
    "PollingSource",
    "SourceState",
    "TopologyChange",
    "TopologySnapshot",
    "TopologySource",
    "apply_change",
]


def __getattr__(name: str) -> Any:
    if name == "PollingSource":
        from shardline.topology.sources.polling import PollingSource

        return PollingSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
