"""Collection and fixtures for the benchmarks (see README.md; helpers live in benchkit.py).

The suite runs only when asked for, ``pytest benches/``: the project's ``testpaths`` is
``tests``, and the modules here are named ``bench_*.py``, which this conftest collects itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .benchkit import ROUNDS, WARMUP_ROUNDS


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    """Collects ``bench_*.py``; a file named on the command line pytest collects by itself."""
    if (
        file_path.suffix == ".py"
        and file_path.name.startswith("bench_")
        and not parent.session.isinitpath(file_path)
    ):
        return pytest.Module.from_parent(parent, path=file_path)
    return None


@pytest.fixture(scope="session", autouse=True)
def _quiet_picopyn() -> None:
    """picopyn logs each applied poll at DEBUG; like a production client, run with that off."""
    logging.getLogger("picopyn").setLevel(logging.WARNING)


@pytest.fixture
def per_call(benchmark: Any) -> Callable[..., Any]:
    """``per_call(round_fn, calls, rounds=..., warmup=..., **extra_info)``: times ``round_fn``,
    which makes ``calls`` calls, over a fixed number of rounds; returns the last round's result."""

    def run(
        round_fn: Callable[[], Any],
        calls: int,
        *,
        rounds: int = ROUNDS,
        warmup: int = WARMUP_ROUNDS,
        **info: Any,
    ) -> Any:
        benchmark.extra_info["calls_per_round"] = calls
        benchmark.extra_info.update(info)
        before = _cpu_snapshot()
        result = benchmark.pedantic(round_fn, rounds=rounds, iterations=1, warmup_rounds=warmup)
        benchmark.extra_info["others_cpu"] = _others_cpu(before, _cpu_snapshot())
        return result

    return run


_LOAD_AT_COLLECTION = os.getloadavg()


def pytest_benchmark_update_machine_info(
    config: pytest.Config, machine_info: dict[str, Any]
) -> None:
    """Adds what RESULTS.md reports: the CPU model, the core count, the load before and after."""
    model = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as cpuinfo:
        models = (
            line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")
        )
        model = next(models, "")
    machine_info["cpu_model"] = model or platform.processor()
    machine_info["nproc"] = os.cpu_count()
    machine_info["loadavg_at_collection"] = _LOAD_AT_COLLECTION
    machine_info["loadavg_at_end"] = os.getloadavg()
    machine_info["shardline_build"] = _build_info()


def _build_info() -> dict[str, str]:
    """Which shardline was measured: the extension's file (relative to the repository when it
    lies inside it, else only its name, so no machine's layout ends up in RESULTS.md), its
    build time, and ``SHARDLINE_BUILD`` from the environment (say, the commit a wheel was
    built from)."""
    import shardline._core as core

    path = Path(core.__file__).resolve()
    built = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(path.stat().st_mtime))
    repository = Path(__file__).resolve().parent.parent
    shown = path.relative_to(repository) if path.is_relative_to(repository) else path.name
    return {"extension": str(shown), "built": built, "note": os.environ.get("SHARDLINE_BUILD", "")}


def _cpu_snapshot() -> tuple[float, float, float]:
    """(wall seconds, CPU seconds of the whole machine, CPU seconds of this process)."""
    busy = 0.0
    with contextlib.suppress(OSError), open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
        busy = (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")
    return time.perf_counter(), busy, time.process_time()


def _others_cpu(
    before: tuple[float, float, float], after: tuple[float, float, float]
) -> float | None:
    """How many cores other processes kept busy, on average, while a benchmark ran (0 = quiet;
    on a 2-core machine 1.0 means the other core was busy all along). /proc/stat counts in
    ticks of 10 ms, so over a 0.1 s benchmark this is good to about +-0.2; None below 0.05 s."""
    wall = after[0] - before[0]
    if wall < 0.05 or after[1] == 0:
        return None
    others = (after[1] - before[1]) - (after[2] - before[2])
    return round(min(max(others / wall, 0.0), float(os.cpu_count() or 1)), 2)
