"""Driving a balancer the way the proxy does, for the balancer tests, through either protocol.

``start`` begins one call: with ``PROTOCOL[0] == "delegate"`` it is the balancer's own
``delegate`` generator; with ``"select"`` (for a balancer that has ``select``) it is a
``SelectCall``, which drives ``select`` as the proxy's select loop does and answers the same
``anext`` / ``athrow`` / ``asend`` / ``aclose`` as a generator, so one test body checks both.
The ``balancer_protocol`` fixture (conftest.py) sets ``PROTOCOL``.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator, Callable
from types import MappingProxyType
from typing import Any

from shardline.balancers.protocol import select_of

Gen = AsyncGenerator[uuid.UUID, uuid.UUID | None]

PROTOCOLS = ("select", "delegate")
PROTOCOL = ["select"]


class SelectCall:
    """One call driven through ``select``, looking like a ``delegate`` generator."""

    def __init__(self, balancer: Any, task: Any, context: Any) -> None:
        self.select = select_of(balancer)
        self.task, self.context = task, context
        self.outcomes: dict[uuid.UUID, Exception | None] = {}
        self.offered: uuid.UUID | None = None

    def _next(self) -> uuid.UUID:
        assert self.select is not None
        uid = self.select(self.task, context=self.context, tried=MappingProxyType(self.outcomes))
        if uid is None:
            raise StopAsyncIteration
        assert uid not in self.outcomes, f"{uid} offered twice in one call"
        self.offered = uid
        return uid

    def __aiter__(self) -> SelectCall:
        return self

    async def __anext__(self) -> uuid.UUID:
        if self.offered is not None:  # the proxy found it gone: skipped
            self.outcomes[self.offered] = None
        return self._next()

    async def athrow(self, error: BaseException) -> uuid.UUID:
        assert self.offered is not None
        assert isinstance(error, Exception)
        self.outcomes[self.offered], self.offered = error, None
        return self._next()

    async def asend(self, served: uuid.UUID | None) -> uuid.UUID:
        raise StopAsyncIteration

    async def aclose(self) -> None:
        pass


def start(balancer: Any, task: Any, context: Any) -> Any:
    """One call of ``balancer`` for ``task``, through the protocol under test."""
    if PROTOCOL[0] == "select" and select_of(balancer) is not None:
        return SelectCall(balancer, task, context)
    return balancer.delegate(task, context=context)


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


async def all_failing(
    balancer: Any,
    context: Any,
    task: Any = None,
    *,
    after_first: Callable[[], object] | None = None,
) -> list[uuid.UUID]:
    """Drives one call to exhaustion with every dispatch failing: the candidates offered.
    ``after_first`` is called once the first candidate is offered (a pool change mid-call)."""
    gen = start(balancer, task, context)
    offered: list[uuid.UUID] = []
    candidate = await first(gen)
    if after_first is not None:
        after_first()
    while candidate is not None:
        offered.append(candidate)
        assert len(offered) <= 100, "the call did not end"
        candidate = await fail(gen)
    return offered


async def served_by(balancer: Any, context: Any, task: Any = None) -> uuid.UUID | None:
    gen = start(balancer, task, context)
    candidate = await first(gen)
    if candidate is not None:
        assert await succeed(gen, candidate)
    return candidate
