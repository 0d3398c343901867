"""`Clock`: the time a keeper reads and sleeps on, injectable so tests control it exactly."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "MonotonicClock"]


@runtime_checkable
class Clock(Protocol):
    """``now()`` is the current time in seconds (any origin, never going back);
    ``sleep(seconds)`` returns once ``now()`` has moved on by at least ``seconds``."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class MonotonicClock:
    """Real time: ``time.monotonic()`` and ``asyncio.sleep``."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
