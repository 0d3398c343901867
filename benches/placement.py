"""Where the benchmark's client and its servers run: the same CPU, separate CPUs, or wherever
the scheduler puts them.

On a 2-core virtual machine a round trip costs what waking the other side costs, and that
depends on where the scheduler left it: on the client's core (a context switch, ~20 µs here)
or on the other, idle one (waking an idle virtual CPU, ~60-100 µs). Left to the scheduler, each
server settles on one or the other, so a way's latency is bimodal and two ways of one run can
land differently. The end-to-end benchmarks therefore measure each placement apart:

- ``separate CPUs``: every thread of this process on one CPU, every thread of the servers on
  the other, as a client and its server on two machines (at 16 in flight, each side's CPU per
  call then sets the throughput);
- ``one CPU``: all of them on one CPU, so every round trip is two context switches and the
  latency is the CPU both sides spend on a call, plus those switches;
- ``unpinned``: as the scheduler places them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

PLACEMENTS = ("separate CPUs", "one CPU", "unpinned")


def _threads(pid: int) -> list[int]:
    """Every thread of ``pid`` (a process's affinity is its threads', set one by one)."""
    try:
        return [int(task.name) for task in Path(f"/proc/{pid}/task").iterdir()]
    except FileNotFoundError:
        return []


@contextlib.contextmanager
def placed(server_pids: Iterable[int], placement: str) -> Iterator[None]:
    """Runs this process and the ``server_pids`` (every thread of each) on the CPUs
    ``placement`` says, restoring every affinity after. A thread or process a server starts
    meanwhile inherits its parent's affinity (a PostgreSQL backend, its postmaster's)."""
    if placement == "unpinned":
        yield
        return
    cpus = sorted(os.sched_getaffinity(0))
    if placement == "separate CPUs" and len(cpus) < 2:
        pytest.skip(f"one CPU available ({cpus}): client and server cannot be kept apart")
    client = {cpus[0]}
    server = {cpus[1]} if placement == "separate CPUs" else client
    threads = {tid: client for tid in _threads(os.getpid())}
    for pid in server_pids:
        threads.update({tid: server for tid in _threads(pid)})
    saved = {}
    try:
        for tid, target in threads.items():
            with contextlib.suppress(ProcessLookupError):
                saved[tid] = os.sched_getaffinity(tid)
                os.sched_setaffinity(tid, target)
        yield
    finally:
        for tid, before in saved.items():
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(tid, before)
