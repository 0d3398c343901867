"""`RoundRobinLoadBalancer`: every worker in turn, across calls and across concurrent callers."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shardline._core import PoolRotationSelect
from shardline.balancers.explanation import (
    NO_WORKERS,
    Candidate,
    CandidateOrder,
    ordinal,
    pooled_record,
)
from shardline.balancers.per_context import PerContext
from shardline.balancers.protocol import NOTHING_TRIED, SelectLoadBalancer, Tried
from shardline.pool.context import LoadBalancerContextView

__all__ = ["RoundRobinLoadBalancer"]


@dataclass(slots=True, weakref_slot=True)
class _Rotation:
    """One context's place in the rotation, shared by every call on that context: a snapshot of
    the pool's uids, taken at each wrap, and the index of the next candidate in it."""

    order: Sequence[uuid.UUID] = ()
    cursor: int = 0


class RoundRobinLoadBalancer(PoolRotationSelect, SelectLoadBalancer):
    """Offers the context's workers in admission order, resuming where the last call stopped.

    Each candidate is the next pooled worker of the rotation that this call has not offered
    yet; a call ends when the task succeeds, or once it has offered every pooled worker, so it
    offers each pooled worker once and never one twice. Concurrent calls on the same context
    share the rotation, so they start at different workers; a call whose candidates failed
    while concurrent calls took others from the rotation goes on around it, skipping the
    workers it already offered. A worker refreshed mid-rotation keeps its place (candidates
    are uids); a worker that has left the pool is skipped. Works with any context that has a
    ``workers`` mapping.

    On this project's pool (a :class:`~shardline.WorkerPool`, such as
    :class:`~shardline.LoadBalancerContext`) the rotation is the pool's own: one cursor per
    pool, shared by every balancer and every call on it, so a new worker takes its turn when
    the cursor reaches it, and a copy of the balancer (pickled, say) continues the same
    rotation. It declares ``pool_rotation``, so :class:`~shardline.WorkerProxy` takes a call's
    first candidate straight from the pool (``WorkerPool.dispatch_next``) without calling
    :meth:`select`; see :mod:`shardline.balancers.protocol`. On any other context the balancer
    keeps a rotation per context, and a joined worker is offered once it wraps.

    Implementation notes:
        :meth:`select` is the Rust base's (``PoolRotationSelect``): on a ``WorkerPool`` it is
        one call into Rust, ``next_in_rotation(tried)`` over a cursor in the pool's admission
        order, O(1) per candidate plus the slots it skips, with no Python frame; on any other
        context it calls :meth:`_select_elsewhere`. That one uses a context's own
        ``next_in_rotation`` if it has one, else snapshots the context's uids once per wrap
        and indexes the snapshot (after failures, a step that meets an offered uid counts how
        many of the offered are still pooled, O(offered)); those rotations are kept in a
        ``PerContext``: held weakly, dropped when the balancer is pickled.
    """

    needs_load = False

    def __init__(self) -> None:
        self._rotations = PerContext(_Rotation)

    def _select_elsewhere(
        self, task: Any, context: LoadBalancerContextView, tried: Tried
    ) -> uuid.UUID | None:
        """:meth:`select` on a context that is not a ``WorkerPool``."""
        try:
            # a method call, not getattr with a default: no bound method is made (~40 ns)
            return context.next_in_rotation(tried)  # type: ignore[attr-defined,no-any-return]
        except AttributeError:
            if hasattr(context, "next_in_rotation"):
                raise  # raised inside the context's rotation: not a context without one
        pooled = context.workers
        rotation = self._rotations.of(context)
        wrapped = False
        while True:
            # inlined, not a method of _Rotation: a Python call would be a third of the cost
            cursor, order = rotation.cursor, rotation.order
            if cursor >= len(order):
                if wrapped:  # a fresh snapshot held nothing to offer
                    return None
                wrapped = True
                order = list(pooled)
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

    def explain_candidates(self, task: Any, *, context: LoadBalancerContextView) -> CandidateOrder:
        """The pooled workers in the order the rotation would offer them now, the rotation left
        where it stands (see :mod:`shardline.balancers.explanation`).

        Implementation notes:
            On the pool, its ``rotation_order()``; on another context, this balancer's own
            rotation is replayed by a fresh balancer holding a copy of it.
        """
        rotation_order = getattr(context, "rotation_order", None)
        if rotation_order is not None:
            order: list[uuid.UUID] = rotation_order()
            where = "the pool's rotation"
        else:
            replay = RoundRobinLoadBalancer()
            mine = self._rotations.peek(context)
            if mine is not None:
                copied = replay._rotations.of(context)
                copied.order, copied.cursor = mine.order, mine.cursor
            order = []
            offered: dict[uuid.UUID, Exception | None] = {}
            while uid := replay.select(task, context=context, tried=offered or NOTHING_TRIED):
                order.append(uid)
                offered[uid] = None
            where = "this balancer's rotation"
        candidates = tuple(
            Candidate(
                uid,
                f"next in {where}" if n == 1 else f"{ordinal(n)} in {where}",
                pooled_record(context, uid),
            )
            for n, uid in enumerate(order, 1)
        )
        return CandidateOrder(candidates, why_none=None if candidates else NO_WORKERS)
