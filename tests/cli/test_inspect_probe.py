"""``shardline inspect DSN --probe``: each instance's health as the Picodata client's registry
sees it after probe queries, against one real PostgreSQL behind
``tests/support/forwarded_cluster.py``'s forwarders (a stalled instance is a forwarder that
accepts connections and stops forwarding). The command runs as a process of its own, so that
this test's event loop keeps the forwarders going meanwhile."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from typing import Any

import pytest

from support.forwarded_cluster import cluster
from support.interruptible import SHARDLINE
from support.pg_server import PgServer
from support.picodata_catalog import Catalog, name_uuid

pytestmark = [pytest.mark.integration, pytest.mark.async_timeout(120)]

INSTANCES = ("r1_1", "r1_2", "r1_3", "r2_1", "r2_2")
PROBE_TIMEOUT = "0.5"  # a healthy instance answers in milliseconds, even on a loaded machine
WAIT = 60.0  # the most the command or one of its lines is waited for


async def inspect(*args: str) -> tuple[int, str, str]:
    """Runs ``shardline inspect`` to its end: (status, stdout, stderr)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "shardline",
        "inspect",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "240"},
    )
    out, err = await asyncio.wait_for(process.communicate(), WAIT)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def health_rows(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The health part's rows by instance name."""
    return {row["name"]: row for row in document["health"]["instances"]}


async def test_a_stalled_instance_is_shown_ejected(pg: PgServer) -> None:
    async with cluster(pg) as c:
        c.forwarders["r1_2"].stall()
        try:
            began = time.monotonic()
            status, out, err = await inspect(
                c.url, "--probe", "--probe-timeout", PROBE_TIMEOUT, "--json"
            )
            took = time.monotonic() - began
        finally:
            c.forwarders["r1_2"].resume()
    assert status == 0, err
    document = json.loads(out)
    health = document["health"]
    # one round for all, then four more of the stalled instance alone: five misses in a row
    assert health["rounds"] == 5
    assert took >= 5 * float(PROBE_TIMEOUT)
    assert (health["ejections"], health["readmissions"], health["ejected"]) == (1, 0, 1)
    rows = health_rows(document)
    assert set(rows) == set(INSTANCES)
    stalled = rows["r1_2"]
    assert stalled["uuid"] == name_uuid("r1_2")
    assert stalled["address"] == c.forwarders["r1_2"].address
    # its first probe passed its deadline, the later ones could not even connect
    assert stalled["probe"] == "unreachable"
    assert stalled["probe_seconds"] is None
    assert stalled["state"] == "ejected"
    assert stalled["consecutive_failures"] == 5
    assert stalled["times_ejected"] == 1
    assert stalled["reason"] == "failures"
    # the client's first ejection lasts 1 s (HEALTH_POLICY.base_ejection)
    assert 0 < stalled["ejected_for"] <= 1.0
    for name in set(INSTANCES) - {"r1_2"}:
        row = rows[name]
        assert row["probe"] == "ok", row
        assert row["probe_seconds"] > 0
        assert (row["state"], row["consecutive_failures"], row["times_ejected"]) == (
            "healthy",
            0,
            0,
        )
        assert row["ejected_for"] == 0
        assert row["reason"] is None


async def test_the_table_shows_the_ejected_instance(pg: PgServer) -> None:
    async with cluster(pg) as c:
        c.forwarders["r2_2"].stall()
        try:
            status, out, err = await inspect(
                c.url, "--probe", "--probe-timeout", PROBE_TIMEOUT, "--plain"
            )
        finally:
            c.forwarders["r2_2"].resume()
    assert status == 0, err
    lines = out.splitlines()
    title = next(i for i, line in enumerate(lines) if line.startswith("instance health"))
    assert "1 ejected now, 1 ejection(s), 0 re-admission(s)" in lines[title]
    rows = {line.split()[0]: line.split() for line in lines[title + 2 :] if line.strip()}
    assert set(rows) == set(INSTANCES)
    # instance, uuid, address, probe, health, failures in a row, times ejected, ejected for
    # ("0.9 s"), ejected because
    assert rows["r2_2"][1:3] == [name_uuid("r2_2"), c.forwarders["r2_2"].address]
    assert rows["r2_2"][3:7] == ["unreachable", "ejected", "5", "1"]
    assert rows["r2_2"][8:] == ["s", "failures"]
    for name in set(INSTANCES) - {"r2_2"}:
        assert rows[name][3] == "ok"
        assert rows[name][6:] == ["healthy", "0", "0", "-", "-"]


async def test_a_healthy_cluster_takes_one_round_and_no_probe_no_health(pg: PgServer) -> None:
    async with cluster(pg) as c:
        status, out, err = await inspect(c.url, "--probe", "--json")
        assert status == 0, err
        document = json.loads(out)
        assert document["health"]["rounds"] == 1
        assert document["health"]["timeout"] == 1.0  # PROBE_TIMEOUT
        assert {row["state"] for row in document["health"]["instances"]} == {"healthy"}
        assert {row["probe"] for row in document["health"]["instances"]} == {"ok"}
        # each probe went through its instance's forwarder
        assert all(f.accepted >= 1 for f in c.forwarders.values())
        status, out, err = await inspect(c.url, "--json")
        assert status == 0, err
        assert "health" not in json.loads(out)


async def test_watch_shows_the_ejection_and_the_readmission(pg: PgServer) -> None:
    async with cluster(pg) as c:
        process = await asyncio.create_subprocess_exec(
            *SHARDLINE,
            "inspect",
            c.url,
            "--watch",
            "--interval",
            "0.05",
            "--probe",
            "--probe-timeout",
            PROBE_TIMEOUT,
            "--json",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        assert process.stdout is not None
        seen: list[dict[str, Any]] = []

        async def poll_until(what: str, condition: Any) -> dict[str, Any]:
            """The next poll's document that meets ``condition``."""
            assert process.stdout is not None
            deadline = time.monotonic() + WAIT
            while True:
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"no poll showed {what}"
                line = await asyncio.wait_for(process.stdout.readline(), remaining)
                assert line, f"the watch ended before a poll showed {what}"
                document: dict[str, Any] = json.loads(line)
                seen.append(document)
                if condition(document):
                    return document

        try:
            first = await poll_until("a probe of every instance", lambda d: d["health"])
            assert {row["state"] for row in first["health"]["instances"]} == {"healthy"}
            c.forwarders["r1_3"].stall()
            try:
                ejected = await poll_until(
                    "r1_3 ejected", lambda d: health_rows(d)["r1_3"]["state"] == "ejected"
                )
            finally:
                c.forwarders["r1_3"].resume()
            row = health_rows(ejected)["r1_3"]
            assert (row["consecutive_failures"], row["times_ejected"]) == (5, 1)
            assert ejected["health"]["ejections"] == 1
            assert ejected["changes"]["health"]["changed"] == [
                {"key": name_uuid("r1_3"), "fields": {"state": ["healthy", "ejected"]}}
            ]
            # its ejection passes, the next probe is its probe, and it is back
            back = await poll_until("r1_3 re-admitted", lambda d: d["health"]["readmissions"] == 1)
            row = health_rows(back)["r1_3"]
            assert row["state"] == "healthy"
            assert row["probe"] == "ok"
            assert row["times_ejected"] == 1  # remembered, decaying while it stays healthy
            assert back["health"]["ejected"] == 0
            # the polls in between: five misses in a row on the one client, never more
            failures = [health_rows(d)["r1_3"]["consecutive_failures"] for d in seen]
            assert max(failures) == 5
        finally:
            process.send_signal(signal.SIGINT)
            _, err = await asyncio.wait_for(process.communicate(), WAIT)
        assert process.returncode == 0, err.decode()


def test_probe_timeout_needs_probe(capsys: pytest.CaptureFixture[str]) -> None:
    from shardline.cli import main

    assert main(["inspect", "postgresql://u@127.0.0.1:1/db", "--probe-timeout", "1"]) == 2
    assert "--probe-timeout needs --probe" in capsys.readouterr().err


def test_no_health_when_the_client_cannot_start(
    catalog: Catalog, capsys: pytest.CaptureFixture[str]
) -> None:
    from shardline.cli import main

    catalog.add_tier("arbiter", 0)
    assert main(["inspect", catalog.dsn, "--tier", "arbiter", "--probe", "--json"]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out)["health"] is None
    assert "--probe: the Picodata client could not start" in err
    assert "'arbiter' has no buckets" in err
