"""Handlers for the sick-worker tests, loaded by LocalPool's worker processes as
``sick_worker_handlers:HANDLERS``."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from shardline.transport import Handler


async def record(payload: Any) -> int:
    """Appends ``"<task id> <pid>"`` to the file ``payload[1]`` names (one small ``O_APPEND``
    write, so lines of concurrent workers never mix) and returns the pid: every run of a task
    leaves a line."""
    task_id, path = payload
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(descriptor, f"{task_id} {os.getpid()}\n".encode())
    finally:
        os.close(descriptor)
    return os.getpid()


async def whoami(payload: Any) -> int:
    return os.getpid()


async def paced(payload: Any) -> int:
    """Waits ``payload[1]`` seconds, 10 times as long in the process ``payload[0]`` (a gray
    worker: alive, answering, 10x slower), and returns the pid."""
    slow, seconds = payload
    await asyncio.sleep(seconds * (10 if os.getpid() == slow else 1))
    return os.getpid()


HANDLERS: dict[str, Handler] = {"paced": paced, "record": record, "whoami": whoami}
