"""A worker as discovery, the pool and the proxy know it: its record
(:class:`WorkerMetadata`), the events that admit, refresh and drop it
(:class:`DiscoveryEvent`), and the :class:`Connection` that reaches it, which each transport
makes. The bottom of the worker side: the pool, discovery, the proxy and the transports all
import it, and it imports none of them."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Literal, Protocol

from shardline._core import KeyedRecord

__all__ = ["Connection", "DiscoveryEvent", "DiscoveryEventType", "WorkerMetadata"]


_NO_EXTRA: Mapping[str, Any] = MappingProxyType({})


def _no_extra() -> Mapping[str, Any]:
    # one shared empty mapping: read-only, and its dict is referenced nowhere else
    return _NO_EXTRA


@dataclass(frozen=True, slots=True)
class WorkerMetadata(KeyedRecord):
    """One worker's record, as discovery announces it.

    Identity is ``uid``: two records with the same uid describe the same worker, whatever else
    differs, and the pool never compares or hashes records (only uids).

    ``published`` is the wall-clock time (``time.time()`` of the publishing host) at which this
    version of the record was published, when the record carries one (``None`` otherwise: a
    record from an older publisher, or one no publisher wrote). It takes no part in comparing
    records: the same record published again is equal to the one before.

    A record can be pickled and deep-copied (its ``extra`` travels as a plain dict and comes
    back read-only).

    Implementation notes:
        Its base, the core's ``KeyedRecord``, keeps the uid and its 128-bit integer when the
        record is made, so the pool admits, refreshes and evicts it without reading
        ``metadata.uid`` or ``uid.int`` (records of other types are read, as before).
    """

    uid: uuid.UUID
    address: str
    pid: int
    version: str
    tags: frozenset[str] = frozenset()
    extra: Mapping[str, Any] = field(default_factory=_no_extra)
    published: float | None = field(default=None, compare=False)

    def __reduce__(self) -> tuple[Any, ...]:
        # a read-only mapping (what discovery makes ``extra``) cannot be pickled: a dict can
        values = tuple(
            dict(value) if name == "extra" else value
            for name in _FIELDS
            for value in (getattr(self, name),)
        )
        return _remade, (type(self), values)


def _remade(cls: type[WorkerMetadata], values: tuple[Any, ...]) -> WorkerMetadata:
    """A pickled or copied record made again, its ``extra`` read-only as discovery's are."""
    made = dict(zip(_FIELDS, values, strict=True))
    made["extra"] = MappingProxyType(made["extra"])
    return cls(**made)


_FIELDS = tuple(each.name for each in fields(WorkerMetadata))

DiscoveryEventType = Literal["worker-added", "worker-updated", "worker-dropped"]


@dataclass(frozen=True, slots=True)
class DiscoveryEvent:
    """``worker-added`` (a worker announced itself), ``worker-updated`` (its record changed) or
    ``worker-dropped`` (it left), with the worker's current (or, when dropped, last) record."""

    type: DiscoveryEventType
    metadata: WorkerMetadata


class Connection(Protocol):
    """How the proxy reaches one worker.

    ``dispatch(task, timeout=seconds)`` must raise once ``timeout`` seconds have passed (an
    ``RpcError`` with ``reason="deadline"``): the proxy relies on it to bound the call. An
    ``RpcError`` says with ``sent`` whether the task may have reached the worker."""

    async def dispatch(self, task: Any, *, timeout: float | None = None) -> Any: ...
