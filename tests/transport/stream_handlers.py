"""Handlers for the streaming tests, served by the worker processes of ``stream_worker.py``
(over loopback TCP) and of ``LocalPool`` (as ``stream_handlers:HANDLERS``).

The generators keep what they did in this process's module state, by key, and ``progress``
reads it back through a plain dispatch to the same worker: how many items a generator
produced (advanced past), and whether its ``finally`` ran."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

from shardline.transport import Handler

PRODUCED: dict[str, int] = {}
CLOSED: set[str] = set()


async def count(payload: Any) -> AsyncIterator[int]:
    """0, 1, … ``payload - 1``."""
    for n in range(payload):
        yield n


async def tracked(key: str) -> AsyncIterator[int]:
    """0, 1, 2, … for ever, counting in ``PRODUCED[key]`` each item it makes, and marking
    ``key`` closed when it ends."""
    PRODUCED[key] = 0
    try:
        n = 0
        while True:
            PRODUCED[key] = n + 1
            yield n
            n += 1
    finally:
        CLOSED.add(key)


async def stalls(payload: list[Any]) -> AsyncIterator[int]:
    """``payload[1]`` items (0, 1, …), then waits for ever; marks ``payload[0]`` closed when it
    ends."""
    key, items = payload
    try:
        for n in range(items):
            yield n
        await asyncio.Event().wait()
    finally:
        CLOSED.add(key)


async def fails_after(payload: int) -> AsyncIterator[int]:
    """0 … ``payload - 1``, then raises ``ValueError``."""
    for n in range(payload):
        yield n
    raise ValueError(f"failed after {payload} items")


async def recorded(path: str) -> AsyncIterator[int]:
    """Appends its pid to the file ``path`` names (one ``O_APPEND`` write: every run of the
    task leaves a line), yields the pid, then waits for ever."""
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(descriptor, f"{os.getpid()}\n".encode())
    finally:
        os.close(descriptor)
    yield os.getpid()
    await asyncio.Event().wait()


async def first_holds(path: str) -> AsyncIterator[int]:
    """Appends its pid to the file ``path`` names; the first run of the task (the file's first
    line) then waits for ever before its first item, any later one yields its pid."""
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(descriptor, f"{os.getpid()}\n".encode())
    finally:
        os.close(descriptor)
    with open(path) as runs:
        first = len(runs.read().split()) == 1
    if first:
        await asyncio.Event().wait()
    yield os.getpid()


async def progress(key: str) -> list[Any]:
    """``[items produced, closed]`` of the generator run under ``key`` in this process (None
    for the items of one that never started)."""
    return [PRODUCED.get(key), key in CLOSED]


async def echo(payload: Any) -> Any:
    return payload


HANDLERS: dict[str, Handler] = {
    "count": count,
    "tracked": tracked,
    "stalls": stalls,
    "fails_after": fails_after,
    "recorded": recorded,
    "first_holds": first_holds,
    "progress": progress,
    "echo": echo,
}
