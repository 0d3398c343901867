"""A handler that holds each call until the test releases it: a call in flight for exactly as
long as a test needs, and a way to know that it has begun on the worker, where a sleep would
only make both likely."""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["Held"]

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
