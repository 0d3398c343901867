"""The Picodata client (``shardline.picodata``) against one real PostgreSQL.

The cluster is ``tests/support/forwarded_cluster.py``'s: the catalog stand-in in a schema of the
``pg`` server, each instance a TCP forwarder to that server, so a test sees which instance a
query went through, makes an instance unreachable or breaks its connections.
"""

from __future__ import annotations

import asyncio
import logging
import time

import asyncpg
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

from shardline import InstanceUnavailable, NoWorkersAvailable, PoolTimeout, bucket_id
from shardline.errors import InvalidArgument
from shardline.picodata import Client, PoolStats, ShardingKey, connect
from support import picodata_tables
from support.forwarded_cluster import (
    BUCKETS,
    Cluster,
    Forwarder,
    cluster,
    start_cluster,
    stop_cluster,
)
from support.pg_server import PASSWORD, PgServer, with_params
from support.picodata_catalog import name_uuid as _uuid
from support.waiting import until

pytestmark = pytest.mark.async_timeout(60)  # each async test, start to finish

WAIT = 10.0  # the most a pooled connection is waited for


async def noticed(db: Client, name: str) -> None:
    """Waits until the client's idle connections to the instance ``name`` (whose forwarder was
    stopped) are seen closed: a query sent on one before that would fail after sending."""
    idle = db._pools[_uuid(name)].idle
    await until(lambda: all(connection.is_closed() for connection in idle), f"{name} noticed")


def pool_of(db: Client, name: str) -> PoolStats:
    return db.stats().pools[_uuid(name)]


async def holding(pg: PgServer, lock: int) -> asyncpg.Connection:
    """A connection of the test's own holding the advisory lock ``lock``: a query that takes
    it shared waits on the server until it is released, or this connection closed."""
    holder = await asyncpg.connect(pg.dsn)
    await holder.execute(f"SELECT pg_advisory_lock({lock})")
    return holder


async def held_on_r2_1(
    c: Cluster, db: Client, lock: int
) -> tuple[asyncpg.Connection, asyncio.Future[str]]:
    """A keyed query on r2_1 in flight (its pool's connection in use), held on the server by
    the advisory lock ``lock``: the connection holding it, and the query."""
    holder = await holding(c.pg, lock)
    key = c.key_of("r2_1")
    query = asyncio.ensure_future(db.execute(f"SELECT pg_advisory_lock_shared({lock})", key=key))
    await until(lambda: pool_of(db, "r2_1").in_use == 1, "the query in flight")
    return holder, query


async def test_keyed_queries_run_on_the_master_owning_the_key(pg: PgServer) -> None:

    async with cluster(pg) as c, connect(c.url, tier="default") as db:
        keys = range(40)
        for key in keys:
            await db.execute("INSERT INTO landed VALUES ($1, inet_client_port())", key, key=key)
        rows = await db.fetch("SELECT id, port FROM landed ORDER BY id")
        assert [row["id"] for row in rows] == list(keys)
        landed = {row["id"]: c.instance_of(row["port"]) for row in rows}
        assert landed == {key: c.master_of(key) for key in keys}
        assert set(landed.values()) == {"r1_1", "r2_1"}  # both replicasets served some
        # fetchval and fetchrow go the same way
        for key in keys:
            port = await db.fetchval("SELECT inet_client_port()", key=key)
            assert c.instance_of(port) == c.master_of(key)
            row = await db.fetchrow("SELECT $1::bigint AS k, inet_client_port() AS p", key, key=key)
            assert row is not None
            assert (row["k"], c.instance_of(row["p"])) == (key, c.master_of(key))
        # the DSN's settings and the library's application_name reach every instance
        assert await db.fetchval("SHOW search_path", key=1) == c.catalog.schema
        assert await db.fetchval("SHOW application_name", key=1) == "shardline"
        stats = db.stats()
        assert stats.routed == {"keyed": 122, "read-only": 0, "unkeyed": 1}
        assert stats.fallbacks == {}
        assert stats.misses == {}
        assert stats.epochs["default"] == db.topology.epoch("default")
        assert stats.polls >= 1
        # connections were reused: at most pool_size per instance, nothing to a replica
        assert all(p.open <= 8 for p in stats.pools.values())
        assert c.forwarders["r1_2"].accepted + c.forwarders["r2_2"].accepted <= 1


async def test_buckets_moved_between_polls_move_later_queries(pg: PgServer) -> None:

    async with cluster(pg) as c, connect(c.url, tier="default") as db:
        key = 7
        before = c.master_of(key)
        assert c.instance_of(await db.fetchval("SELECT inet_client_port()", key=key)) == before
        with c.catalog.transaction():  # every bucket to the other replicaset
            other = "r2" if before == "r1_1" else "r1"
            c.catalog.set_weight("r1" if other == "r2" else "r2", 0)
            c.catalog.rebalance("default")
        assert c.master_of(key) == f"{other}_1"
        assert await db.refresh()
        port = await db.fetchval("SELECT inet_client_port()", key=key)
        assert c.instance_of(port) == f"{other}_1"


async def test_read_only_queries_spread_over_the_replicas_and_fail_over(pg: PgServer) -> None:

    async with cluster(pg) as c, connect(c.url, tier="default") as db:
        key = c.key_of("r1_1")

        async def read() -> str:
            return c.instance_of(
                await db.fetchval("SELECT inet_client_port()", key=key, read_only=True)
            )

        served = [await read() for _ in range(10)]
        assert set(served) == {"r1_2", "r1_3"}
        assert served.count("r1_2") == served.count("r1_3")  # in turn
        await c.forwarders["r1_2"].stop()
        await noticed(db, "r1_2")
        assert {await read() for _ in range(6)} == {"r1_3"}
        await c.forwarders["r1_3"].stop()
        await noticed(db, "r1_3")
        assert {await read() for _ in range(3)} == {"r1_1"}  # the master as a last resort
        stats = db.stats()
        assert stats.routed["read-only"] == 19
        assert stats.fallbacks == {}
        assert stats.unavailable == 0


async def test_a_write_never_goes_to_a_replica_when_the_master_is_down(pg: PgServer) -> None:

    async with cluster(pg) as c, connect(c.url, tier="default") as db:
        key = c.key_of("r1_1")
        await db.execute("SELECT 1", key=key)
        polls = db.stats().polls
        await c.forwarders["r1_1"].stop()
        await noticed(db, "r1_1")
        with pytest.raises(InstanceUnavailable) as raised:
            await db.execute("INSERT INTO landed VALUES ($1, 0)", key, key=key)
        message = str(raised.value)
        assert _uuid("r1_1") in message
        assert c.forwarders["r1_1"].address in message
        assert raised.value.instance == _uuid("r1_1")
        assert raised.value.address == c.forwarders["r1_1"].address
        stats = db.stats()
        assert stats.retries == 1
        assert stats.unavailable == 1
        assert stats.polls > polls  # the retry came after a refresh
        assert c.forwarders["r1_2"].accepted == c.forwarders["r1_3"].accepted == 0
        assert await db.fetchval("SELECT count(*) FROM landed") == 0
        # the instance comes back: the next write reaches it
        await c.forwarders["r1_1"].start()
        await db.execute("INSERT INTO landed VALUES ($1, inet_client_port())", key, key=key)
        port = await db.fetchval("SELECT port FROM landed")
        assert c.instance_of(port) == "r1_1"


async def test_an_error_after_the_query_was_sent_is_raised_as_is_and_triggers_a_poll(
    pg: PgServer,
) -> None:

    async with cluster(pg) as c, connect(c.url, tier="default") as db:
        lock, query = await held_on_r2_1(c, db, 11)
        await until(lambda: c.forwarders["r2_1"].open_links == 1, "the query's connection")
        attempts = db.stats().polls
        c.forwarders["r2_1"].drop()
        with pytest.raises(asyncpg.ConnectionDoesNotExistError):
            await query
        await lock.close()
        assert c.forwarders["r2_1"].accepted == 1  # not sent again
        stats = db.stats()
        assert stats.retries == 0
        assert stats.pools[_uuid("r2_1")].discarded == 1
        assert stats.pools[_uuid("r2_1")].open == 0
        await until(lambda: db.stats().polls > attempts, "the poll the failure asked for")


async def test_unkeyed_queries_go_to_every_online_instance_in_turn(pg: PgServer) -> None:

    async with cluster(pg) as c:
        c.catalog.set_state("r1_3", "Offline")
        async with connect(c.url, tier="default") as db:
            served = [
                c.instance_of(await db.fetchval("SELECT inet_client_port()")) for _ in range(12)
            ]
            assert {name: served.count(name) for name in set(served)} == {
                name: 3 for name in ("r1_1", "r1_2", "r2_1", "r2_2")
            }
            assert db.stats().routed == {"keyed": 0, "read-only": 0, "unkeyed": 12}


async def test_a_broken_idle_connection_is_discarded_and_replaced(pg: PgServer) -> None:

    async with cluster(pg) as c, connect(c.url, tier="default") as db:
        key = c.key_of("r2_1")
        await db.execute("SELECT 1", key=key)
        pool = db.stats().pools[_uuid("r2_1")]
        assert (pool.open, pool.idle) == (1, 1)
        c.forwarders["r2_1"].drop()
        idle = db._pools[_uuid("r2_1")].idle  # the test waits until the client can tell
        await until(lambda: idle[0].is_closed(), "the broken connection noticed")
        port = await db.fetchval("SELECT inet_client_port()", key=key)
        assert c.instance_of(port) == "r2_1"
        pool = db.stats().pools[_uuid("r2_1")]
        assert (pool.open, pool.idle, pool.discarded, pool.connects) == (1, 1, 1, 2)
        assert db.stats().retries == 0


async def test_a_connection_a_query_left_in_a_transaction_is_not_reused(pg: PgServer) -> None:

    async with cluster(pg) as c, connect(c.url, tier="default") as db:
        key = c.key_of("r2_1")
        port = await db.fetchval("SELECT inet_client_port()", key=key)
        assert await db.execute("BEGIN", key=key) == "BEGIN"  # on that idle connection
        pool = pool_of(db, "r2_1")
        assert (pool.queries, pool.discarded, pool.open, pool.idle) == (2, 1, 0, 0)
        assert await db.fetchval("SELECT inet_client_port()", key=key) != port
        assert pool_of(db, "r2_1").connects == 2


async def test_a_key_without_a_route_falls_back_after_a_poll_or_raises_when_strict(
    pg: PgServer, caplog: pytest.LogCaptureFixture
) -> None:

    async with cluster(pg) as c:
        c.catalog.set_buckets("default", [(1, 100, _uuid("r1"))])  # 101.. unowned
        key = next(k for k in range(1000) if bucket_id(k, BUCKETS) > 100)
        bucket = bucket_id(key, BUCKETS)
        async with connect(c.url, tier="default", route_wait=0.5) as db:
            polls = db.stats().polls
            with caplog.at_level(logging.WARNING, logger="shardline.picodata"):
                for _ in range(3):
                    await db.execute("SELECT 1", key=key)
            stats = db.stats()
            assert stats.misses == {"no-range": 3}
            assert stats.fallbacks == {"no-range": 3}
            assert stats.routed["keyed"] == 3
            assert stats.polls >= polls + 3  # each miss waited for a poll
            warnings = [r for r in caplog.records if r.name == "shardline.picodata"]
            assert len(warnings) == 1  # rate-limited
            assert str(bucket) in warnings[0].getMessage()
            with pytest.raises(NoWorkersAvailable) as raised:
                await db.execute("SELECT 1", key=key, strict=True)
            assert f"bucket {bucket} of tier 'default'" in str(raised.value)
            assert "no range" in str(raised.value)
            explained = db.explain(key)
            assert (explained.bucket, explained.range, explained.routable) == (
                bucket,
                None,
                False,
            )
            assert explained.reason == "no-range"
            # the topology's explanation, not a second one: same reason, same sentence
            core = db.topology.explain("default", key)
            assert (core.reason, core.bucket) == ("no-range", bucket)
            assert explained.route is not None
            assert explained.route.detail == core.detail
            assert explained.detail == core.detail
            assert str(explained).splitlines()[:2] == [
                f"tier 'default', bucket {bucket}: not routable (no-range)",
                f"  {core.detail}",
            ]
        async with connect(c.url, tier="default", route_wait=0.5, strict=True) as db:
            with pytest.raises(NoWorkersAvailable):
                await db.execute("SELECT 1", key=key)
            assert db.stats().fallbacks == {}
            # the catalog fills the gap: the next query routes without a fallback
            c.catalog.set_buckets("default", [(1, 100, _uuid("r1")), (101, BUCKETS, _uuid("r2"))])
            port = await db.fetchval("SELECT inet_client_port()", key=key)
            assert c.instance_of(port) == "r2_1"


async def test_a_master_not_online_is_a_miss_with_its_reason(pg: PgServer) -> None:

    async with cluster(pg) as c:
        c.catalog.set_state("r2_1", "Offline")
        key = c.key_of("r2_1")
        async with connect(c.url, tier="default", route_wait=0.2, strict=True) as db:
            with pytest.raises(NoWorkersAvailable, match="master-not-online"):
                await db.execute("SELECT 1", key=key)
            explained = db.explain(key)
            assert explained.master == _uuid("r2_1")
            assert explained.state == "Offline"
            assert explained.address == c.forwarders["r2_1"].address
            assert explained.reason == "master-not-online"
            # the topology routes to the master whatever its state; the client says why not
            assert explained.route is not None
            assert explained.route.reason is None
            assert "in state 'Offline' (not Online" in explained.detail
            assert str(explained).startswith(
                f"tier 'default', bucket {explained.bucket}: not routable (master-not-online)\n"
            )
            # reads still reach the online replica
            port = await db.fetchval("SELECT inet_client_port()", key=key, read_only=True)
            assert c.instance_of(port) == "r2_2"


async def test_explain_names_the_bucket_range_replicaset_and_master(pg: PgServer) -> None:

    async with cluster(pg) as c, connect(c.url, tier="default") as db:
        key = 42
        expected = c.catalog.expected()
        bucket = bucket_id(key, BUCKETS)
        ((start, end, owner),) = [r for r in expected.maps["default"] if r[0] <= bucket <= r[1]]
        explained = db.explain(key)
        assert explained.tier == "default"
        assert (explained.bucket, explained.range, explained.replicaset) == (
            bucket,
            (start, end),
            owner,
        )
        assert explained.master == expected.replicasets[owner][1]
        assert explained.address == c.forwarders[c.master_of(key)].address
        assert (explained.state, explained.routable, explained.reason) == (
            "Online",
            True,
            None,
        )
        assert explained.epoch == db.topology.epoch("default")
        assert explained.master_name == c.master_of(key)  # the catalog's names
        assert explained.replicaset_name == c.master_of(key)[:2]
        assert explained.range_set_by == "poll"
        assert explained.range_epoch is not None
        assert explained.range_epoch <= explained.epoch
        assert explained.range_set_at is not None
        assert explained.range_set_at <= time.time()
        assert explained.detail == db.topology.explain("default", key).detail
        lines = str(explained).splitlines()
        assert lines[0] == f"tier 'default', bucket {bucket}: routable"
        assert f"whose master '{c.master_of(key)}'" in lines[1]
        assert lines[-1] == f"  tier map epoch {explained.epoch}"


async def test_the_pool_bound_makes_a_query_wait_and_never_go_elsewhere(pg: PgServer) -> None:

    async with cluster(pg) as c:
        key = c.key_of("r2_1")
        lock = await holding(pg, 12)
        async with connect(c.url, tier="default", pool_size=2, acquire_timeout=WAIT) as db:
            queries = [
                asyncio.ensure_future(
                    db.fetchval(
                        "SELECT pg_advisory_lock_shared(12), inet_client_port()",
                        key=key,
                        column=1,
                    )
                )
                for _ in range(3)
            ]
            await until(
                lambda: (pool_of(db, "r2_1").waits, pool_of(db, "r2_1").in_use) == (1, 2),
                "two queries running and the third waiting",
            )
            pool = db.stats().pools[_uuid("r2_1")]
            assert (pool.open, pool.in_use, pool.idle) == (2, 2, 0)
            await lock.execute("SELECT pg_advisory_unlock(12)")
            ports = await asyncio.gather(*queries)
            assert {c.instance_of(port) for port in ports} == {"r2_1"}
            assert len(set(ports)) == 2  # the third reused a connection
            assert c.forwarders["r2_2"].accepted == 0
        await lock.execute("SELECT pg_advisory_lock(12)")
        async with connect(c.url, tier="default", pool_size=1, acquire_timeout=0.2) as db:
            first = asyncio.ensure_future(db.execute("SELECT pg_advisory_lock_shared(12)", key=key))
            await until(lambda: db.stats().pools[_uuid("r2_1")].in_use == 1, "the first")
            with pytest.raises(PoolTimeout, match=r"acquire_timeout=0\.2"):
                await db.execute("SELECT 1", key=key)
            assert db.stats().pools[_uuid("r2_1")].timeouts == 1
            assert c.forwarders["r2_2"].accepted == 0
            await lock.execute("SELECT pg_advisory_unlock(12)")
            await first
        await lock.close()


async def test_close_waits_for_the_queries_in_flight(pg: PgServer) -> None:

    async with cluster(pg) as c:
        key = 3
        lock = await holding(pg, 13)
        db = await connect(c.url, tier="default")
        query = asyncio.ensure_future(
            db.fetchval("SELECT pg_advisory_lock_shared(13)::text", key=key)
        )
        await until(lambda: sum(p.in_use for p in db.stats().pools.values()) == 1, "query")
        closing = asyncio.ensure_future(db.close())
        for _ in range(20):  # let close run as far as it can
            await asyncio.sleep(0)
        assert not closing.done()
        with pytest.raises(RuntimeError, match="closed"):
            await db.execute("SELECT 1", key=key)
        await lock.execute("SELECT pg_advisory_unlock(13)")
        assert await query == ""
        await closing
        await lock.close()
        await until(
            lambda: sum(f.open_links for f in c.forwarders.values()) == 0, "connections closed"
        )


async def test_pools_of_instances_that_left_or_moved_are_closed_after_their_queries(
    pg: PgServer,
) -> None:

    async with cluster(pg) as c, connect(c.url, tier="default") as db:
        key = c.key_of("r2_1")
        lock, query = await held_on_r2_1(c, db, 14)
        moved = Forwarder(pg.port)
        await moved.start()
        c.catalog.set_address("r2_1", moved.address)
        await db.refresh()
        assert c.forwarders["r2_1"].open_links == 1  # still serving the query
        await lock.execute("SELECT pg_advisory_unlock(14)")
        await query
        await until(lambda: c.forwarders["r2_1"].open_links == 0, "the old pool closed")
        port = await db.fetchval("SELECT inet_client_port()", key=key)
        assert port in moved.upstream_ports  # the new address
        # an instance that left: its pool goes once idle
        await db.fetchval("SELECT 1", key=key, read_only=True)
        assert c.forwarders["r2_2"].open_links == 1
        c.catalog.expel_instance("r2_2")
        await db.refresh()
        await until(lambda: c.forwarders["r2_2"].open_links == 0, "the pool of r2_2 closed")
        assert _uuid("r2_2") not in db.stats().pools
        await moved.stop()
        await lock.close()


def test_starting_with_an_instance_down_works(pg: PgServer) -> None:
    async def main() -> None:
        async with cluster(pg) as c:
            await c.forwarders["r1_1"].stop()
            async with connect(c.url, tier="default") as db:
                key = c.key_of("r2_1")
                assert await db.fetchval("SELECT 1", key=key) == 1
                for _ in range(5):  # unkeyed: any reachable instance
                    assert await db.fetchval("SELECT 2") == 2
                down = c.key_of("r1_1")
                with pytest.raises(InstanceUnavailable):
                    await db.execute("SELECT 1", key=down)
                await c.forwarders["r1_1"].start()
                assert await db.fetchval("SELECT 3", key=down) == 3


async def test_an_unreachable_instance_is_dialled_again_in_the_background(pg: PgServer) -> None:

    async with cluster(pg) as c:
        await c.forwarders["r1_1"].stop()
        async with connect(c.url, tier="default", poll_interval=0.05) as db:
            down = c.key_of("r1_1")
            with pytest.raises(InstanceUnavailable):
                await db.execute("SELECT 1", key=down)
            assert pool_of(db, "r1_1").down
            await c.forwarders["r1_1"].start()
            # no query asks for it: the client's background task reconnects
            await until(lambda: pool_of(db, "r1_1").idle == 1, "a background reconnect")
            assert not pool_of(db, "r1_1").down
            assert c.forwarders["r1_1"].accepted == 1
            assert c.instance_of(await db.fetchval("SELECT inet_client_port()", key=down)) == "r1_1"
            assert c.forwarders["r1_1"].accepted == 1  # the query used that connection


async def test_timeout_and_driver_options_reach_asyncpg(pg: PgServer) -> None:
    class Row(asyncpg.Record):
        pass

    async with cluster(pg) as c, connect(c.url, tier="default") as db:
        key = c.key_of("r2_1")
        with pytest.raises(asyncio.TimeoutError):
            await db.execute("SELECT pg_sleep(5)", key=key, timeout=0.1)
        row = await db.fetchrow("SELECT $1::bigint AS n", 7, key=key, record_class=Row)
        assert type(row) is Row
        assert row["n"] == 7
        plain = await db.fetchrow("SELECT $1::bigint AS n", 8, key=key)
        assert type(plain) is asyncpg.Record
        assert plain["n"] == 8
        assert await db.fetchval("SELECT 1, 2", key=key, column=1) == 2


async def test_wrong_password_is_a_clear_error(pg: PgServer) -> None:

    async with cluster(pg) as c:
        url = c.url.replace(f":{PASSWORD}@", ":wrong@")
        with pytest.raises(InstanceUnavailable) as raised:
            await connect(url, tier="default")
        message = str(raised.value)
        assert f"127.0.0.1:{pg.port}" in message
        assert "password authentication failed" in message
        assert "wrong" not in message  # the password is never shown


async def test_a_refused_tls_handshake_is_a_clear_error(pg: PgServer) -> None:

    async with cluster(pg) as c:  # the server runs without TLS
        with pytest.raises(InstanceUnavailable) as raised:
            await connect(with_params(c.url, sslmode="require"), tier="default")
        message = str(raised.value)
        assert f"127.0.0.1:{pg.port}" in message
        assert "SSL" in message


async def test_an_unknown_tier_and_bad_arguments_are_refused(pg: PgServer) -> None:
    from shardline import UnknownTier

    async with cluster(pg) as c:
        with pytest.raises(UnknownTier, match="'nope'"):
            await connect(c.url, tier="nope")
    # several hosts (tried in turn for the catalog) are accepted
    connect("postgresql://u:p@127.0.0.1:1,127.0.0.1:2/db", tier="default")
    with pytest.raises(ValueError, match="postgresql:// or postgres:// URI"):
        connect("host=127.0.0.1 password=secret", tier="default")
    with pytest.raises(ValueError, match="pool_size"):
        connect("postgresql://127.0.0.1/", tier="default", pool_size=0)
    with pytest.raises(ValueError, match="connect_kwargs must not set host"):
        connect("postgresql://127.0.0.1/", tier="default", connect_kwargs={"host": "x"})
    with pytest.raises(ValueError, match=r"asyncpg\.connect does not take: nope"):
        connect("postgresql://127.0.0.1/", tier="default", connect_kwargs={"nope": 1})
    # a wrong type is also a TypeError; a wrong value of the right type is not
    from shardline.errors import InvalidArgumentType

    for wrong_type in ({"tier": 1}, {"strict": "yes"}, {"query_metadata": 1}, {"pool_size": "2"}):
        with pytest.raises(InvalidArgumentType, match=next(iter(wrong_type))):
            connect("postgresql://127.0.0.1/", **wrong_type)
    with pytest.raises(ValueError, match="tier must be a non-empty str") as caught:
        connect("postgresql://127.0.0.1/", tier="")
    assert not isinstance(caught.value, TypeError)


def test_routed_queries_follow_catalog_histories(pg: PgServer) -> None:
    """Every keyed query, after any history of bucket moves, master switches and instance
    states, runs where the catalog's rows say (a reference computed with the catalog's own
    SQL), or raises NoWorkersAvailable (strict) when they give the key no online master."""
    names = {"r1": ("r1_1", "r1_2", "r1_3"), "r2": ("r2_1", "r2_2")}

    class Histories(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.loop = asyncio.new_event_loop()
            self.c = self.loop.run_until_complete(start_cluster(pg))
            self.db = self.loop.run_until_complete(
                connect(self.c.url, tier="default", route_wait=0.05, strict=True)
            )

        def teardown(self) -> None:
            self.loop.run_until_complete(self.db.close())
            self.loop.run_until_complete(stop_cluster(self.c))
            self.loop.close()

        def refreshed(self) -> None:
            assert self.loop.run_until_complete(self.db.refresh())

        @rule(split=st.integers(0, BUCKETS), first=st.sampled_from(["r1", "r2"]), gap=st.booleans())
        def move_buckets(self, split: int, first: str, gap: bool) -> None:
            second = "r2" if first == "r1" else "r1"
            ranges = []
            if split >= 1:
                ranges.append((1, split, _uuid(first)))
            if split < BUCKETS and not gap:
                ranges.append((split + 1, BUCKETS, _uuid(second)))
            self.c.catalog.set_buckets("default", ranges)
            self.refreshed()

        @rule(data=st.data())
        def switch_master(self, data: st.DataObject) -> None:
            replicaset = data.draw(st.sampled_from(sorted(names)))
            self.c.catalog.switch_master(replicaset, data.draw(st.sampled_from(names[replicaset])))
            self.refreshed()

        @rule(
            instance=st.sampled_from(sorted(n for ns in names.values() for n in ns)),
            online=st.booleans(),
        )
        def set_state(self, instance: str, online: bool) -> None:
            self.c.catalog.set_state(instance, "Online" if online else "Offline")
            self.refreshed()

        @rule(key=st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8))
        def keyed_query(self, key: object) -> None:
            expected = self.c.catalog.expected()
            bucket = bucket_id(key, BUCKETS)
            owners = [o for s, e, o in expected.maps["default"] if s <= bucket <= e]
            master = expected.replicasets[owners[0]][1] if owners else None
            state = expected.instances[master][1] if master is not None else None

            async def query() -> int:
                port: int = await self.db.fetchval("SELECT inet_client_port()", key=key)
                return port

            if state == "Online":
                port = self.loop.run_until_complete(query())
                assert _uuid(self.c.instance_of(port)) == master
            else:
                with pytest.raises(NoWorkersAvailable, match=f"bucket {bucket} of tier"):
                    self.loop.run_until_complete(query())

        @rule(key=st.integers(-(2**63), 2**63 - 1))
        def read_only_query(self, key: int) -> None:
            expected = self.c.catalog.expected()
            bucket = bucket_id(key, BUCKETS)
            owners = [o for s, e, o in expected.maps["default"] if s <= bucket <= e]
            master = expected.replicasets[owners[0]][1] if owners else None
            online = {
                uuid
                for uuid, (rs, state, _) in expected.instances.items()
                if owners and rs == owners[0] and state == "Online"
            }
            replicas = online - {master}
            allowed = replicas or online

            async def query() -> int:
                port: int = await self.db.fetchval(
                    "SELECT inet_client_port()", key=key, read_only=True
                )
                return port

            if allowed:
                port = self.loop.run_until_complete(query())
                assert _uuid(self.c.instance_of(port)) in allowed
            else:
                with pytest.raises(NoWorkersAvailable):
                    self.loop.run_until_complete(query())

    run_state_machine_as_test(Histories, settings=settings(max_examples=20, stateful_step_count=12))


async def test_key_for_reads_the_tables_once_and_again_for_an_unknown_one(pg: PgServer) -> None:

    async with cluster(pg) as c:
        tables = c.catalog.connection
        picodata_tables.install(tables)
        picodata_tables.add_sharded(tables, "users", ["id"], fields=["id", "name"])
        picodata_tables.add_global(tables, "settings", ["k", "v"])
        async with connect(c.url, tier="default") as db:
            key = await db.key_for("users", {"id": 7, "name": "x"})
            assert key == ShardingKey(table="users", tier="default", values=(7,))
            port = await db.fetchval("SELECT inet_client_port()", key=key)
            assert c.instance_of(port) == c.master_of(7)
            assert db.explain(key).bucket == bucket_id(7, BUCKETS)
            # read once: a row gone from _pico_table since is still known
            tables.execute("DELETE FROM _pico_table WHERE name = 'users'")
            assert await db.key_for("users", {"id": 8}) == ShardingKey("users", "default", (8,))
            # a table created since is read on its first use
            picodata_tables.add_sharded(
                tables, "orders", ["user_id", "id"], fields=["id", "user_id"]
            )
            orders = await db.key_for("orders", {"id": 1, "user_id": 2, "note": "?"})
            assert orders.values == (2, 1)
            with pytest.raises(InvalidArgument, match="'nope' is not in _pico_table"):
                await db.key_for("nope", {"id": 1})
            with pytest.raises(InvalidArgument, match="global"):
                await db.key_for("settings", {"k": 1})
            with pytest.raises(InvalidArgument, match="lacks sharding key field 'user_id'"):
                await db.key_for("orders", {"id": 1})


async def test_pool_stats_count_the_queries_each_instance_ran(pg: PgServer) -> None:

    async with cluster(pg) as c, connect(c.url, tier="default") as db:
        keys = [key for key in range(40) if c.master_of(key) == "r2_1"][:5]
        assert len(keys) == 5
        for n, key in enumerate(keys, 1):
            assert await db.fetchval("SELECT $1::bigint", key, key=key) == key
            assert pool_of(db, "r2_1").queries == n
        # a failed query ran too
        with pytest.raises(asyncpg.PostgresError):
            await db.execute("SELECT 1/0", key=keys[0])
        assert pool_of(db, "r2_1").queries == 6
        others = {
            name: stats.queries
            for uuid, stats in db.stats().pools.items()
            for name in c.forwarders
            if _uuid(name) == uuid and name != "r2_1"
        }
        assert set(others) == {"r1_1", "r1_2", "r1_3", "r2_2"}
        assert set(others.values()) == {0}
