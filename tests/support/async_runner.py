"""How the suite runs an ``async def`` test (the ``pytest_pyfunc_call`` hook of conftest.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any


def run_async_test(
    test: Callable[..., Coroutine[Any, Any, Any]],
    arguments: dict[str, Any],
    seconds: float | None,
) -> None:
    """Runs ``test(**arguments)`` on a fresh event loop, closed afterwards; raises
    ``TimeoutError`` once it has run ``seconds`` (None: no bound).

    Implementation notes: ``asyncio.timeout`` bounds the test in its own task, so the test
    sees the loop as ``asyncio.run`` would give it, with no task in between."""

    async def bounded() -> None:
        async with asyncio.timeout(seconds):
            await test(**arguments)

    asyncio.run(bounded())
