"""`DiscoveryEvent`: a worker joining, changing or leaving, as discovery reports it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from shardline.pool.metadata import WorkerMetadata

__all__ = ["DiscoveryEvent", "DiscoveryEventType"]

DiscoveryEventType = Literal["worker-added", "worker-updated", "worker-dropped"]


@dataclass(frozen=True, slots=True)
class DiscoveryEvent:
    """``worker-added`` (a worker announced itself), ``worker-updated`` (its record changed) or
    ``worker-dropped`` (it left), with the worker's current (or, when dropped, last) record."""

    type: DiscoveryEventType
    metadata: WorkerMetadata
