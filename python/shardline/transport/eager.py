"""`start_eagerly`: run a coroutine up to its first wait now, and as a task only if it waits."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine, Generator
from typing import Any

__all__ = ["Rest", "start_eagerly"]


def start_eagerly(
    loop: asyncio.AbstractEventLoop, coroutine: Coroutine[Any, Any, None]
) -> asyncio.Task[None] | None:
    """Runs ``coroutine`` now, up to its first wait, in a copy of the current context (as a
    task would). Returns None if it finished without waiting; otherwise a task on ``loop``,
    in that same context, that carries it on from where it waits: cancelling the task
    cancels the coroutine there, as for any task.

    An exception other than cancellation that the first step raises propagates to the
    caller, as it would have ended the task.

    Implementation notes:
        What Python 3.12's eager tasks do, for 3.11 and for uvloop, which has none: a
        handler that answers at once (most of them) then costs no task, no turn of the loop
        and no done callback. The task drives the rest of the coroutine with
        ``send``/``throw`` (:class:`Rest`), handing the loop each future the coroutine
        waits on, exactly as the coroutine would have handed it to its own task.
    """
    context = contextvars.copy_context()
    try:
        waiting_on = context.run(coroutine.send, None)
    except StopIteration:
        return None
    return loop.create_task(_carry_on(Rest(coroutine, waiting_on)), context=context)


async def _carry_on(rest: Rest) -> None:
    await rest


class Rest:
    """The rest of a coroutine that already ran up to ``waiting_on`` (what its ``send``
    returned), as an awaitable: awaiting it, in a task, carries the coroutine on from there
    and returns what the coroutine returns."""

    __slots__ = ("_coroutine", "_waiting_on")

    def __init__(self, coroutine: Coroutine[Any, Any, Any], waiting_on: Any) -> None:
        self._coroutine = coroutine
        self._waiting_on = waiting_on

    def __await__(self) -> Generator[Any, Any, Any]:
        coroutine, waiting_on = self._coroutine, self._waiting_on
        while True:
            try:
                sent = yield waiting_on
            except BaseException as error:  # thrown in by the task: cancellation, above all
                try:
                    waiting_on = coroutine.throw(error)
                except StopIteration as done:
                    return done.value
            else:
                try:
                    waiting_on = coroutine.send(sent)
                except StopIteration as done:
                    return done.value
