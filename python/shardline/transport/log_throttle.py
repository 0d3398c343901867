"""`LogThrottle`: log lines an attacker can cause by the thousand (one per connection it
opens), at most one of each kind per interval, with a count of those left out."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

__all__ = ["LogThrottle"]


@dataclass(slots=True)
class _Held:
    level: int
    timer: asyncio.TimerHandle
    suppressed: int = 0
    last: tuple[object, ...] = ()


class LogThrottle:
    """Logs through ``logger`` at most one line of each kind (its format string) per
    ``interval`` seconds: the first comes out as it is logged; those that follow it within
    ``interval`` are counted, and at the interval's end one line says how many there were
    and gives the last of them in full. A kind stays throttled while every interval has
    some: an attack that lasts an hour logs one line of each kind per interval.
    :meth:`close` says what is still counted and stops.

    Implementation notes: a timer per kind with lines counted, none otherwise; a kind is
    its format string, so the arguments (a peer address, a reason) may differ within it.
    """

    def __init__(
        self, logger: logging.Logger, loop: asyncio.AbstractEventLoop, interval: float
    ) -> None:
        self._logger = logger
        self._loop = loop
        self._interval = interval
        self._held: dict[str, _Held] = {}

    def log(self, level: int, message: str, *args: object) -> None:
        """Logs ``message % args`` at ``level``, or counts it (see the class)."""
        held = self._held.get(message)
        if held is not None:
            held.suppressed += 1
            held.last = args
            return
        if not self._logger.isEnabledFor(level):
            return
        self._logger.log(level, message, *args)
        timer = self._loop.call_later(self._interval, self._end, message)
        self._held[message] = _Held(level, timer)

    def close(self) -> None:
        """Logs the counts held and stops (lines logged after are logged as they come)."""
        for message, held in list(self._held.items()):
            held.timer.cancel()
            self._say(message, held)
        self._held.clear()

    def _end(self, message: str) -> None:
        held = self._held[message]
        if not held.suppressed:
            del self._held[message]
            return
        self._say(message, held)
        held.suppressed = 0
        held.timer = self._loop.call_later(self._interval, self._end, message)

    def _say(self, message: str, held: _Held) -> None:
        if held.suppressed:
            self._logger.log(
                held.level,
                "... and %d more like it within %g s, the last: " + message,
                held.suppressed,
                self._interval,
                *held.last,
            )
