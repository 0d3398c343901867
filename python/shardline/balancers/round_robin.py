"""`RoundRobinLoadBalancer`: every worker in turn, across calls and across concurrent callers."""

from __future__ import annotations

import uuid
from collections.abc import Container, Sequence, Sized
from dataclasses import dataclass
from typing import Any, Protocol

from shardline._core import WorkerPool
from shardline.balancers.per_context import PerContext
from shardline.balancers.protocol import SelectLoadBalancer, Tried
from shardline.pool.context import LoadBalancerContextView

__all__ = ["RoundRobinLoadBalancer"]


class _Pooled(Container[uuid.UUID], Sized, Protocol):
    """What the rotation reads of a context: membership and size."""


@dataclass(slots=True, weakref_slot=True)
class _Rotation:
    """One context's place in the rotation, shared by every call on that context: a snapshot of
    the pool's uids, taken at each wrap, and the index of the next candidate in it."""

    order: Sequence[uuid.UUID] = ()
    cursor: int = 0


class RoundRobinLoadBalancer(SelectLoadBalancer):
    """Offers the context's workers in admission order, resuming where the last call stopped.

    Each candidate is the next pooled worker of the rotation that this call has not offered
    yet; a call ends when the task succeeds, or once it has offered every pooled worker, so it
    offers each pooled worker once and never one twice. Concurrent calls on the same context
    share the rotation, so they start at different workers; a call whose candidates failed
    while concurrent calls took others from the rotation goes on around it, skipping the
    workers it already offered. A worker refreshed mid-rotation keeps its place (candidates
    are uids); a worker that has left the pool is skipped; one that joined is offered once the
    rotation wraps. Works with any context that has a ``workers`` mapping.

    Implementation notes:
        The rotation snapshots the pool's uids once per wrap and indexes the snapshot, so a
        candidate costs O(1) whatever the pool's size (after failures, a rotation step that
        meets an offered uid counts how many of the offered are still pooled, O(offered)).
        Rotations are kept per context in a ``PerContext``: held weakly, dropped when the
        balancer is pickled.
    """

    needs_load = False

    def __init__(self) -> None:
        self._rotations = PerContext(_Rotation)

    def select(
        self, task: Any, *, context: LoadBalancerContextView, tried: Tried
    ) -> uuid.UUID | None:
        """The next untried pooled worker of the rotation; see
        :mod:`shardline.balancers.protocol`."""
        # this project's own pool is read directly, with no Python-level view
        pooled: _Pooled = context if isinstance(context, WorkerPool) else context.workers
        rotation = self._rotations.of(context)
        wrapped = False
        while True:
            # inlined, not a method of _Rotation: a Python call would be a third of the cost
            cursor, order = rotation.cursor, rotation.order
            if cursor >= len(order):
                if wrapped:  # a fresh snapshot held nothing to offer
                    return None
                wrapped = True
                order = context.uids() if isinstance(context, WorkerPool) else list(context.workers)
                cursor = 0
                rotation.order = order
                if not order:
                    return None
            uid = order[cursor]
            rotation.cursor = cursor + 1
            if tried and uid in tried:
                if sum(1 for offered in tried if offered in pooled) >= len(pooled):
                    return None  # every pooled worker was offered
                continue  # concurrent calls took workers this call has not offered yet
            if uid in pooled:
                return uid
