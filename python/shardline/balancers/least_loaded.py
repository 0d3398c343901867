"""`LeastLoadedLoadBalancer`: the less loaded of two workers drawn at random."""

from __future__ import annotations

import random
import uuid
from collections.abc import AsyncGenerator
from typing import Any

from shardline._core import WorkerPool
from shardline.pool.context import LoadBalancerContextView

__all__ = ["LeastLoadedLoadBalancer"]


class LeastLoadedLoadBalancer:
    """Offers, of two pooled workers drawn at random, the one with fewer dispatches in flight
    (ties: the lower latency average), then does the same among the workers left.

    Load comes from the pool (``context.load(uid)``, which the proxy keeps); any other context
    is treated as all idle, which makes this a random choice. One call
    offers each pooled worker at most once. ``rng`` makes the draws reproducible.

    Implementation notes:
        "Power of two choices": comparing two random candidates keeps the most loaded workers
        away from new work almost as well as scanning them all, without every caller piling
        onto the single least loaded one between two load updates.
    """

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._rng = random.Random()

    async def delegate(
        self, task: Any, *, context: LoadBalancerContextView
    ) -> AsyncGenerator[uuid.UUID, uuid.UUID | None]:
        """Yields candidate uids for ``task``; see :class:`shardline.LoadBalancerLike`."""
        load = context.load if isinstance(context, WorkerPool) else _idle
        left = list(context.workers)
        while left:
            if len(left) == 1:
                pick = 0
            else:
                a, b = self._rng.sample(range(len(left)), 2)
                pick = a if load(left[a]) <= load(left[b]) else b
            uid = left.pop(pick)
            if uid not in context.workers:
                continue
            try:
                served = yield uid
            except Exception:  # the candidate failed: offer another
                continue
            if served is not None:
                return


def _idle(uid: uuid.UUID) -> tuple[int, float]:
    return 0, 0.0
