"""benches/fault_handlers.py, the handlers bench_faults.py serves: the control file picks the
worker and the fault, every run is recorded where the benchmark reads it back, a refused call
is recorded as not run."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

from shardline.transport.serving import RetryElsewhere
from support.paths import ROOT


def load() -> ModuleType:
    path = ROOT / "benches" / "fault_handlers.py"
    spec = importlib.util.spec_from_file_location("bench_fault_handlers", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


handlers = load()


@pytest.fixture
def behaviour(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> object:
    monkeypatch.setenv(handlers.DIRECTORY_VARIABLE, str(tmp_path))
    handlers.write_control(tmp_path)
    return handlers.Behaviour()


def reread(behaviour: object) -> None:
    behaviour.next_read = 0.0  # type: ignore[attr-defined]


def test_every_run_is_recorded_and_read_back(behaviour: object, tmp_path: Path) -> None:
    for task_id in (7, 8, 7):
        assert behaviour.run(task_id, RetryElsewhere) == task_id  # type: ignore[attr-defined]
    records = list(handlers.read_records(tmp_path))
    assert [(pid, task_id, outcome) for pid, task_id, _, outcome in records] == [
        (os.getpid(), 7, handlers.RAN),
        (os.getpid(), 8, handlers.RAN),
        (os.getpid(), 7, handlers.RAN),
    ]
    times = [at for _, _, at, _ in records]
    assert times == sorted(times)


def test_fail_half_refuses_every_other_call_of_the_chosen_pid_only(
    behaviour: object, tmp_path: Path
) -> None:
    handlers.write_control(tmp_path, pid=os.getpid() + 1, mode="fail-half")
    reread(behaviour)
    assert [behaviour.run(n, RetryElsewhere) for n in range(4)] == [0, 1, 2, 3]  # type: ignore[attr-defined]
    handlers.write_control(tmp_path, pid=os.getpid(), mode="fail-half")
    reread(behaviour)
    outcomes = []
    for n in range(4, 10):
        try:
            behaviour.run(n, RetryElsewhere)  # type: ignore[attr-defined]
        except RetryElsewhere:
            outcomes.append("refused")
        else:
            outcomes.append("ran")
    assert outcomes == ["refused", "ran"] * 3
    refused = [
        t for _, t, _, outcome in handlers.read_records(tmp_path) if outcome == handlers.REFUSED
    ]
    assert refused == [4, 6, 8]


def test_slow_blocks_the_chosen_pid_for_the_delay(behaviour: object, tmp_path: Path) -> None:
    handlers.write_control(tmp_path, pid=os.getpid(), mode="slow", delay=0.05)
    reread(behaviour)
    for n in range(3):
        behaviour.run(n, RetryElsewhere)  # type: ignore[attr-defined]
    records = [at for _, _, at, _ in handlers.read_records(tmp_path)]
    assert records[2] - records[0] >= 2 * 0.05 * 1e9
    handlers.write_control(tmp_path)
    reread(behaviour)
    assert behaviour.current_mode() == ""  # type: ignore[attr-defined]


def test_a_torn_control_file_means_no_fault(behaviour: object, tmp_path: Path) -> None:
    (tmp_path / "control").write_text('{"pid": ')
    reread(behaviour)
    assert behaviour.current_mode() == ""  # type: ignore[attr-defined]


def test_exit_raises_system_exit_after_its_first_await(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handlers.BEHAVIOUR, "directory", tmp_path)

    step = handlers.exit_(5).send
    assert step(None) is None  # suspended at its first await
    with pytest.raises(SystemExit, match="task 5 asked its worker to exit"):
        step(None)
    [(_, task_id, _, outcome)] = handlers.read_records(tmp_path)
    assert (task_id, outcome) == (5, handlers.EXITED)
