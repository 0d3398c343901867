"""The wool routines ``bench_faults.py`` calls: the same behaviour as ``fault_handlers.py``'s
handlers (records, the control file), as ``@wool.routine``s in a module of their own, which
wool's worker processes import by name. wool has no ``RetryElsewhere``: a refused call raises
``RuntimeError`` in the caller, as any handler error does there."""

from __future__ import annotations

import asyncio
import os

import wool

from .fault_handlers import BEHAVIOUR, EXITED


@wool.routine
async def echo(task_id: int) -> int:
    """Returns ``task_id``, having recorded that this process ran it."""
    return BEHAVIOUR.run(task_id, RuntimeError)


@wool.routine
async def exit_(task_id: int) -> None:
    """Raises ``SystemExit`` after its first await."""
    BEHAVIOUR.record(task_id, EXITED)
    await asyncio.sleep(0)
    raise SystemExit(f"task {task_id} asked its worker to exit")


@wool.routine
async def whoami() -> int:
    """The pid of the worker process that ran it."""
    return os.getpid()
