"""The Picodata client's deadlines and the passive health of its instances, against one real
PostgreSQL behind ``tests/support/forwarded_cluster.py``'s forwarders: a stalled instance is a
forwarder that accepts and stops forwarding (the server behind it never hears the query)."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time

import pytest

from shardline import DeadlineExceeded, ShardlineError
from shardline.picodata import Client, connect
from shardline.picodata.client import DEFAULT_TIMEOUT
from support.forwarded_cluster import cluster
from support.pg_server import PgServer
from support.picodata_catalog import name_uuid as _uuid
from support.waiting import until

pytestmark = pytest.mark.async_timeout(60)

WAIT = 10.0  # the most an ejection or a re-admission is waited for


def state_of(db: Client, name: str) -> str | None:
    health = db.stats().pools[_uuid(name)].health
    return None if health is None else health.state


async def test_reads_move_off_a_stalled_replica_and_come_back_after_its_probe(
    pg: PgServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="shardline.picodata")
    async with (
        cluster(pg) as c,
        connect(c.url, tier="default", timeout=0.2, acquire_timeout=0.3) as db,
    ):
        key = c.key_of("r1_1")

        async def read() -> str:
            return c.instance_of(
                await db.fetchval("SELECT inet_client_port()", key=key, read_only=True)
            )

        assert {await read() for _ in range(4)} == {"r1_2", "r1_3"}
        c.forwarders["r1_2"].stall()
        try:
            missed: list[DeadlineExceeded] = []
            started = time.monotonic()
            while db.stats().ejected == 0:  # each read to r1_2 fails: its deadline, a connect
                assert time.monotonic() - started < WAIT, "r1_2 never ejected"
                try:
                    assert await read() != "r1_2"
                except DeadlineExceeded as error:
                    missed.append(error)
            # the sequential reads had one connection to r1_2: its query passed the default
            # deadline, every later attempt to open one timed out
            assert len(missed) == 1
            assert missed[0].address == c.forwarders["r1_2"].address
            assert missed[0].may_have_run
            assert missed[0].timeout == 0.2
            stats = db.stats()
            assert (stats.ejections, stats.readmissions, stats.ejected) == (1, 0, 1)
            assert stats.deadlines == 1
            health = stats.pools[_uuid("r1_2")].health
            assert health is not None
            assert (health.state, health.reason) == ("ejected", "failures")
            assert health.consecutive_failures == 5
            assert db.explain(key).ejected == (_uuid("r1_2"),)
            assert "r1_2" in caplog.text
            assert "ejected for reads" in caplog.text
            # reads skip it: the other replica serves them all, at once
            assert {await read() for _ in range(10)} == {"r1_3"}
        finally:
            c.forwarders["r1_2"].resume()
        # once its ejection has passed and the client dialled it again, a read is its probe
        served: set[str] = set()
        started = time.monotonic()
        while db.stats().readmissions == 0:
            assert time.monotonic() - started < WAIT, "r1_2 never re-admitted"
            served.add(await read())
            await asyncio.sleep(0.01)
        assert "r1_2" in served
        assert db.stats().ejected == 0
        assert db.explain(key).ejected == ()
        assert state_of(db, "r1_2") == "healthy"
        assert "re-admitted for reads" in caplog.text
        assert {await read() for _ in range(4)} == {"r1_2", "r1_3"}


async def test_a_keyed_write_to_a_stalled_master_raises_at_its_deadline_and_polls(
    pg: PgServer,
) -> None:
    # no poll but the ones the client triggers
    async with (
        cluster(pg) as c,
        connect(c.url, tier="default", timeout=0.3, poll_interval=60) as db,
    ):
        key = c.key_of("r1_1")
        # two connections to the master, both idle
        await asyncio.gather(*(db.execute("SELECT pg_sleep(0.05)", key=key) for _ in range(2)))
        assert db.stats().pools[_uuid("r1_1")].idle == 2
        replicas = c.forwarders["r1_2"].accepted + c.forwarders["r1_3"].accepted
        c.forwarders["r1_1"].stall()
        try:
            polls = db.stats().polls
            began = time.monotonic()
            with pytest.raises(DeadlineExceeded) as raised:
                await db.execute("INSERT INTO landed VALUES ($1, 0)", key, key=key, timeout=0.5)
            took = time.monotonic() - began
            assert 0.5 <= took < 2.0
            error = raised.value
            assert isinstance(error, TimeoutError)
            assert isinstance(error, ShardlineError)
            assert error.may_have_run
            assert error.timeout == 0.5
            assert error.address == c.forwarders["r1_1"].address
            assert error.tried == ((_uuid("r1_1"), c.forwarders["r1_1"].address, "deadline"),)
            assert "r1_1" in str(error)
            assert "poll" in str(error)
            await until(lambda: db.stats().polls > polls, "the poll the deadline triggered")
            # without timeout=, the client's default deadline (0.3 s, swept in 0.03 s steps)
            polls = db.stats().polls
            began = time.monotonic()
            with pytest.raises(DeadlineExceeded) as raised:
                await db.execute("INSERT INTO landed VALUES ($1, 0)", key, key=key)
            took = time.monotonic() - began
            assert 0.3 <= took < 1.5
            assert raised.value.timeout == 0.3
            await until(lambda: db.stats().polls > polls, "the poll the deadline triggered")
            assert db.stats().deadlines == 2
        finally:
            c.forwarders["r1_1"].resume()
        # never sent to a replica meanwhile; the master serves writes again
        assert c.forwarders["r1_2"].accepted + c.forwarders["r1_3"].accepted == replicas
        await db.execute("INSERT INTO landed VALUES ($1, 1)", key, key=key)
        assert await db.fetchval("SELECT count(*) FROM landed WHERE port = 1") == 1


async def test_the_default_deadline_bounds_a_query_made_without_timeout(pg: PgServer) -> None:
    assert inspect.signature(connect).parameters["timeout"].default == DEFAULT_TIMEOUT == 5.0
    async with cluster(pg) as c, connect(c.url, tier="default", timeout=0.3) as db:
        for key in (c.key_of("r1_1"), c.key_of("r2_1")):
            began = time.monotonic()
            with pytest.raises(DeadlineExceeded) as raised:
                await db.fetchval("SELECT pg_sleep(10)", key=key)
            assert 0.3 <= time.monotonic() - began < 1.5
            assert raised.value.timeout == 0.3
            # timeout= overrides it, either way
            assert await db.fetchval("SELECT pg_sleep(0.5)::text", key=key, timeout=2.0) == ""
            with pytest.raises(DeadlineExceeded):
                await db.fetchval("SELECT pg_sleep(10)", key=key, timeout=0.1)
        # unkeyed queries too
        with pytest.raises(DeadlineExceeded):
            await db.execute("SELECT pg_sleep(10)")
        # a healthy instance's queries that passed their deadline: counted, no ejection yet
        stats = db.stats()
        assert stats.deadlines == 5
        assert stats.ejections == 0


async def test_sql_errors_are_answers_not_failures(pg: PgServer) -> None:
    async with cluster(pg) as c, connect(c.url, tier="default") as db:
        key = c.key_of("r1_1")
        for _ in range(12):
            with pytest.raises(Exception, match="division by zero"):
                await db.fetchval("SELECT 1 / 0", key=key)
            with pytest.raises(Exception, match="division by zero"):
                await db.fetchval("SELECT 1 / 0", key=key, read_only=True)
        stats = db.stats()
        assert (stats.ejections, stats.ejected, stats.deadlines) == (0, 0, 0)
        for name in ("r1_1", "r1_2", "r1_3"):
            health = stats.pools[_uuid(name)].health
            assert health is not None
            assert (health.state, health.consecutive_failures) == ("healthy", 0)


@pytest.mark.parametrize("timeout", [0, -1.0, float("inf"), float("nan"), "1", True])
def test_a_bad_default_deadline_is_refused(timeout: object) -> None:
    with pytest.raises(ValueError, match="timeout"):
        connect("postgresql://u@127.0.0.1:1/db", tier="default", timeout=timeout)  # type: ignore[arg-type]
