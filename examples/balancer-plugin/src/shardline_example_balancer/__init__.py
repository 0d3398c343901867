"""An example shardline balancer plugin: ``ShuffleLoadBalancer``, registered as
``example-shuffle`` in the ``shardline.balancers`` entry-point group."""

from __future__ import annotations

import random
import uuid
from collections.abc import AsyncGenerator
from typing import Any

from shardline import LoadBalancerContextView

__all__ = ["ShuffleLoadBalancer"]


class ShuffleLoadBalancer:
    """Offers the workers pooled when a call starts in a random order, a new one per call.

    A call ends when the task succeeds or once each of those workers was offered (once at
    most); a worker that left since the call started is skipped, and one that joined is not
    offered in that call. ``rng`` makes the order reproducible.
    """

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    async def delegate(
        self, task: Any, *, context: LoadBalancerContextView
    ) -> AsyncGenerator[uuid.UUID, uuid.UUID | None]:
        """Yields candidate uids for ``task``; see :class:`shardline.LoadBalancerLike`."""
        workers = context.workers
        order = list(workers)
        self._rng.shuffle(order)
        for uid in order:
            if uid not in workers:  # it left since the call started
                continue
            try:
                served = yield uid
            except Exception:  # the candidate failed: offer the next one
                continue
            if served is not None:
                return
