"""Balancers by name: the ``shardline.balancers`` entry-point group, WorkerProxy and the demo
taking a name, and the example plugin in examples/balancer-plugin installed and found by name."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from shardline import (
    AffinityLoadBalancer,
    DiscoveryEvent,
    InvalidArgument,
    LeastLoadedLoadBalancer,
    RoundRobinLoadBalancer,
    ShardlineError,
    WeightedRoundRobinLoadBalancer,
    WorkerMetadata,
    WorkerProxy,
)
from shardline.balancer_conformance import check_balancer
from shardline.balancers import balancer_names, create_balancer, registry
from shardline.cli import main
from support.paths import ROOT

pytestmark = pytest.mark.integration

EXAMPLE = ROOT / "examples" / "balancer-plugin"

BUILT_INS = {
    "round-robin": RoundRobinLoadBalancer,
    "weighted": WeightedRoundRobinLoadBalancer,
    "least-loaded": LeastLoadedLoadBalancer,
    "affinity": AffinityLoadBalancer,
}

Install = Callable[..., None]


@pytest.fixture
def install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Install:
    """``install(dist, entry_points, **modules)``: a distribution made importable on sys.path,
    as pip would leave it (a ``.dist-info`` with ``entry_points.txt``, and module files). The
    registry's cache starts empty and is put back afterwards."""
    monkeypatch.setattr(registry, "_registered", None)
    monkeypatch.syspath_prepend(str(tmp_path))

    def make(dist: str, entry_points: dict[str, str], **modules: str) -> None:
        info = tmp_path / f"{dist}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        lines = [f"{name} = {value}" for name, value in entry_points.items()]
        (info / "entry_points.txt").write_text("[shardline.balancers]\n" + "\n".join(lines))
        for module, source in modules.items():
            (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
            monkeypatch.delitem(sys.modules, module, raising=False)

    return make


def test_the_built_ins_are_registered_by_name() -> None:
    assert set(BUILT_INS) <= set(balancer_names())
    for name, cls in BUILT_INS.items():
        balancer = create_balancer(name)
        assert type(balancer) is cls
        assert create_balancer(name) is not balancer  # every resolution makes a new one


def test_an_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(InvalidArgument) as raised:
        create_balancer("round_robin")
    assert isinstance(raised.value, ShardlineError)
    assert isinstance(raised.value, ValueError)
    message = str(raised.value)
    assert message.startswith("unknown balancer 'round_robin': the known names are ")
    for name in BUILT_INS:
        assert name in message
    assert "'shardline.balancers' entry-point group" in message


def records(count: int) -> list[WorkerMetadata]:
    return [
        WorkerMetadata(uid=uuid.UUID(int=n + 1), address=f"w{n + 1}", pid=n, version="1")
        for n in range(count)
    ]


class Echo:
    def __init__(self, record: WorkerMetadata) -> None:
        self.record = record

    async def dispatch(self, task: Any, *, timeout: float | None = None) -> Any:
        return self.record.address, task


async def announce(workers: list[WorkerMetadata]) -> AsyncIterator[DiscoveryEvent]:
    for record in workers:
        yield DiscoveryEvent("worker-added", record)
    await asyncio.Event().wait()


async def test_a_proxy_takes_a_name(install: Install) -> None:
    install(
        "recording-balancer",
        {"recording": "recording_balancer:Recording"},
        recording_balancer="""
            SEEN = []

            class Recording:
                async def delegate(self, task, *, context):
                    SEEN.append(task)
                    for uid in list(context.workers):
                        served = yield uid
                        if served is not None:
                            return
        """,
    )

    async def scenario() -> Any:
        async with WorkerProxy(
            discovery=announce(records(2)), loadbalancer="recording", connect=Echo, quorum=2
        ) as proxy:
            return await proxy.dispatch("hello")

    assert await scenario() == ("w1", "hello")
    assert sys.modules["recording_balancer"].SEEN == ["hello"]


def test_a_proxy_given_an_unknown_name_is_not_made() -> None:
    with pytest.raises(InvalidArgument, match="unknown balancer 'nope': the known names are"):
        WorkerProxy(discovery=announce([]), loadbalancer="nope", connect=Echo)


def test_a_name_registered_since_the_first_lookup_is_found(install: Install) -> None:
    assert "latecomer" not in balancer_names()  # the group is read and kept
    install("late-balancer", {"latecomer": "late_balancer:Late"}, late_balancer=PLAIN)
    assert type(create_balancer("latecomer")).__name__ == "Late"
    assert "latecomer" in balancer_names()


PLAIN = """
    class Late:
        async def delegate(self, task, *, context):
            for uid in list(context.workers):
                served = yield uid
                if served is not None:
                    return
"""


def test_a_name_two_distributions_register_is_refused(install: Install) -> None:
    install("first-dist", {"twice": "late_balancer:Late"}, late_balancer=PLAIN)
    install("second-dist", {"twice": "late_balancer:Late"})
    with pytest.raises(InvalidArgument) as raised:
        create_balancer("twice")
    message = str(raised.value)
    assert message.startswith("balancer 'twice' is registered by more than one distribution: ")
    assert "late_balancer:Late (first-dist)" in message
    assert "late_balancer:Late (second-dist)" in message


def test_an_entry_point_that_makes_no_balancer_is_refused(install: Install) -> None:
    install(
        "odd-balancers",
        {"constant": "odd_balancers:CONSTANT", "not-one": "odd_balancers:not_a_balancer"},
        odd_balancers="""
            CONSTANT = 42

            def not_a_balancer():
                return "round-robin"
        """,
    )
    with pytest.raises(InvalidArgument) as raised:
        create_balancer("constant")
    assert str(raised.value) == (
        "balancer 'constant': entry point odd_balancers:CONSTANT (odd-balancers) is 42, not a"
        " factory (a class or a function taking no arguments)"
    )
    with pytest.raises(InvalidArgument) as raised:
        create_balancer("not-one")
    assert str(raised.value) == (
        "balancer 'not-one': the factory odd_balancers:not_a_balancer (odd-balancers) returned"
        " 'round-robin', which has no delegate method"
    )


def test_an_entry_point_that_fails_to_import_says_which(install: Install) -> None:
    install(
        "broken-dist",
        {"broken": "broken_balancer:Broken"},
        broken_balancer="import a_module_nobody_installed\n",
    )
    with pytest.raises(ModuleNotFoundError) as raised:
        create_balancer("broken")
    assert raised.value.__notes__ == [
        "loading balancer 'broken' from entry point broken_balancer:Broken (broken-dist)"
    ]


def test_importing_shardline_reads_no_entry_points(child_python: Callable[[str], str]) -> None:
    code = "import sys, shardline; print('importlib.metadata' in sys.modules)"
    assert child_python(code) == "False"


def test_the_demo_takes_a_registered_name(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["demo", "--plain", "--part", "pool", "--in-process", "--balancer", "affinity"])
    out = capsys.readouterr().out
    assert status == 0
    assert "balancer: AffinityLoadBalancer; " in out
    assert "tasks sent to a superseded address: 0" in out


def test_the_demo_refuses_an_unknown_name_with_the_known_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["demo", "--part", "pool", "--balancer", "fastest"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --balancer: unknown balancer 'fastest': the known names are affinity," in err


# The example plugin --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def example_plugin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/balancer-plugin built and installed with pip into a directory of its own (from
    a copy: pip builds in the source tree), without network: the directory to put on
    sys.path."""
    work = tmp_path_factory.mktemp("example-plugin")
    source = work / "source"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    target = work / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-index",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(source),
        ],
        check=True,
        timeout=300,
        capture_output=True,
    )
    return target


def test_the_example_plugin_is_found_by_name_and_conforms(
    example_plugin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registry, "_registered", None)
    monkeypatch.syspath_prepend(str(example_plugin))
    assert "example-shuffle" in balancer_names()
    balancer = create_balancer("example-shuffle")
    assert type(balancer).__module__ == "shardline_example_balancer"
    check_balancer(lambda: create_balancer("example-shuffle"))

    async def scenario() -> Any:
        async with WorkerProxy(
            discovery=announce(records(3)), loadbalancer="example-shuffle", connect=Echo, quorum=3
        ) as proxy:
            return await proxy.dispatch("task")

    # a sync test: check_balancer runs event loops of its own
    address, task = asyncio.run(scenario())
    assert address in {"w1", "w2", "w3"}
    assert task == "task"


def test_the_example_plugins_own_suite_passes(example_plugin: Path, tmp_path: Path) -> None:
    """What the plugin's author runs: its tests, with shardline.balancer_conformance, in a
    fresh process."""
    tests = tmp_path / "tests"
    shutil.copytree(EXAMPLE / "tests", tests)
    environment = {**os.environ, "PYTHONPATH": str(example_plugin)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests)],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert " passed" in done.stdout
