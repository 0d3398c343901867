"""`LeastLoadedLoadBalancer`: the less loaded of two workers drawn at random."""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from typing import Any

from shardline.balancers.protocol import SelectLoadBalancer, Tried
from shardline.pool.context import LoadBalancerContextView

__all__ = ["LeastLoadedLoadBalancer"]


class LeastLoadedLoadBalancer(SelectLoadBalancer):
    """Offers, of two pooled workers drawn at random, the one with fewer dispatches in flight
    (ties: the lower latency average), then does the same among the workers left.

    Load comes from the context's ``load(uid)`` (the pool's, which the proxy keeps); a context
    without one is treated as all idle, which makes this a random choice. A call offers each
    pooled worker at most once and ends once it has offered them all (a worker that joins
    mid-call may be among the draws). ``rng`` makes the draws reproducible. It declares
    ``needs_load``, so the proxy counts and times every dispatch for it.

    Implementation notes:
        "Power of two choices": comparing two random candidates keeps the most loaded workers
        away from new work almost as well as scanning them all, without every caller piling
        onto the single least loaded one between two load updates. Each candidate reads the
        pool afresh, O(n) in its size.
    """

    needs_load = True

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._rng = random.Random()

    def select(
        self, task: Any, *, context: LoadBalancerContextView, tried: Tried
    ) -> uuid.UUID | None:
        """The less loaded of two untried pooled workers drawn at random; see
        :mod:`shardline.balancers.protocol`."""
        load: Callable[[uuid.UUID], tuple[int, float]] = getattr(context, "load", _idle)
        left = list(context.workers)
        if tried:
            left = [uid for uid in left if uid not in tried]
        if len(left) <= 1:
            return left[0] if left else None
        a, b = self._rng.sample(range(len(left)), 2)
        return left[a] if load(left[a]) <= load(left[b]) else left[b]


def _idle(uid: uuid.UUID) -> tuple[int, float]:
    return 0, 0.0
