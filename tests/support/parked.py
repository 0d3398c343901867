"""Waiting until a waiter is parked: suspended inside a named coroutine function, on a future.

A test that starts a waiter (a ``refresh()``, an ``anext()`` of a subscription) and must act
only once it waits, so that the act is what wakes it, waits for exactly that here; a sleep
would only make it likely."""

from __future__ import annotations

import asyncio
import gc
import inspect
from typing import Any

__all__ = ["await_chain", "parked"]

WAIT = 10.0  # the most a waiter is waited for


def await_chain(awaitable: Any) -> tuple[list[str], Any]:
    """The names of the coroutine (and async generator) functions ``awaitable`` is suspended
    in, outermost first, and what the innermost one awaits (``None`` if it awaits nothing).
    The chain ends at an awaitable that is neither, a future's iterator most often.

    Implementation notes:
        The ``anext()`` of an async generator (``async for`` inside another one) shows
        neither frame nor awaitable; the generator it steps is found among what it refers to
        (``gc.get_referents``), and the chain goes on there."""
    names: list[str] = []
    current = awaitable
    while True:
        if type(current).__name__ == "async_generator_asend":
            current = next((r for r in gc.get_referents(current) if inspect.isasyncgen(r)), current)
        frame = getattr(current, "cr_frame", None) or getattr(current, "ag_frame", None)
        if frame is None:
            return names, current
        names.append(frame.f_code.co_name)
        current = getattr(current, "cr_await", None) or getattr(current, "ag_await", None)
        if current is None:
            return names, None


def _waits(awaited: Any) -> bool:
    """Whether the innermost frame waits on something (a future, or an awaitable compiled
    without frames, as grpc's are) rather than passing a turn of the loop (``sleep(0)``'s
    bare yield) or running."""
    return awaited is not None and not inspect.isgenerator(awaited)


async def parked(waiter: Any, function: str, *, bound: float = WAIT) -> None:
    """Returns once ``waiter`` (a task, a coroutine or an async generator) is suspended inside
    ``function``, waiting on a future (or a compiled awaitable); AssertionError if it is not
    within ``bound`` seconds."""
    coroutine = waiter.get_coro() if isinstance(waiter, asyncio.Task) else waiter
    loop = asyncio.get_running_loop()
    deadline = loop.time() + bound
    while True:
        names, awaited = await_chain(coroutine)
        if function in names and _waits(awaited):
            return
        assert loop.time() < deadline, f"not parked in {function} after {bound} s: {names}"
        await asyncio.sleep(0.001)
