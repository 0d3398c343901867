"""Every ``shardline`` command that prints stops quietly when the reader of its stdout goes away
(``shardline inspect ... | head``): no ``BrokenPipeError`` traceback, no "Exception ignored"
at exit, status 0; a watch stops at its next poll instead of polling on. Each command runs as
a process of its own with its stdout a real pipe: one whose reader closed before it started
(every write fails, deterministically), or one read by ``head``."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from support.picodata_catalog import Catalog
from support.transport_servers import new_namespace

pytestmark = pytest.mark.integration

WAIT = 60.0  # the most a command is waited for


def shardline(*args: str) -> list[str]:
    return [sys.executable, "-m", "shardline", *args]


def into_closed_pipe(command: list[str], env: dict[str, str] | None = None) -> tuple[int, str]:
    """Runs ``command`` with stdout a pipe nobody reads any more: (status, stderr)."""
    reader, writer = os.pipe()
    os.close(reader)
    try:
        done = subprocess.run(
            command, stdout=writer, stderr=subprocess.PIPE, timeout=WAIT, env=env, check=False
        )
    finally:
        os.close(writer)
    return done.returncode, done.stderr.decode()


def into_head(command: list[str], lines: int) -> tuple[int, str, str]:
    """``command | head -n lines``: (the command's status, its stderr, what head printed)."""
    reader, writer = os.pipe()
    try:
        process = subprocess.Popen(command, stdout=writer, stderr=subprocess.PIPE)
        head = subprocess.Popen(["head", "-n", str(lines)], stdin=reader, stdout=subprocess.PIPE)
    finally:
        os.close(reader)
        os.close(writer)
    try:
        shown, _ = head.communicate(timeout=WAIT)
        _, err = process.communicate(timeout=WAIT)
    finally:
        for started in (process, head):
            if started.poll() is None:
                started.kill()
                started.wait()
    return process.returncode, err.decode(), shown.decode()


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["--version"],
        ["inspect", "--help"],
        ["inspect", "{dsn}", "--plain"],
        ["inspect", "{dsn}", "--json"],
        ["inspect", "{dsn}", "--watch", "--plain", "--interval", "0.05"],
        ["inspect", "{dsn}", "--watch", "--json", "--interval", "0.05"],
        ["demo", "--part", "topology", "--plain"],
        ["demo", "--part", "registration", "--plain"],
    ],
    ids=" ".join,
)
def test_a_command_whose_reader_left_stops_quietly(catalog: Catalog, args: list[str]) -> None:
    status, err = into_closed_pipe(shardline(*(a.format(dsn=catalog.dsn) for a in args)))
    assert (status, err) == (0, "")


def test_a_worker_whose_reader_left_withdraws_and_stops_quietly(tmp_path: Path) -> None:
    namespace = new_namespace()
    status, err = into_closed_pipe(
        shardline("worker", "--namespace", namespace, "--address", "127.0.0.1:0"),
        env={**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)},
    )
    # its INFO lines (it served, it stopped), and nothing else
    assert status == 0
    assert "Traceback" not in err
    assert "Broken pipe" not in err
    assert err.endswith(" stopped\n")
    # it had published its record and withdrew it (LocalDiscovery's log: the record, then
    # its withdrawal; no record left)
    (store,) = (tmp_path / "shardline").glob(f"{namespace}-*.sqlite3")
    with contextlib.closing(sqlite3.connect(store)) as db:
        assert db.execute("SELECT count(*) FROM records").fetchone() == (0,)
        changes = db.execute("SELECT data IS NULL FROM changes ORDER BY seq").fetchall()
    assert changes == [(0,), (1,)]


def test_a_watch_into_head_ends_when_head_has_its_lines(catalog: Catalog) -> None:
    status, err, shown = into_head(
        shardline("inspect", catalog.dsn, "--watch", "--json", "--interval", "0.05"), 3
    )
    assert (status, err) == (0, "")
    assert len(shown.splitlines()) == 3


@pytest.mark.parametrize(
    "args", [["inspect", "{dsn}", "--plain"], ["demo", "--plain"]], ids=" ".join
)
def test_a_command_into_head_is_quiet(catalog: Catalog, args: list[str]) -> None:
    status, err, shown = into_head(shardline(*(a.format(dsn=catalog.dsn) for a in args)), 1)
    assert (status, err) == (0, "")
    assert len(shown.splitlines()) == 1
