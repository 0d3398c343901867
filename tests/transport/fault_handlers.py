"""Handlers that misbehave, for the worker fault tests, loaded by worker processes as
``fault_handlers:HANDLERS``."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

from shardline.transport import Handler


class Custom(BaseException):
    """A BaseException of a handler's own, neither Exception nor a builtin."""


RAISED: dict[str, type[BaseException]] = {
    "SystemExit": SystemExit,
    "KeyboardInterrupt": KeyboardInterrupt,
    "Custom": Custom,
}


async def whoami(payload: Any) -> int:
    return os.getpid()


async def record(payload: dict[str, Any]) -> str:
    """Appends ``payload["tag"]`` to the file ``payload["file"]`` (before any await: the
    first step of the handler), so a test can tell which calls ran."""
    with open(payload["file"], "a") as file:
        file.write(f"{payload['tag']}\n")
    return str(payload["tag"])


async def raise_async(payload: list[str]) -> None:
    """Raises the BaseException named ``payload[0]``, ``"before"`` or ``"after"`` its first
    await (``payload[1]``)."""
    kind, when = payload
    if when == "after":
        await asyncio.sleep(0.01)  # a real suspension: the await the raise comes after
    raise RAISED[kind](f"{kind} from a handler")


def raise_sync(payload: str) -> None:
    raise RAISED[payload](f"{payload} from a sync handler")


async def slow(payload: float) -> str:
    """Answers after ``payload`` seconds, without blocking the loop."""
    await asyncio.sleep(payload)
    return "slow done"


async def block_loop(payload: float) -> float:
    """Blocks the event loop for ``payload`` seconds: what a careless handler does."""
    time.sleep(payload)
    return payload


def thread_name(payload: Any) -> str:
    return threading.current_thread().name


HANDLERS: dict[str, Handler] = {
    "whoami": whoami,
    "record": record,
    "raise_async": raise_async,
    "raise_sync": raise_sync,
    "slow": slow,
    "block_loop": block_loop,
    "thread_name": thread_name,
}
