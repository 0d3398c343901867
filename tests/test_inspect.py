"""``shardline inspect DSN``: one poll of a real PostgreSQL holding a Picodata-like catalog,
printed as tables."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
from conftest import rs_uuid
from pg_server import PgServer
from picodata_catalog import Catalog, name_uuid

from shardline.cli import main


@pytest.fixture
def catalog(pg: PgServer) -> Iterator[Catalog]:
    with Catalog(pg.create_schema()) as catalog:
        with catalog.transaction():
            catalog.add_tier("default", 3000)
            catalog.add_tier("other", 100)
            catalog.add_replicaset("r1", uuid=rs_uuid(1), instances=2)
            catalog.add_replicaset("r2", uuid=rs_uuid(2))
            catalog.add_replicaset("r3", "other", uuid=rs_uuid(3))
            catalog.rebalance("default")
            catalog.rebalance("other")
        yield catalog


def test_plain_tables_of_one_poll(catalog: Catalog, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", catalog.dsn, "--plain"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    assert lines[0].endswith("one poll, complete")
    assert "password" not in out
    master = catalog.expected().instances[name_uuid("r1_1")]
    assert any(line.split()[:3] == ["default", "3000", "2"] for line in lines)
    assert any(line.split()[:2] == ["other", "100"] for line in lines)
    assert any(line.split() == ["default", "1-1500", rs_uuid(1), str(master[2])] for line in lines)
    assert any(line.split()[:2] == ["other", "1-100"] for line in lines)
    assert any(line.split()[:2] == [rs_uuid(1), "default"] and "2/2" in line for line in lines)
    instance = [line.split() for line in lines if line.startswith(name_uuid("r1_1"))]
    assert instance == [[name_uuid("r1_1"), rs_uuid(1), "Online", str(master[2]), "master"]]
    assert next(line for line in lines if line.startswith(name_uuid("r1_2"))).split()[-2:] == [
        "Online",
        str(catalog.expected().instances[name_uuid("r1_2")][2]),
    ]


def test_rich_tables_on_a_terminal(
    catalog: Catalog, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "240")
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert main(["inspect", catalog.dsn, "--tier", "default"]) == 0
    out = capsys.readouterr().out
    assert "bucket ranges" in out
    assert "━" in out or "─" in out  # a rich table
    assert rs_uuid(1) in out
    assert rs_uuid(3) not in out  # --tier leaves "other" out


def test_an_incomplete_poll_prints_what_was_read_and_exits_1(
    catalog: Catalog, capsys: pytest.CaptureFixture[str]
) -> None:
    catalog.fail_buckets("other")
    assert main(["inspect", catalog.dsn, "--plain"]) == 1
    out, err = capsys.readouterr()
    assert "bucket-error (1x)" in err
    assert "rebalance in progress" in err
    assert "INCOMPLETE" in out
    assert any(line.split()[:2] == ["default", "1-1500"] for line in out.splitlines())
    assert not any(line.split()[:2] == ["other", "1-100"] for line in out.splitlines())


def test_an_unreachable_server_exits_1_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: refused
        status = main(["inspect", f"postgresql://x@127.0.0.1:{port}", "--timeout", "5"])
    assert status == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert "connect (1x)" in err
    assert "refused" in err


def test_invalid_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "postgresql://127.0.0.1", "--timeout", "0"]) == 2
    assert "timeout" in capsys.readouterr().err
    assert main(["inspect", "host=127.0.0.1 password=secret"]) == 2
    err = capsys.readouterr().err
    assert "dsn must be a postgresql:// or postgres:// URI" in err
    assert "secret" not in err


def test_the_command_line(catalog: Catalog) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "shardline", "inspect", catalog.dsn, "--tier", "other"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONWARNINGS": "error"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert any(line.split()[:2] == ["other", "1-100"] for line in done.stdout.splitlines())
    assert rs_uuid(1) not in done.stdout
