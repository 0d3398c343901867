"""Routing from Picodata's query metadata (issue 27, item 1) and stale statements (item 2).

The cluster is ``tests/support/pgproto_standin.py``'s: each instance a pgwire proxy in front of
one PostgreSQL that answers a Parse with Picodata's PreparedStatementMetadata NOTICE and a
stale statement's Bind with SQLSTATE 42999; the server sees each proxy's upstream port as
``inet_client_port()``, so a row of ``landed`` says which instance ran its INSERT.
"""

from __future__ import annotations

import asyncpg
import pytest

from shardline.picodata import connect
from support.forwarded_cluster import Cluster
from support.pg_server import PgServer
from support.pgproto_standin import PgprotoProxy, standin

pytestmark = pytest.mark.async_timeout(60)

INSERT = "INSERT INTO landed (id, port) VALUES ($1, inet_client_port())"


def landed(c: Cluster) -> dict[int, list[str]]:
    """Each id of ``landed``, with the instances that ran its INSERT."""
    rows = c.catalog.connection.execute("SELECT id, port FROM landed ORDER BY id").fetchall()
    found: dict[int, list[str]] = {}
    for key, port in rows:
        found.setdefault(key, []).append(c.instance_of(port))
    return found


def proxies(c: Cluster) -> list[PgprotoProxy]:
    return [p for p in c.forwarders.values() if isinstance(p, PgprotoProxy)]


async def test_an_insert_without_a_key_runs_on_the_master_owning_its_key(pg: PgServer) -> None:
    async with standin(pg) as c, connect(c.url) as db:
        keys = range(40)
        for key in keys:
            await db.execute(INSERT, key)  # no key=: the statement's metadata names $1
        assert landed(c) == {key: [c.master_of(key)] for key in keys}
        assert {c.master_of(key) for key in keys} == {"r1_1", "r2_1"}
        stats = db.stats()
        assert stats.from_metadata == 40
        assert stats.routed == {"keyed": 40, "read-only": 0, "unkeyed": 0}
        assert stats.fallbacks == {}
        # learned once: one Parse to learn, then one per connection that ran it
        opened = sum(pool.connects for pool in stats.pools.values())
        assert sum(p.parses for p in proxies(c)) <= 1 + opened
        # key= wins over the metadata
        other = next(k for k in range(100, 200) if c.master_of(k) != c.master_of(1000))
        await db.execute(INSERT, 1000, key=other)
        assert landed(c)[1000] == [c.master_of(other)]
        assert db.stats().from_metadata == 40
        # a statement whose metadata names no parameter is unkeyed: the client's tier in turn
        for _ in range(10):
            await db.fetchval("SELECT count(*) FROM landed WHERE id = $1", 1)
        assert db.stats().routed["unkeyed"] == 10
        assert db.stats().from_metadata == 40


async def test_metadata_is_asked_for_only_when_on_or_when_picodata_has_it(pg: PgServer) -> None:
    async with standin(pg) as c:
        async with connect(c.url, query_metadata=False) as db:
            for key in range(20):
                await db.execute(INSERT, key)
            assert db.stats().from_metadata == 0
            assert db.stats().routed["unkeyed"] == 20
            assert not any(s.metadata for p in proxies(c) for s in p.sessions)
        # instances before 26.1 (the stand-in catalog's default version): not asked for
        c.catalog.set_raw("_pico_instance", "picodata_version", "25.5.0", "name", "r2_2")
        async with connect(c.url) as db:
            await db.execute(INSERT, 99)
            assert db.stats().from_metadata == 0
            assert not any(s.metadata or s.invalidation for p in proxies(c) for s in p.sessions)
        async with connect(c.url, query_metadata=True) as db:
            await db.execute(INSERT, 100)
            assert db.stats().from_metadata == 1
            assert landed(c)[100] == [c.master_of(100)]


async def test_a_stale_statement_is_prepared_again_and_run_once(pg: PgServer) -> None:
    async with standin(pg) as c, connect(c.url) as db:
        for key in range(10):
            await db.execute(INSERT, key)
        for proxy in proxies(c):
            proxy.invalidate()  # a DDL: every statement prepared so far is stale
        for key in range(10, 20):
            await db.execute(INSERT, key)
        assert landed(c) == {key: [c.master_of(key)] for key in range(20)}  # each once
        stats = db.stats()
        stale = sum(p.stale_refused for p in proxies(c))
        assert stale >= 1
        assert stats.reprepared == stale
        assert stats.from_metadata == 20 + stale  # a query sent again counts again
        # a second 42999 for the same query is the caller's: a statement is re-prepared once
        proxy = c.forwarders[c.master_of(30)]
        assert isinstance(proxy, PgprotoProxy)
        proxy.invalidate_always = True
        with pytest.raises(asyncpg.PostgresError) as raised:
            await db.execute(INSERT, 30)
        assert raised.value.sqlstate == "42999"
        assert 30 not in landed(c)
