"""The handlers ``bench_faults.py`` serves (``HANDLERS``, for ``LocalPool`` and the worker
processes it starts itself), and the behaviour its wool routines share (``wool_faults.py``).

Every worker process records each task it runs, so the benchmark can count the tasks that ran
twice: ``echo(task_id)`` appends one record ``(task id, CLOCK_MONOTONIC ns, outcome)`` with
one ``os.write`` to ``$SHARDLINE_BENCH_FAULTS/runs-<pid>`` (a write survives a SIGKILL that
comes after it; the clock is the machine's, comparable across processes). ``outcome`` is
``RAN`` or ``REFUSED`` (the call raised ``RetryElsewhere``: the task did not run).

What a worker does wrong is decided by ``$SHARDLINE_BENCH_FAULTS/control``, a JSON object the
benchmark writes while the workers run and each worker re-reads at most every
``CONTROL_PERIOD`` seconds: ``{"pid": P, "mode": M, "delay": D}`` makes worker ``P``:

- ``"slow"``: block its event loop ``D`` seconds in every call (a gray worker: alive, answers,
  10x slower; a sleep, not a busy loop, so it takes no CPU from the other workers);
- ``"fail-half"``: refuse every other call with ``RetryElsewhere`` (the transport-level
  failure the proxy counts for health: msgpack's ``shutting_down`` error, a
  ``TransientRpcError`` the proxy sends to the next worker, the task not run).

``exit(task_id)`` raises ``SystemExit`` after its first await, as a handler that calls
``sys.exit`` deep in a library would.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shardline.transport.serving import RetryElsewhere

DIRECTORY_VARIABLE = "SHARDLINE_BENCH_FAULTS"
CONTROL_PERIOD = 0.02  # seconds between two reads of the control file in a worker
RECORD = struct.Struct("<qqq")
RAN, REFUSED, EXITED = 0, 1, 2


class Behaviour:
    """This process's share of the faults: which mode applies to it now, and its records."""

    def __init__(self) -> None:
        folder = os.environ.get(DIRECTORY_VARIABLE)
        self.directory = Path(folder) if folder else None
        self.fd = -1
        self.pid = os.getpid()
        self.mode = ""
        self.delay = 0.0
        self.calls = 0
        self.next_read = 0.0

    def record(self, task_id: int, outcome: int) -> None:
        if self.directory is None:
            return
        if self.fd < 0 or self.pid != os.getpid():  # a forked child records on its own
            self.pid = os.getpid()
            path = self.directory / f"runs-{self.pid}"
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(self.fd, RECORD.pack(task_id, time.monotonic_ns(), outcome))

    def current_mode(self) -> str:
        now = time.monotonic()
        if now >= self.next_read and self.directory is not None:
            self.next_read = now + CONTROL_PERIOD
            try:
                control = json.loads((self.directory / "control").read_text())
            except (OSError, ValueError):
                control = {}
            mine = control.get("pid") == os.getpid()
            self.mode = control.get("mode", "") if mine else ""
            self.delay = float(control.get("delay", 0.0))
        return self.mode

    def run(self, task_id: int, refuse: type[Exception]) -> int:
        """What one call of ``echo`` does here: raises ``refuse`` on every other call in
        ``fail-half``, blocks ``delay`` seconds in ``slow``; records the outcome."""
        mode = self.current_mode()
        if mode == "fail-half":
            self.calls += 1
            if self.calls % 2:
                self.record(task_id, REFUSED)
                raise refuse(f"fail-half: call {self.calls} refused by pid {os.getpid()}")
        elif mode == "slow":
            time.sleep(self.delay)
        self.record(task_id, RAN)
        return task_id


BEHAVIOUR = Behaviour()


def write_control(directory: Path, **control: Any) -> None:
    """Replaces the control file at once (a reader sees the old one or the new one)."""
    temporary = directory / "control.tmp"
    temporary.write_text(json.dumps(control))
    temporary.replace(directory / "control")


def read_records(directory: Path) -> Iterator[tuple[int, int, int, int]]:
    """Every record of every worker process: ``(pid, task id, monotonic ns, outcome)``."""
    for path in directory.glob("runs-*"):
        pid = int(path.name.removeprefix("runs-"))
        data = path.read_bytes()
        usable = len(data) - len(data) % RECORD.size
        for task_id, at, outcome in RECORD.iter_unpack(data[:usable]):
            yield pid, task_id, at, outcome


async def echo(task_id: int) -> int:
    """Returns ``task_id``, having recorded that this process ran it (see the module)."""
    return BEHAVIOUR.run(task_id, RetryElsewhere)


async def exit_(task_id: int) -> None:
    """Raises ``SystemExit`` after its first await."""
    BEHAVIOUR.record(task_id, EXITED)
    await asyncio.sleep(0)
    raise SystemExit(f"task {task_id} asked its worker to exit")


async def whoami(payload: Any) -> int:
    """The pid of the process that ran it."""
    return os.getpid()


HANDLERS = {"echo": echo, "exit": exit_, "whoami": whoami}
