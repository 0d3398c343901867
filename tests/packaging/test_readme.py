"""Every Python block of README.md, run as written, each in a fresh interpreter, so that no
example can drift from the library.

A block runs as it is, unless the HTML comment on the line just above its fence says more:

- ``<!-- readme-test: needs etcd -->``: a real etcd is started (``tests/support/etcd_server.py``)
  and the block's ``127.0.0.1:2379`` is replaced by its address;
- ``<!-- readme-test: needs picodata -->``: the three-server stand-in cluster of
  ``tests/support/picodata_cluster.py`` is started and reset, each instance behind a pgproto
  proxy of ``tests/support/pgproto_standin.py`` (Picodata 26.1's query metadata), and the
  block's ``postgresql://app:secret@pico-1:4327`` is replaced by its DSN;
- ``<!-- readme-test: file PATH -->``: the block is a module the next blocks import; it is
  written to ``PATH`` in the folder every block runs in (and run, like any other block);
- ``<!-- readme-test: needs workers -->``: a real etcd is started, and the ``shardline worker``
  commands of the ``sh`` block just above the block run as written (the console script, from
  the folder the blocks run in) until the block has run, but at ``--address 127.0.0.1:0``; the
  etcd at ``10.0.0.1:2379``, in the commands and in the block, is replaced by the real one.

A marker the test does not know, or a server a block needs but does not name where it should,
fails that block's test: nothing is skipped. Each block runs with a timeout, in a script padded
so that a traceback's line numbers are the README's, from a folder of its own module's test
(LocalDiscovery's files under it too).
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.etcd_server import EtcdServer
from support.paths import ROOT
from support.pgproto_standin import Table, proxies_in_thread
from support.picodata_cluster import (
    BUCKET_COUNT,
    PicodataCluster,
)

pytestmark = pytest.mark.integration

README = ROOT / "README.md"
TIMEOUT = 120.0
ETCD_ADDRESS = "127.0.0.1:2379"
PICODATA_DSN = "postgresql://app:secret@pico-1:4327"
WORKERS_ETCD = "10.0.0.1:2379"
SERVERS = {"etcd": ETCD_ADDRESS, "picodata": PICODATA_DSN, "workers": WORKERS_ETCD}
"""What a block can need, and the text in it that stands for that server."""

_MARKER = re.compile(r"<!-- readme-test: (?P<kind>\S+) (?P<value>.*?) -->")


@dataclass(frozen=True)
class Block:
    line: int  # the README line of the block's first line of code
    code: str
    needs: frozenset[str] = frozenset()
    file: str | None = None
    problem: str | None = None  # what is wrong with its marker
    commands: tuple[str, ...] = ()  # the `shardline worker` commands of the sh block above

    @property
    def name(self) -> str:
        return f"README.md:{self.line}"


def _marked(line: int, code: str, marker: str, commands: tuple[str, ...] = ()) -> Block:
    """The block with what the comment line above its fence says; ``problem`` if anything.
    ``commands``: the ``shardline worker`` commands of the ``sh`` block just above it."""
    found = _MARKER.fullmatch(marker.strip())
    if found is None:
        if "readme-test" in marker:
            return Block(line, code, problem=f"a readme-test comment it cannot read: {marker!r}")
        return Block(line, code)
    kind, value = found["kind"], found["value"].strip()
    if kind == "file":
        if not value or value.startswith("/") or ".." in Path(value).parts:
            return Block(line, code, problem=f"file needs a relative path, got {value!r}")
        return Block(line, code, file=value)
    if kind == "needs":
        needs = frozenset(part.strip() for part in value.split(","))
        unknown = sorted(needs - SERVERS.keys())
        if unknown:
            return Block(line, code, problem=f"needs what the test cannot start: {unknown}")
        missing = sorted(need for need in needs if SERVERS[need] not in code)
        if missing:
            return Block(
                line,
                code,
                problem=f"needs {missing} but does not name {[SERVERS[m] for m in missing]}",
            )
        if "workers" in needs:
            if not commands:
                return Block(line, code, problem="needs workers but no sh block of them is above")
            return Block(line, code, needs=needs, commands=commands)
        return Block(line, code, needs=needs)
    return Block(line, code, problem=f"unknown readme-test marker {kind!r}")


def readme_blocks(text: str) -> list[Block]:
    """The ``python`` blocks of ``text``, in order."""
    lines = text.splitlines()
    blocks = []
    index = 0
    commands: tuple[str, ...] = ()  # of the last sh block, if it came just before
    while index < len(lines):
        fence = lines[index].strip()
        if fence not in ("```python", "```sh"):
            if fence.startswith("```"):
                commands = ()
            index += 1
            continue
        end = index + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        if end == len(lines):
            raise AssertionError(f"README.md:{index + 1}: a {fence[3:]} block that never ends")
        code = "\n".join(lines[index + 1 : end]) + "\n"
        if fence == "```sh":
            commands = tuple(
                command
                for command in code.replace("\\\n", " ").splitlines()
                if command.startswith("shardline worker ")
            )
        else:
            marker = lines[index - 1] if index > 0 else ""
            blocks.append(_marked(index + 2, code, marker, commands))
            commands = ()
        index = end + 1
    return blocks


BLOCKS = readme_blocks(README.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where every block runs, with the ``file`` blocks written in it."""
    directory = tmp_path_factory.mktemp("readme")
    for block in BLOCKS:
        if block.file is not None:
            path = directory / block.file
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.code, encoding="utf-8")
    return directory


def run_block(block: Block, folder: Path, replacements: dict[str, str]) -> str:
    """Runs the block as a script in ``folder`` and returns its standard output; fails the
    test with its output if it exits with a status other than 0 or outlives the timeout."""
    code = block.code
    for placeholder, actual in replacements.items():
        code = code.replace(placeholder, actual)
    script = folder / f"readme_line_{block.line}.py"
    # padded so that a traceback's line numbers are the README's
    script.write_text("\n" * (block.line - 1) + code, encoding="utf-8")
    runtime = folder / f"runtime_{block.line}"
    runtime.mkdir(exist_ok=True)
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=folder,
        env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, (
        f"{block.name} exited with status {done.returncode}:\n{done.stdout}\n{done.stderr}"
    )
    return done.stdout


def servers_for(block: Block, request: pytest.FixtureRequest) -> dict[str, str]:
    """Starts what the block needs; returns what replaces its placeholders."""
    replacements = {}
    if "etcd" in block.needs:
        etcd: EtcdServer = request.getfixturevalue("etcd")
        replacements[ETCD_ADDRESS] = f"127.0.0.1:{etcd.client_port}"
    if "picodata" in block.needs:
        cluster: PicodataCluster = request.getfixturevalue("picodata_cluster")
        cluster.reset()
        # Picodata 26.1's pgproto (query metadata) before each instance's server
        ports = {name: instance.server.port for name, instance in cluster.instances.items()}
        users = Table(columns=(("id", "integer"), ("name", "text")), key=("id",))
        stack = contextlib.ExitStack()
        request.addfinalizer(cluster.reset)
        request.addfinalizer(stack.close)  # first: the proxies stop, then the catalog resets
        addresses = stack.enter_context(proxies_in_thread(ports, {"users": users}, BUCKET_COUNT))
        with cluster.catalog.transaction():
            for name, address in addresses.items():
                cluster.catalog.set_address(name, address)
            cluster.catalog.set_raw("_pico_instance", "picodata_version", "26.1.1", "true", True)
        replacements[PICODATA_DSN] = cluster.dsn
    if "workers" in block.needs:
        etcd = request.getfixturevalue("etcd")
        replacements[WORKERS_ETCD] = f"127.0.0.1:{etcd.client_port}"
        folder: Path = request.getfixturevalue("folder")
        for command in block.commands:
            start_worker(command.replace(WORKERS_ETCD, replacements[WORKERS_ETCD]), folder, request)
    return replacements


def start_worker(command: str, folder: Path, request: pytest.FixtureRequest) -> None:
    """Runs the README's ``shardline worker`` command (at ``--address 127.0.0.1:0``, without
    its ``--tls-*`` options: the block's client sketch dials plaintext) from ``folder`` until
    the test ends; returns once it printed its record."""
    arguments = shlex.split(command)[1:]
    arguments[arguments.index("--address") + 1] = "127.0.0.1:0"
    for option in ("--tls-cert", "--tls-key", "--tls-ca"):
        if option in arguments:
            at = arguments.index(option)
            del arguments[at : at + 2]
    errors = folder / f"worker-{len(list(folder.glob('worker-*.err')))}.err"
    with errors.open("wb") as stderr:
        process = subprocess.Popen(
            [str(Path(sys.executable).with_name("shardline")), *arguments],
            cwd=folder,
            env={**os.environ, "XDG_RUNTIME_DIR": str(folder)},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
        )

    def stop() -> None:
        process.terminate()
        try:
            process.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        assert process.stdout is not None
        process.stdout.close()

    request.addfinalizer(stop)
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], TIMEOUT)
    assert ready, f"{command!r} printed no record within {TIMEOUT} s: {errors.read_text()}"
    assert process.stdout.readline(), f"{command!r} exited: {errors.read_text()}"


def test_the_readme_has_its_examples() -> None:
    assert len(BLOCKS) >= 10
    assert {"workers", "picodata"} <= {need for block in BLOCKS for need in block.needs}
    assert any(block.file for block in BLOCKS)


@pytest.mark.parametrize("block", BLOCKS, ids=[block.name for block in BLOCKS])
def test_a_readme_block_runs_as_written(
    block: Block, folder: Path, request: pytest.FixtureRequest
) -> None:
    assert block.problem is None, f"{block.name}: {block.problem}"
    run_block(block, folder, servers_for(block, request))


def test_the_routed_sql_example_writes_on_the_owning_master(
    picodata_cluster: PicodataCluster, folder: Path, request: pytest.FixtureRequest
) -> None:
    (block,) = [block for block in BLOCKS if 'asyncio.run(main(7, "ada"))' in block.code]
    cluster = picodata_cluster
    # after reset(), rs2 (its master m2, no replica) owns the upper half of the buckets
    output = run_block(block, folder, servers_for(block, request)).splitlines()
    row, rows, n, from_metadata, *explanation = output
    assert cluster.bucket_of(7) > BUCKET_COUNT // 2
    assert cluster.where(7) == ["m2"]
    assert cluster.users("m2") == [(7, "ada")]
    # read_only=True on a replicaset without replicas reads its master
    assert row == "<Record id=7 name='ada'>"
    # without a key the query runs on any instance; the stand-in's servers do not run
    # Picodata's distributed SQL, so the count is that one server's
    assert rows in ("[<Record count=1>]", "[<Record count=0>]")
    assert n == "1"
    assert from_metadata == "1"  # the INSERT, routed by its metadata
    assert explanation[0] == "tier 'default', bucket 1860: routable"
    assert "bucket 1860 is in [1501, 3000]" in explanation[1]
    assert "whose master 'm2'" in explanation[1]


@pytest.mark.parametrize(
    ("marker", "code", "problem"),
    [
        ("<!-- readme-test: needs redis -->", "x = 1\n", "cannot start: ['redis']"),
        ("<!-- readme-test: needs etcd -->", "x = 1\n", "does not name ['127.0.0.1:2379']"),
        ("<!-- readme-test: skip -->", "x = 1\n", "cannot read"),
        ("<!-- readme-test: skip it -->", "x = 1\n", "unknown readme-test marker 'skip'"),
        ("<!-- readme-test: file ../x.py -->", "x = 1\n", "relative path"),
        ("<!-- readme-test: needs workers -->", "x = '10.0.0.1:2379'\n", "no sh block"),
    ],
)
def test_a_marker_the_test_cannot_honour_fails_the_block(
    marker: str, code: str, problem: str
) -> None:
    (block,) = readme_blocks(f"{marker}\n```python\n{code}```\n")
    assert block.problem is not None
    assert problem in block.problem


def test_a_block_without_a_marker_runs_as_is() -> None:
    text = "# title\n\nsome prose\n\n```python\nprint(1)\n```\n\n```sh\nls\n```\n"
    assert readme_blocks(text) == [Block(line=6, code="print(1)\n")]
