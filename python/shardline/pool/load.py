"""`WorkerLoad`: the in-flight dispatches and recent latency of each worker, kept by the proxy."""

from __future__ import annotations

import uuid

__all__ = ["WorkerLoad"]


class WorkerLoad:
    """Per-worker load as the proxy sees it: dispatches in flight, and a latency average.

    The proxy calls :meth:`started` before each dispatch and :meth:`finished` after it, however
    it ends; balancers read :meth:`of`. A worker never dispatched to reads as idle with no
    latency known (0.0).

    Implementation notes:
        The latency is an exponentially weighted moving average with weight ``alpha`` for each
        new sample, so it follows a worker that slows down within a few dispatches.
    """

    __slots__ = ("_alpha", "_inflight", "_latency")

    def __init__(self, alpha: float = 0.2) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self._alpha = alpha
        self._inflight: dict[uuid.UUID, int] = {}
        self._latency: dict[uuid.UUID, float] = {}

    def started(self, uid: uuid.UUID) -> None:
        self._inflight[uid] = self._inflight.get(uid, 0) + 1

    def finished(self, uid: uuid.UUID, seconds: float) -> None:
        remaining = self._inflight.get(uid, 0) - 1
        if remaining > 0:
            self._inflight[uid] = remaining
        else:
            self._inflight.pop(uid, None)
        previous = self._latency.get(uid)
        self._latency[uid] = (
            seconds if previous is None else previous + self._alpha * (seconds - previous)
        )

    def of(self, uid: uuid.UUID) -> tuple[int, float]:
        """``(dispatches in flight, latency average in seconds)`` of the worker ``uid``."""
        return self._inflight.get(uid, 0), self._latency.get(uid, 0.0)
