"""A worker as discovery and the pool know it: its record (:class:`WorkerMetadata`) and the
events that admit, refresh and drop it (:class:`DiscoveryEvent`). The bottom of the worker
side: the pool, discovery, the proxy and the transports all import it, and it imports none
of them."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

__all__ = ["DiscoveryEvent", "DiscoveryEventType", "WorkerMetadata"]


@dataclass(frozen=True, slots=True)
class WorkerMetadata:
    """One worker's record, as discovery announces it.

    Identity is ``uid``: two records with the same uid describe the same worker, whatever else
    differs, and the pool never compares or hashes records (only uids).

    ``published`` is the wall-clock time (``time.time()`` of the publishing host) at which this
    version of the record was published, when the record carries one (``None`` otherwise: a
    record from an older publisher, or one no publisher wrote). It takes no part in comparing
    records: the same record published again is equal to the one before.
    """

    uid: uuid.UUID
    address: str
    pid: int
    version: str
    tags: frozenset[str] = frozenset()
    extra: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    published: float | None = field(default=None, compare=False)


DiscoveryEventType = Literal["worker-added", "worker-updated", "worker-dropped"]


@dataclass(frozen=True, slots=True)
class DiscoveryEvent:
    """``worker-added`` (a worker announced itself), ``worker-updated`` (its record changed) or
    ``worker-dropped`` (it left), with the worker's current (or, when dropped, last) record."""

    type: DiscoveryEventType
    metadata: WorkerMetadata
