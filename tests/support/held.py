"""A handler that holds each call until the test releases it: a call in flight for exactly as
long as a test needs, and a way to know that it has begun on the worker, where a sleep would
only make both likely. ``Held`` holds an async call on the worker's loop, ``HeldThread`` a
sync one in the thread the worker runs it in."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

__all__ = ["Held", "HeldThread"]

WAIT = 10.0  # the most a call is waited for to begin


class Held:
    """``handler`` (an async handler, for a worker on the test's event loop) records that a
    call has begun, then waits for :meth:`release` and answers the call's payload."""

    def __init__(self) -> None:
        self._begun = asyncio.Event()
        self._released = asyncio.Event()
        self.calls = 0

    async def handler(self, payload: Any) -> Any:
        self.calls += 1
        self._begun.set()
        await self._released.wait()
        return payload

    async def begun(self, bound: float = WAIT) -> None:
        """Returns once a call has begun; TimeoutError after ``bound`` seconds."""
        await asyncio.wait_for(self._begun.wait(), bound)

    def release(self) -> None:
        """Lets every call held, and every later one, answer."""
        self._released.set()


class HeldThread:
    """``handler`` (a sync handler: the worker runs it in a thread) records that a call has
    begun, then blocks its thread until :meth:`release` (or ``WAIT`` seconds) and answers
    ``"blocking"``."""

    def __init__(self) -> None:
        self._begun = threading.Event()
        self._released = threading.Event()

    def handler(self, payload: Any) -> str:
        self._begun.set()
        self._released.wait(WAIT)
        return "blocking"

    async def begun(self, bound: float = WAIT) -> None:
        """Returns once a call has begun; TimeoutError after ``bound`` seconds."""
        if not await asyncio.to_thread(self._begun.wait, bound):
            raise TimeoutError(f"no call began within {bound} s")

    def release(self) -> None:
        """Lets every call held, and every later one, answer."""
        self._released.set()
