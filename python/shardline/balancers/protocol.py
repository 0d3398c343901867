"""`LoadBalancerLike`: the contract between a balancer and the proxy that drives it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator
from typing import Any, Protocol, runtime_checkable

from shardline.pool.context import LoadBalancerContextView

__all__ = ["LoadBalancerLike"]


@runtime_checkable
class LoadBalancerLike(Protocol):
    """Orders the candidate workers for one task; the proxy does everything else.

    ``delegate`` returns an async generator of worker uids. The proxy drives it:

    - ``anext``: the next candidate to try;
    - ``athrow(exc)``: the last candidate failed (on a non-transient failure the proxy has
      already evicted it from the pool); the generator offers another candidate or finishes;
    - ``asend(uid)``: the last candidate served the task; the generator must finish — yielding
      again is a protocol violation the proxy reports as ``RuntimeError``.

    A balancer names workers by uid only. The proxy resolves each uid against the live pool
    when it dispatches, so a balancer can never send work to a superseded address, and a uid
    that has left the pool is skipped with nothing reported back.
    """

    def delegate(
        self, task: Any, *, context: LoadBalancerContextView
    ) -> AsyncGenerator[uuid.UUID, uuid.UUID | None]: ...
