"""The wool routine ``bench_streaming.py`` streams from: a module of its own, because wool's
worker processes import a routine's module by name (this one imports nothing else)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import wool


@wool.routine
async def lines(n: int) -> AsyncIterator[str]:
    """``n`` distinct 40-character str, as ``stream_worker.lines`` yields them."""
    for k in range(n):
        yield f"item {k:010d} ".ljust(40, ".")
