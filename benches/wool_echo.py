"""The wool routines ``bench_calls.py`` calls: a module of their own, because wool's worker
processes import a routine's module by name to run it (this one imports nothing else)."""

from __future__ import annotations

import os
from typing import Any

import wool


@wool.routine
async def echo(payload: Any) -> Any:
    """Returns the payload."""
    return payload


@wool.routine
async def whoami() -> int:
    """The pid of the worker process that ran it."""
    return os.getpid()
