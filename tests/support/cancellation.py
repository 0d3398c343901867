"""Cancelling what stops a background task, step by step of the event loop: whether a stop()
whose caller is cancelled ends cancelled, and whether a task cancelled around a wake-up stops
there (``docs/architecture.md``: a loop must also be stoppable)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

# turns of the loop within which what these tests start ends, once nothing waits on I/O
STEPS = 50


async def steps(n: int) -> None:
    """Lets the loop run ``n`` turns."""
    for _ in range(n):
        await asyncio.sleep(0)


def others() -> set[asyncio.Task[Any]]:
    """The tasks still running besides the test's own."""
    return {task for task in asyncio.all_tasks() if task is not asyncio.current_task()}


async def settled(bound: int = STEPS) -> set[asyncio.Task[Any]]:
    """Lets the loop run until no task but the test's is left, at most ``bound`` turns; the
    tasks left then."""
    for _ in range(bound):
        if not others():
            break
        await asyncio.sleep(0)
    return others()


async def stop_cancelled(stop: Callable[[], Awaitable[None]]) -> asyncio.Task[None]:
    """Runs ``stop()`` in a task, lets it run one turn (it cancels the background task and
    waits for it), cancels it there, and returns it once it has ended."""

    async def stopping() -> None:
        await stop()

    stopper = asyncio.create_task(stopping())
    await asyncio.sleep(0)
    assert not stopper.done(), "stop() ended without waiting for its background task"
    stopper.cancel()
    await asyncio.wait([stopper])
    return stopper


async def stops_when_cancelled(
    task: asyncio.Task[Any], turns: int, bound: int | None = STEPS
) -> bool:
    """Lets the loop run ``turns`` turns, then, unless ``task`` has ended by itself, cancels
    it and lets it run at most ``bound`` more turns (None: until it ends, for a task that
    waits on I/O as it stops); whether it then ended cancelled (True too if it had ended
    before it was cancelled)."""
    await steps(turns)
    if task.done():
        return True
    task.cancel()
    if bound is None:
        await asyncio.wait([task])
    for _ in range(bound or 0):
        if task.done():
            break
        await asyncio.sleep(0)
    return task.cancelled()
