"""The pool balancers read: `LoadBalancerContext` and its read-only `workers` view."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

from shardline._core import WorkerPool

__all__ = ["LoadBalancerContext", "LoadBalancerContextView", "WorkersView"]


@runtime_checkable
class LoadBalancerContextView(Protocol):
    """What a balancer sees of the pool: the live, read-only ``workers`` mapping."""

    @property
    def workers(self) -> Mapping[uuid.UUID, tuple[Any, Any]]: ...


class WorkersView(Mapping[uuid.UUID, tuple[Any, Any]]):
    """A live, read-only mapping uid → ``(metadata, connection)`` over a pool, in admission order.

    A view captured earlier reflects every later admission, refresh and eviction. It has no
    way to write: item assignment and deletion raise ``TypeError``.
    """

    __slots__ = ("_pool",)

    def __init__(self, pool: WorkerPool) -> None:
        self._pool = pool

    def __getitem__(self, uid: uuid.UUID) -> tuple[Any, Any]:
        metadata, connection = self._pool.entry(uid)
        return metadata, connection

    def __contains__(self, uid: object) -> bool:
        return uid in self._pool

    def __iter__(self) -> Iterator[uuid.UUID]:
        return iter(self._pool.uids())

    def __len__(self) -> int:
        return len(self._pool)

    def __repr__(self) -> str:
        return f"WorkersView({len(self)} workers)"


class LoadBalancerContext(WorkerPool):
    """The uid-keyed pool of workers, with the read-only view balancers are given: a
    :class:`shardline.WorkerPool` with its ``workers`` mapping.

    ``add_worker(metadata, connection)`` admits or replaces (a replace keeps the worker's
    position); ``update_worker(metadata, connection)`` refreshes only a worker already admitted
    and returns whether it was; ``remove_worker(metadata)`` evicts by ``metadata.uid``, a no-op
    when absent. Identity is ``metadata.uid``; writes are last-writer-wins; a displaced
    connection is not closed. ``load(uid)`` is ``(dispatches in flight, latency average in
    seconds)`` as the proxy keeps it, for balancers that weigh it.
    """

    @property
    def workers(self) -> WorkersView:
        """The live, read-only mapping uid → ``(metadata, connection)``."""
        return WorkersView(self)
