"""Driving a balancer's ``delegate`` the way the proxy does, for the balancer tests."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator
from typing import Any

Gen = AsyncGenerator[uuid.UUID, uuid.UUID | None]


class Failed(Exception):
    """A dispatch that failed (what the proxy throws into the generator)."""


async def first(gen: Gen) -> uuid.UUID | None:
    try:
        return await anext(gen)
    except StopAsyncIteration:
        return None


async def fail(gen: Gen) -> uuid.UUID | None:
    """Reports the last candidate failed; returns the next one, or None when the call ends."""
    try:
        return await gen.athrow(Failed())
    except StopAsyncIteration:
        return None


async def succeed(gen: Gen, served: uuid.UUID) -> bool:
    """Reports success; returns whether the generator finished, as the protocol requires."""
    try:
        await gen.asend(served)
    except StopAsyncIteration:
        return True
    return False


async def all_failing(balancer: Any, context: Any, task: Any = None) -> list[uuid.UUID]:
    """Drives one call to exhaustion with every dispatch failing: the candidates offered."""
    gen = balancer.delegate(task, context=context)
    offered: list[uuid.UUID] = []
    candidate = await first(gen)
    while candidate is not None:
        offered.append(candidate)
        assert len(offered) <= 100, "the call did not end"
        candidate = await fail(gen)
    return offered


async def served_by(balancer: Any, context: Any, task: Any = None) -> uuid.UUID | None:
    gen = balancer.delegate(task, context=context)
    candidate = await first(gen)
    if candidate is not None:
        assert await succeed(gen, candidate)
    return candidate


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)
