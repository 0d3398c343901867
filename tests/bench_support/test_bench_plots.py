"""benches/plots.py, without a benchmark run: it draws its three pictures from a trimmed real run
(tests/data/bench_plots_run.json, whose ``fixture_source`` says where it came from) and refuses a
run that lacks a picture's groups, writing nothing. And ``benchkit.cdf_ns``, the latency
distribution bench_calls.py records for calls.png."""

from __future__ import annotations

import copy
import importlib.util
import json
import statistics
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from support.paths import DATA, ROOT

pytestmark = pytest.mark.integration

SCRIPT = ROOT / "benches" / "plots.py"
FIXTURE = DATA / "bench_plots_run.json"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def load(name: str, path: Path) -> ModuleType:
    """A file of benches/ as a module (``benches`` is a folder of benchmarks, not an installed
    package)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


plots = load("bench_plots", SCRIPT)
benchkit = load("bench_benchkit", ROOT / "benches" / "benchkit.py")


@pytest.fixture
def run() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text())  # type: ignore[no-any-return]


def test_draws_the_three_pictures_as_png(run: dict[str, Any], tmp_path: Path) -> None:
    written = plots.draw(run, tmp_path / "plots")
    names = ["lookup.png", "dispatch.png", "calls.png"]
    assert written == [tmp_path / "plots" / name for name in names]
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == sorted(names)
    for path in written:
        body = path.read_bytes()
        assert body.startswith(PNG_SIGNATURE), path
        assert len(body) > 10_000, (path, len(body))  # axes, curves and text, not a blank


def test_the_fixture_holds_each_bench_s_groups(run: dict[str, Any]) -> None:
    groups = {bench["group"] for bench in run["benchmarks"]}
    assert any(group.startswith("lookup ") for group in groups)
    assert any(group.startswith("proxy dispatch overhead, ") for group in groups)
    assert any(group.startswith("pool ") and group.endswith(" workers") for group in groups)
    assert any(group.startswith("calls end to end, 1 in flight, ") for group in groups)
    assert run["fixture_source"]


def without(run: dict[str, Any], prefix: str) -> dict[str, Any]:
    trimmed = copy.deepcopy(run)
    trimmed["benchmarks"] = [b for b in run["benchmarks"] if not b["group"].startswith(prefix)]
    return trimmed


@pytest.mark.parametrize(
    ("prefix", "picture", "bench"),
    [
        ("lookup ", "lookup.png", "bench_lookup.py"),
        ("proxy dispatch overhead, ", "dispatch.png", "bench_pool.py"),
        ("pool ", "dispatch.png", "bench_pool.py"),
        ("calls end to end, 1 in flight, ", "calls.png", "bench_calls.py"),
    ],
)
def test_a_run_without_a_picture_s_groups_is_refused_and_nothing_is_written(
    run: dict[str, Any], tmp_path: Path, prefix: str, picture: str, bench: str
) -> None:
    with pytest.raises(plots.MissingGroups) as raised:
        plots.draw(without(run, prefix), tmp_path / "plots")
    message = str(raised.value)
    assert message.startswith(f"{picture} needs ")
    assert prefix.strip(", ") in message
    assert f"benches/{bench}" in message
    assert (raised.value.picture, raised.value.bench) == (picture, bench)
    assert not (tmp_path / "plots").exists()


def test_a_calls_run_from_before_cdf_ns_is_refused(run: dict[str, Any], tmp_path: Path) -> None:
    old = copy.deepcopy(run)
    for bench in old["benchmarks"]:
        for figures in bench["extra_info"].get("by_way", {}).values():
            if isinstance(figures, dict):
                figures.pop("cdf_ns", None)
    with pytest.raises(plots.MissingGroups, match=r"calls.png needs by_way\[.*\]\['cdf_ns'\]"):
        plots.draw(old, tmp_path / "plots")
    assert not (tmp_path / "plots").exists()


def test_the_command_exits_non_zero_naming_what_is_missing(
    run: dict[str, Any], tmp_path: Path
) -> None:
    bad = tmp_path / "run.json"
    bad.write_text(json.dumps(without(run, "lookup ")))
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(bad), "--out", str(tmp_path / "plots")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert done.stderr.startswith(f"plots.py: {bad}: lookup.png needs the groups 'lookup ")
    assert "benches/bench_lookup.py" in done.stderr
    assert not (tmp_path / "plots").exists()


@given(st.lists(st.floats(min_value=1e-7, max_value=1.0), min_size=2, max_size=300))
def test_cdf_ns_runs_from_the_minimum_to_the_maximum_through_the_median(
    samples: list[float],
) -> None:
    cdf = benchkit.cdf_ns(samples)
    assert [percent for percent, _ in cdf] == list(benchkit.CDF_PERCENTS)
    values = dict(cdf)
    assert values[0] == round(min(samples) * 1e9)
    assert values[100] == round(max(samples) * 1e9)
    assert abs(values[50] - statistics.median(samples) * 1e9) <= 1
    assert [ns for _, ns in cdf] == sorted(ns for _, ns in cdf)


FAULTS_FIXTURE = DATA / "bench_faults_run.json"


@pytest.fixture
def faults_run() -> dict[str, Any]:
    return json.loads(FAULTS_FIXTURE.read_text())  # type: ignore[no-any-return]


def test_faults_png_is_drawn_only_when_asked_for(
    run: dict[str, Any], faults_run: dict[str, Any], tmp_path: Path
) -> None:
    assert faults_run["fixture_source"]
    written = plots.draw(faults_run, tmp_path / "plots", only=["faults.png"])
    assert written == [tmp_path / "plots" / "faults.png"]
    body = written[0].read_bytes()
    assert body.startswith(PNG_SIGNATURE)
    assert len(body) > 10_000, len(body)
    # a full run's pictures do not include it, so a run without bench_faults.py still draws
    assert "faults.png" not in [p.name for p in plots.draw(run, tmp_path / "full")]


def test_faults_png_refuses_a_run_without_the_faults_groups(
    run: dict[str, Any], tmp_path: Path
) -> None:
    with pytest.raises(plots.MissingGroups, match=r"faults.png needs the groups 'faults: "):
        plots.draw(run, tmp_path / "plots", only=["faults.png"])
    assert not (tmp_path / "plots").exists()


def test_an_unknown_picture_name_is_refused_naming_the_known_ones(
    faults_run: dict[str, Any], tmp_path: Path
) -> None:
    with pytest.raises(
        ValueError, match=r"no picture named fault.png; known: lookup.png, .*faults.png"
    ):
        plots.draw(faults_run, tmp_path / "plots", only=["fault.png"])
    assert not (tmp_path / "plots").exists()
