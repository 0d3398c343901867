"""`RoundRobinLoadBalancer`: every worker in turn, across calls and across concurrent callers."""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator, Callable, Container, Sequence
from dataclasses import dataclass
from typing import Any

from shardline._core import WorkerPool
from shardline.balancers.per_context import PerContext
from shardline.pool.context import LoadBalancerContextView

__all__ = ["RoundRobinLoadBalancer"]


@dataclass(slots=True, weakref_slot=True)
class _Rotation:
    """One context's place in the rotation, shared by every call on that context: a snapshot of
    the pool's uids, taken at each wrap, and the index of the next candidate in it."""

    order: Sequence[uuid.UUID] = ()
    cursor: int = 0


class RoundRobinLoadBalancer:
    """Offers the context's workers in admission order, resuming where the last call stopped.

    A call ends when the task succeeds, or when the rotation comes back to the worker it started
    with (the *boundary*) once it has offered as many workers as are pooled, so it offers each
    pooled worker once and never one twice. Concurrent calls on the same context share the
    rotation, so they start at different workers; a call whose candidates failed goes on past
    the boundary, skipping the workers it already offered, while concurrent calls took some of
    the others from the rotation. A worker refreshed mid-rotation keeps its place (candidates
    are uids); a worker that has left the pool is skipped; if the boundary itself leaves, the
    next candidate becomes the boundary (a departed uid never recurs), so every call ends.
    Works with any context that has a ``workers`` mapping.

    Implementation notes:
        The rotation snapshots the pool's uids once per wrap and indexes the snapshot, so a
        candidate costs O(1) whatever the pool's size. Rotations are kept per context in a
        ``PerContext``: held weakly, dropped when the balancer is pickled.
    """

    def __init__(self) -> None:
        self._rotations = PerContext(_Rotation)

    async def delegate(
        self, task: Any, *, context: LoadBalancerContextView
    ) -> AsyncGenerator[uuid.UUID, uuid.UUID | None]:
        """Yields candidate uids for ``task``; see :class:`shardline.LoadBalancerLike`."""
        pooled: Container[uuid.UUID]
        snapshot: Callable[[], Sequence[uuid.UUID]]
        if isinstance(context, WorkerPool):  # this project's own pool: no Python-level view
            pooled, snapshot, size = context, context.uids, context.__len__
        else:
            workers = context.workers
            pooled, snapshot, size = workers, lambda: list(workers), workers.__len__
        rotation = self._rotations.of(context)
        boundary: uuid.UUID | None = None
        # the candidates that failed, kept from the first failure on: a success costs nothing
        failed: set[uuid.UUID] | None = None
        while True:
            # inlined, not a method of _Rotation: a Python call would be a third of the cost
            cursor, order = rotation.cursor, rotation.order
            if cursor >= len(order):
                order, cursor = snapshot(), 0
                rotation.order = order
                if not order:
                    return
            uid = order[cursor]
            rotation.cursor = cursor + 1
            # `is not None` first: UUID.__eq__ is Python code, slow even against None
            if boundary is not None and (uid == boundary or (failed is not None and uid in failed)):
                if failed is None or len(failed) >= size():
                    return
                continue  # concurrent calls took workers this call has not offered yet
            if uid not in pooled:
                continue
            if boundary is None or boundary not in pooled:
                boundary = uid
            try:
                served = yield uid
            except Exception:  # the candidate failed: offer the next one
                if failed is None:
                    failed = set()
                failed.add(uid)
                continue
            if served is not None:
                return
