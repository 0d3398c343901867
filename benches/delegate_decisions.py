"""A balancer's decisions through ``delegate``, driven as the proxy drives a call that succeeds
at once: the first candidate, then that success, which ends the call."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any


async def first_candidates(balancer: Any, pool: Any, tasks: Iterable[Any]) -> list[uuid.UUID]:
    """The worker ``balancer`` chose for each of ``tasks`` over ``pool``, in order."""
    chosen = []
    for task in tasks:
        gen = balancer.delegate(task, context=pool)
        uid = await anext(gen)
        try:
            await gen.asend(uid)
        except StopAsyncIteration:
            chosen.append(uid)
    return chosen
