"""The demo handlers `shardline worker` serves, in :data:`DEMO_HANDLERS`: ``echo``, ``sleep``,
``whoami``, ``fail-transiently`` and ``fail``."""

from __future__ import annotations

import asyncio
import math
import os
import socket
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from shardline.transport.serving import Handler, RetryElsewhere

__all__ = ["DEMO_HANDLERS"]


async def echo(payload: Any) -> Any:
    """Returns the payload."""
    return payload


async def sleep(payload: Any) -> float:
    """Sleeps for ``payload`` seconds (a non-negative number), then returns it."""
    if (
        not isinstance(payload, int | float)
        or isinstance(payload, bool)
        or not math.isfinite(payload)
        or payload < 0
    ):
        raise ValueError(f"sleep takes a non-negative number of seconds, got {payload!r}")
    await asyncio.sleep(payload)
    return payload


async def whoami(payload: Any) -> dict[str, Any]:
    """Says which process served: ``{"pid": <process id>, "host": <host name>}``."""
    return {"pid": os.getpid(), "host": socket.gethostname()}


async def fail_transiently(payload: Any) -> None:
    """Ends the call with ``UNAVAILABLE``, or ``RESOURCE_EXHAUSTED`` when the payload is
    ``"resource-exhausted"``: the caller gets ``TransientRpcError`` and the worker stays."""
    raise RetryElsewhere("asked to fail transiently", overloaded=payload == "resource-exhausted")


async def fail(payload: Any) -> None:
    """Raises ``RuntimeError``: the caller gets ``WorkerError`` and the worker stays."""
    raise RuntimeError(f"asked to fail (payload {payload!r})")


DEMO_HANDLERS: Mapping[str, Handler] = MappingProxyType(
    {
        "echo": echo,
        "sleep": sleep,
        "whoami": whoami,
        "fail-transiently": fail_transiently,
        "fail": fail,
    }
)
"""The demo handlers by name, read-only."""
