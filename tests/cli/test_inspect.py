"""``shardline inspect DSN``: one poll of a real PostgreSQL holding a Picodata-like catalog,
printed as tables."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from shardline.cli import main
from support.pg_server import PgServer
from support.picodata_catalog import Catalog, name_uuid
from support.replicasets import rs_uuid

# The catalog's names, by uuid: replicasets r1..r3, instances r1_1, r1_2, r2_1, r3_1
NAMES = {rs_uuid(n): f"r{n}" for n in (1, 2, 3)} | {
    name_uuid(name): name for name in ("r1_1", "r1_2", "r2_1", "r3_1")
}


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
    ranges = [line.split() for line in lines if line.startswith("default  1-1500")]
    assert ranges == [["default", "1-1500", NAMES[rs_uuid(1)], rs_uuid(1), str(master[2])]]
    assert any(line.split()[:2] == ["other", "1-100"] for line in lines)
    rs = [line.split() for line in lines if line.split()[1:2] == [rs_uuid(1)]]
    assert rs == [
        [
            NAMES[rs_uuid(1)],
            rs_uuid(1),
            "default",
            NAMES[name_uuid("r1_1")],
            name_uuid("r1_1"),
            str(master[2]),
            "2/2",
        ]
    ]
    instance = [line.split() for line in lines if name_uuid("r1_1") in line.split()[:2]]
    assert instance == [
        [
            NAMES[name_uuid("r1_1")],
            name_uuid("r1_1"),
            NAMES[rs_uuid(1)],
            rs_uuid(1),
            "Online",
            str(master[2]),
            "master",
        ]
    ]
    replica = next(line for line in lines if name_uuid("r1_2") in line.split()[:2])
    assert replica.split()[-2:] == [
        "Online",
        str(catalog.expected().instances[name_uuid("r1_2")][2]),
    ]


def test_json_document_of_one_poll(catalog: Catalog, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", catalog.dsn, "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    document = json.loads(out)
    assert document["complete"] is True
    assert document["failures"] == {}
    assert document["last_failure"] is None
    assert document["server"]
    assert document["tiers"] == [
        {"name": "default", "bucket_count": 3000, "ranges": 2, "mapped": 3000, "replicasets": 2},
        {"name": "other", "bucket_count": 100, "ranges": 1, "mapped": 100, "replicasets": 1},
    ]
    expected = catalog.expected()
    master = name_uuid("r1_1")
    rs1 = next(r for r in document["replicasets"] if r["uuid"] == rs_uuid(1))
    assert rs1 == {
        "uuid": rs_uuid(1),
        "name": NAMES[rs_uuid(1)],
        "tier": "default",
        "master_uuid": master,
        "master_name": NAMES[master],
        "master_address": expected.instances[master][2],
        "online": 2,
        "instances": 2,
    }
    assert {i["uuid"]: i["name"] for i in document["instances"]} == {
        uuid: NAMES[uuid] for uuid in expected.instances
    }
    replica = next(i for i in document["instances"] if i["uuid"] == name_uuid("r1_2"))
    assert replica == {
        "uuid": name_uuid("r1_2"),
        "name": NAMES[name_uuid("r1_2")],
        "replicaset_uuid": rs_uuid(1),
        "replicaset_name": NAMES[rs_uuid(1)],
        "state": "Online",
        "address": expected.instances[name_uuid("r1_2")][2],
        "master": False,
    }
    assert [
        (r["tier"], r["start"], r["end"], r["replicaset_uuid"]) for r in document["bucket_ranges"]
    ] == [(tier, s, e, o) for tier in ("default", "other") for s, e, o in expected.maps[tier]]


def test_json_of_an_incomplete_poll_is_still_one_document(
    catalog: Catalog, capsys: pytest.CaptureFixture[str]
) -> None:
    catalog.fail_buckets("other")
    assert main(["inspect", catalog.dsn, "--json", "--tier", "other"]) == 1
    out, err = capsys.readouterr()
    document = json.loads(out)
    assert document["complete"] is False
    assert document["failures"] == {"bucket-error": 1}
    assert "rebalance in progress" in document["last_failure"]
    assert document["bucket_ranges"] == []
    assert [r["uuid"] for r in document["replicasets"]] == [rs_uuid(3)]
    assert "bucket-error (1x)" in err


def test_json_when_nothing_could_be_read(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        status = main(["inspect", f"postgresql://x@127.0.0.1:{port}", "--json", "--timeout", "5"])
    assert status == 1
    document = json.loads(capsys.readouterr().out)
    assert document["complete"] is False
    assert document["server"] is None
    assert document["failures"] == {"connect": 1}
    assert document["tiers"] == document["instances"] == []


def test_json_and_plain_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["inspect", "postgresql://127.0.0.1", "--json", "--plain"])
    assert exited.value.code == 2
    assert "not allowed with" in capsys.readouterr().err


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


@pytest.mark.parametrize("output", ["--plain", "--json"])
def test_an_empty_catalog_is_said_and_fails(
    pg: PgServer, output: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with Catalog(pg.create_schema()) as catalog:
        assert main(["inspect", catalog.dsn, output]) == 1
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        f"shardline inspect: the catalog at {catalog.dsn.split('@')[-1].split('/')[0]} is empty:"
        " no tiers, replicasets or instances (is this the cluster's database?)"
    ]
    if output == "--json":
        assert json.loads(out)["complete"] is True
    else:
        assert out == ""
