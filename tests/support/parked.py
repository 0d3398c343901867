"""Waiting until a waiter is parked: suspended on a future inside a named coroutine function.

A test that starts a waiter (a ``refresh()``, an ``anext()`` of a subscription) and must act
only once it waits, so that the act is what wakes it, waits for exactly that here; a sleep
would only make it likely."""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["await_chain", "parked"]

WAIT = 10.0  # the most a waiter is waited for


def await_chain(awaitable: Any) -> tuple[list[str], Any]:
    """The names of the coroutine (and async generator) functions ``awaitable`` is suspended
    in, outermost first, and what the innermost one awaits (``None`` if it awaits nothing).
    The chain ends at an awaitable that is neither: a future's iterator, or the ``anext()``
    of a nested async generator (whose frames it does not show)."""
    names: list[str] = []
    current = awaitable
    while True:
        frame = getattr(current, "cr_frame", None) or getattr(current, "ag_frame", None)
        if frame is None:
            return names, current
        names.append(frame.f_code.co_name)
        current = getattr(current, "cr_await", None) or getattr(current, "ag_await", None)
        if current is None:
            return names, None


def _on_a_future(awaited: Any) -> bool:
    return isinstance(awaited, asyncio.Future) or type(awaited).__name__ == "FutureIter"


async def parked(waiter: Any, function: str, *, bound: float = WAIT) -> None:
    """Returns once ``waiter`` (a task, a coroutine or an async generator) is suspended on a
    future inside ``function``; AssertionError if it is not within ``bound`` seconds."""
    coroutine = waiter.get_coro() if isinstance(waiter, asyncio.Task) else waiter
    loop = asyncio.get_running_loop()
    deadline = loop.time() + bound
    while True:
        names, awaited = await_chain(coroutine)
        if function in names and _on_a_future(awaited):
            return
        assert loop.time() < deadline, f"not parked in {function} after {bound} s: {names}"
        await asyncio.sleep(0.001)
