"""``shardline worker`` processes the tests start (``python -m shardline worker ARGUMENTS``), read
the record each prints once it serves, and kill on the way out."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from shardline import WorkerMetadata
from shardline.discovery import Discovery
from shardline.discovery.record import decode_record

READY = 15.0


class WorkerProcess:
    def __init__(self, process: asyncio.subprocess.Process, stderr: Path) -> None:
        self.process = process
        self.stderr = stderr

    async def ready(self) -> WorkerMetadata:
        """The record the worker prints once it serves and is published."""
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), READY)
        assert line, f"the worker exited before it was ready: {self.stderr.read_text()}"
        return decode_record(line.rstrip(b"\n"))

    async def exit_status(self) -> int:
        return await asyncio.wait_for(self.process.wait(), READY)


SHARDLINE_MODULE = (sys.executable, "-m", "shardline")


@asynccontextmanager
async def worker_process(
    directory: Path,
    *arguments: str,
    command: Sequence[str] = SHARDLINE_MODULE,
    cwd: Path | None = None,
    environment: Mapping[str, str] | None = None,
) -> AsyncIterator[WorkerProcess]:
    """``COMMAND worker ARGUMENTS`` (by default ``python -m shardline``) run from ``cwd``, in
    ``environment`` (by default this process's), with its LocalDiscovery under ``directory``;
    killed on the way out if it is still running."""
    stderr = directory / f"worker-{uuid.uuid4().hex[:8]}.err"
    environment = {**(os.environ if environment is None else environment)}
    environment["XDG_RUNTIME_DIR"] = str(directory)
    with stderr.open("wb") as errors:
        process = await asyncio.create_subprocess_exec(
            *command,
            "worker",
            *arguments,
            cwd=cwd,
            stdout=asyncio.subprocess.PIPE,
            stderr=errors,
            env={
                **(os.environ if environment is None else environment),
                "XDG_RUNTIME_DIR": str(directory),
            },
        )
    try:
        yield WorkerProcess(process, stderr)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


# A backend: the worker's extra arguments, and how the test opens a handle on a namespace.
Backend = tuple[tuple[str, ...], Callable[[str], Discovery]]
