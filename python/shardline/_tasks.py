"""Ending a background task from the code that owns it, without losing a cancellation.

Two idioms look right and are not, on Python 3.11: ``asyncio.wait_for`` returns the awaited
result and drops a cancellation delivered as the awaited thing completes (the cancelled task
runs on), and awaiting a cancelled task under ``contextlib.suppress(asyncio.CancelledError)``
also swallows a cancellation of the awaiting task itself (a ``stop()`` whose caller was
cancelled returns normally). Bounded waits use ``asyncio.timeout``; a task is ended with
:func:`cancel_and_wait`.
"""

from __future__ import annotations

import asyncio
from typing import Any


async def cancel_and_wait(task: asyncio.Future[Any]) -> None:
    """Cancels ``task`` and returns once it has ended. A cancellation of the caller propagates
    at once (``task``, already cancelled, ends on its own). If ``task`` ended with an exception
    other than its cancellation, that exception is raised, as awaiting ``task`` would have; a
    result it returned despite the cancellation is dropped.

    Implementation notes:
        ``asyncio.wait`` never raises what the task raised, so the only ``CancelledError``
        that can leave it is the caller's own; the task's outcome is read only after.
    """
    task.cancel()
    await asyncio.wait((task,))
    if not task.cancelled():
        error = task.exception()
        if error is not None:
            raise error
