"""Handlers for the LocalPool tests, loaded by the worker processes as
``local_pool_handlers:HANDLERS``. ``local_pool_handlers:NEVER_READY`` is a spec whose loading
never finishes, so a worker given it never joins."""

from __future__ import annotations

import os
import threading
from typing import Any

from shardline.transport import Handler


async def echo(payload: Any) -> Any:
    return payload


async def whoami(payload: Any) -> int:
    """The pid of the process that served."""
    return os.getpid()


async def blob(size: int) -> str:
    """A result of ``size`` characters, from a small request."""
    return "x" * size


def block(payload: Any) -> None:
    """Never returns: a thread stuck in it keeps the process from exiting on SIGTERM."""
    threading.Event().wait()


HANDLERS: dict[str, Handler] = {"echo": echo, "whoami": whoami, "blob": blob, "block": block}


def __getattr__(name: str) -> Any:
    if name == "NEVER_READY":
        threading.Event().wait()  # until the process is stopped
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
