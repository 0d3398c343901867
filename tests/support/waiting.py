"""Waiting, bounded, for a state a test does not control the timing of (a background task,
another process): the state itself is checked every few milliseconds, so no sleep stands in
for the event, and a state that never comes fails the test naming what was awaited."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable

__all__ = ["until"]

BOUND = 30.0  # seconds: generous, since only a failing test ever waits this long


async def until(
    condition: Callable[[], object], what: str = "the condition", *, seconds: float = BOUND
) -> None:
    """Returns once ``condition()`` is true (its result awaited first when it is awaitable: a
    state read through a call); AssertionError naming ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds} s waiting for {what}")
        await asyncio.sleep(0.005)
