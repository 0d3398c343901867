"""The Picodata client's pipelined ``execute`` (``connect(pipeline=True)``,
``shardline/picodata/pipeline.py``) against a real PostgreSQL, through the forwarded cluster of
``tests/support/forwarded_cluster.py`` (which instance a query went through, broken and stalled
connections)."""

from __future__ import annotations

import asyncio
import collections
import os
import signal
from typing import Any

import asyncpg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardline.errors import DeadlineExceeded, InvalidArgumentType
from shardline.picodata import Client, connect
from shardline.picodata.pipeline import Pipeline
from support.forwarded_cluster import Cluster, cluster, start_cluster, stop_cluster
from support.pg_server import PgServer
from support.picodata_catalog import name_uuid as _uuid
from support.waiting import until

pytestmark = pytest.mark.async_timeout(60)

INSERT = "INSERT INTO landed VALUES ($1, inet_client_port())"
LOCK = 11


async def pipelined(db: Client, c: Cluster, master: str) -> Pipeline:
    """``master``'s pipeline, opened by a first query (which itself goes pooled)."""
    key = next(k for k in range(1000) if c.master_of(k) == master)
    await db.execute("SELECT $1::bigint", key, key=key)
    pool = db._pools[_uuid(master)]
    await until(lambda: pool.pipeline is not None and not pool.pipeline.closed, "the pipeline")
    assert pool.pipeline is not None
    return pool.pipeline


def keys_of(c: Cluster, master: str, n: int, start: int = 0) -> list[int]:
    return [k for k in range(start, start + 100 * n) if c.master_of(k) == master][:n]


HELD = "SELECT pg_advisory_xact_lock_shared($1)"


async def held(db: Client, c: Cluster, key: int) -> tuple[asyncpg.Connection, asyncio.Future[Any]]:
    """A pipelined query on ``key``'s master waiting for the advisory lock ``LOCK``, which the
    connection returned holds until closed. The statement is prepared first, so that the
    query is sent at once (a query whose statement is being prepared waits for that)."""
    assert await db.execute(HELD, LOCK, key=key) == "SELECT 1"
    lock = await asyncpg.connect(c.url)
    await lock.execute("SELECT pg_advisory_lock($1)", LOCK)
    return lock, asyncio.ensure_future(db.execute(HELD, LOCK, key=key))


async def test_one_write_carries_the_callers_queries_in_order_each_on_its_master(
    pg: PgServer,
) -> None:
    # pipelines as long as the callers (the pool's size), so that every query is pipelined
    async with (
        cluster(pg) as c,
        connect(c.url, tier="default", pipeline=True, pool_size=64) as db,
    ):
        pipelines = [await pipelined(db, c, master) for master in ("r1_1", "r2_1")]
        await db.execute("CREATE TABLE queue (n bigserial, id bigint)")  # no args: pooled
        keys = list(range(40))
        statuses = await asyncio.gather(*(db.execute(INSERT, k, key=k) for k in keys))
        assert statuses == ["INSERT 0 1"] * len(keys)
        rows = await db.fetch("SELECT id, port FROM landed ORDER BY id")
        assert {row["id"]: c.instance_of(row["port"]) for row in rows} == {
            k: c.master_of(k) for k in keys
        }
        assert sum(p.queries for p in pipelines) == len(keys)
        assert all(p.writes < p.queries for p in pipelines)  # batched, not one write each
        # a batch runs in the order it was handed over
        ordered = keys_of(c, "r1_1", 12, start=100)
        queue = "INSERT INTO queue (id) VALUES ($1)"
        await db.execute(queue, ordered[0], key=ordered[0])  # prepared, then the batch
        writes = pipelines[0].writes
        await asyncio.gather(*(db.execute(queue, k, key=k) for k in ordered[1:]))
        assert pipelines[0].writes == writes + 1
        ids = [row["id"] for row in await db.fetch("SELECT id FROM queue ORDER BY n")]
        assert ids == ordered
        assert db.stats().routed["keyed"] == 2 + len(keys) + len(ordered)  # the 2 openers


async def test_an_error_in_the_middle_of_a_batch_fails_that_query_alone(pg: PgServer) -> None:
    async with cluster(pg) as c, connect(c.url, tier="default", pipeline=True) as db:
        pipeline = await pipelined(db, c, "r1_1")
        a, b, d = keys_of(c, "r1_1", 3)
        failing = "INSERT INTO landed VALUES ($1, 1 / $2::int)"
        await db.execute(failing, a, 1, key=a)  # prepared, so the batch is one write
        await db.execute("DELETE FROM landed WHERE id = $1", a, key=a)
        writes = pipeline.writes
        results = await asyncio.gather(
            db.execute(failing, a, 1, key=a),
            db.execute(failing, b, 0, key=b),
            db.execute(failing, d, 2, key=d),
            return_exceptions=True,
        )
        assert pipeline.writes == writes + 1
        assert results[0] == results[2] == "INSERT 0 1"
        assert isinstance(results[1], asyncpg.DivisionByZeroError)
        assert results[1].query == failing
        ids = {row["id"] for row in await db.fetch("SELECT id FROM landed")}
        assert ids == {a, d}  # each its own transaction: the error rolled back its own only
        assert not pipeline.closed


async def test_a_caller_cancelled_in_a_batch_leaves_the_others_and_the_connection(
    pg: PgServer,
) -> None:
    async with cluster(pg) as c, connect(c.url, tier="default", pipeline=True) as db:
        pipeline = await pipelined(db, c, "r2_1")
        first, second, third = keys_of(c, "r2_1", 3)
        await db.execute(INSERT, first, key=first)  # prepared before the batch
        lock, waiting = await held(db, c, first)
        behind = asyncio.ensure_future(db.execute(INSERT, second, key=second))
        await until(lambda: len(pipeline.sent) == 2, "both sent")
        behind.cancel()
        with pytest.raises(asyncio.CancelledError):
            await behind
        await lock.close()  # the lock goes: the held query, then the one behind, run
        assert await waiting == "SELECT 1"
        assert await db.execute(INSERT, third, key=third) == "INSERT 0 1"
        assert pipeline is db._pools[_uuid("r2_1")].pipeline
        assert not pipeline.closed
        ids = {row["id"] for row in await db.fetch("SELECT id FROM landed")}
        assert ids == {first, second, third}  # sent, so it ran: its caller just left


async def test_a_lost_connection_fails_every_query_in_flight_once(pg: PgServer) -> None:
    async with cluster(pg) as c, connect(c.url, tier="default", pipeline=True) as db:
        pipeline = await pipelined(db, c, "r2_1")
        a, b = keys_of(c, "r2_1", 2)
        await db.execute(INSERT, a, key=a)
        lock, waiting = await held(db, c, a)
        behind = asyncio.ensure_future(db.execute(INSERT, b, key=b))
        await until(lambda: len(pipeline.sent) == 2, "both sent")
        polls, accepted = db.stats().polls, c.forwarders["r2_1"].accepted
        c.forwarders["r2_1"].drop()
        for query in (waiting, behind):
            with pytest.raises(asyncpg.ConnectionDoesNotExistError):
                await query
        await lock.close()
        assert pipeline.closed
        assert not pipeline.sent
        assert db.stats().retries == 0
        await until(lambda: db.stats().polls > polls, "the poll the failure asked for")
        # not sent again; the drop was a failure, so the instance is watched: its queries go
        # pooled (reported) until its success rate is back above 0.999, then one opens a
        # new pipeline
        pool = db._pools[_uuid("r2_1")]
        assert pool.watched
        d = keys_of(c, "r2_1", 3)[2]
        assert await db.execute(INSERT, d, key=d) == "INSERT 0 1"
        for _ in range(100):
            if not pool.watched:
                break
            await db.execute("SELECT $1::bigint", d, key=d)
        assert not pool.watched
        await db.execute("SELECT $1::bigint", d, key=d)
        await until(lambda: pool.pipeline not in (None, pipeline), "a new pipeline")
        assert c.forwarders["r2_1"].accepted >= accepted + 1
        ids = [row["id"] for row in await db.fetch("SELECT id FROM landed ORDER BY id")]
        # b was sent before the drop: the server may have read and run it when the lock went
        # (it ran, then found the client gone), so its caller was told only that it may have
        # run; it ran at most once
        assert ids in ([a, d], [a, b, d])


async def test_queries_past_their_deadline_raise_it_and_close_the_pipeline(pg: PgServer) -> None:
    async with (
        cluster(pg) as c,
        connect(c.url, tier="default", pipeline=True, timeout=0.5) as db,
    ):
        pipeline = await pipelined(db, c, "r1_1")
        a, b = keys_of(c, "r1_1", 2)
        await db.execute(INSERT, a, key=a)
        c.forwarders["r1_1"].stall()
        # first a statement not prepared yet: its Parse, the oldest, has the same deadline
        fresh = "INSERT INTO landed VALUES ($1, 0)"
        queries = [asyncio.ensure_future(db.execute(fresh, b, key=b))]
        queries += [asyncio.ensure_future(db.execute(INSERT, k, key=k)) for k in (a, b)]
        for query in queries:
            with pytest.raises(DeadlineExceeded) as raised:
                await query
            assert raised.value.may_have_run
        assert pipeline.closed
        assert db.stats().deadlines == 3
        c.forwarders["r1_1"].resume()


async def test_one_caller_past_its_deadline_fails_the_later_ones_as_a_lost_connection(
    pg: PgServer,
) -> None:
    async with (
        cluster(pg) as c,
        connect(c.url, tier="default", pipeline=True, timeout=0.5) as db,
    ):
        pipeline = await pipelined(db, c, "r2_1")
        a, b = keys_of(c, "r2_1", 2)
        await db.execute(INSERT, a, key=a)
        lock, waiting = await held(db, c, a)
        await until(lambda: len(pipeline.sent) == 1, "the held query sent")
        sent_at = db._tick
        await until(lambda: db._tick > sent_at + 1, "two sweeps later")
        behind = asyncio.ensure_future(db.execute(INSERT, b, key=b))
        with pytest.raises(DeadlineExceeded):
            await waiting
        with pytest.raises(asyncpg.ConnectionDoesNotExistError):  # sent later: may have run
            await behind
        await lock.close()
        assert pipeline.closed
        assert db.stats().deadlines == 1


async def test_what_the_pipeline_cannot_encode_goes_pooled(pg: PgServer) -> None:
    async with cluster(pg) as c, connect(c.url, tier="default", pipeline=True) as db:
        pipeline = await pipelined(db, c, "r1_1")
        (key,) = keys_of(c, "r1_1", 1)
        sent = pipeline.queries
        # a numeric parameter, a value of a subclass, a driver timeout, no arguments
        assert await db.execute("SELECT $1::numeric", 1.5, key=key) == "SELECT 1"
        assert await db.execute("SELECT $1::bigint", True, key=key) == "SELECT 1"
        assert await db.execute("SELECT $1::bigint", 1, key=key, timeout=5) == "SELECT 1"
        assert await db.execute("SELECT 1", key=key) == "SELECT 1"
        with pytest.raises(asyncpg.DataError):  # asyncpg's own error, as without pipeline
            await db.execute("SELECT $1::bigint", "x", key=key)
        with pytest.raises(asyncpg.DataError):  # not UTF-8: a lone surrogate
            await db.execute("SELECT $1::text", "a\udb67", key=key)
        assert pipeline.queries == sent
        # what it encodes, it sends as asyncpg would: the values come back the same
        values = (2**63 - 1, -(2**31), 7, "ünï", b"\x00\xff", True, -0.25, None)
        query = (
            "SELECT $1::int8, $2::int4, $3::int2, $4::text, $5::bytea, $6::bool, $7::float8,"
            " $8::varchar"
        )
        assert await db.execute(query, *values, key=key) == "SELECT 1"
        assert pipeline.queries == sent + 1
        round_trip = "INSERT INTO kinds VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
        await db.execute(
            "CREATE TABLE kinds (a int8, b int4, c int2, d text, e bytea, f bool, g float8,"
            " h varchar)"
        )
        assert await db.execute(round_trip, *values, key=key) == "INSERT 0 1"
        assert pipeline.queries == sent + 2
        assert tuple(await db.fetchrow("SELECT * FROM kinds", key=key) or ()) == values


async def test_a_statement_the_server_refused_to_prepare_is_prepared_again_later(
    pg: PgServer,
) -> None:
    async with cluster(pg) as c, connect(c.url, tier="default", pipeline=True) as db:
        pipeline = await pipelined(db, c, "r1_1")
        (key,) = keys_of(c, "r1_1", 1)
        later = "INSERT INTO later VALUES ($1)"
        with pytest.raises(asyncpg.UndefinedTableError):  # raised pooled, as without pipeline
            await db.execute(later, key, key=key)
        sent = pipeline.queries
        await db.execute("CREATE TABLE later (id bigint)")
        assert await db.execute(later, key, key=key) == "INSERT 0 1"
        assert pipeline.queries == sent + 1


class Highest(collections.deque):  # type: ignore[type-arg]
    """The pipeline's ``sent``, remembering the most queries it held at once."""

    most = 0

    def append(self, query: Any) -> None:
        super().append(query)
        self.most = max(self.most, len(self))


async def test_callers_beyond_the_cap_go_pooled_each_answered_the_pipeline_never_over_it(
    pg: PgServer,
) -> None:
    async with (
        cluster(pg) as c,
        connect(c.url, tier="default", pipeline=True, pool_size=4) as db,
    ):
        pipeline = await pipelined(db, c, "r1_1")
        assert pipeline.limit == 4  # the pool's size
        (key,) = keys_of(c, "r1_1", 1)
        rows = "SELECT generate_series(1, $1::int)"  # answered "SELECT n": each caller its own
        assert await db.execute(rows, 1, key=key) == "SELECT 1"  # prepared
        pipeline.sent = Highest(pipeline.sent)
        sent, pooled = pipeline.queries, db._pools[_uuid("r1_1")].queries
        callers = 2000
        statuses = await asyncio.gather(
            *(db.execute(rows, n % 97 + 1, key=key) for n in range(callers))
        )
        assert statuses == [f"SELECT {n % 97 + 1}" for n in range(callers)]
        assert pipeline.sent.most == pipeline.limit  # full, never over
        piped = pipeline.queries - sent
        assert 0 < piped < callers
        assert pipeline.refused == callers - piped  # the rest went pooled, none lost
        assert db._pools[_uuid("r1_1")].queries - pooled == callers
        assert not pipeline.closed


async def test_a_server_not_reading_the_pipeline_sends_new_queries_pooled(pg: PgServer) -> None:
    async with cluster(pg) as c, connect(c.url, tier="default", pipeline=True) as db:
        pipeline = await pipelined(db, c, "r1_1")
        backend = pipeline._connection.get_server_pid()  # the pipeline's server process
        (key,) = keys_of(c, "r1_1", 1)
        size = "SELECT length($1::text)"
        assert await db.execute(size, "x", key=key) == "SELECT 1"  # prepared
        os.kill(backend, signal.SIGSTOP)
        try:
            # more than the sockets between it and the stopped backend hold (about 12 MiB
            # measured on loopback through the forwarder): the rest waits in the transport
            big = asyncio.ensure_future(db.execute(size, "x" * (32 << 20), key=key))
            await until(lambda: pipeline.paused, "the transport paused writing")
            assert len(pipeline.sent) == 1 < pipeline.limit  # paused, not full
            sent, refused = pipeline.queries, pipeline.refused
            for n in range(3):  # answered pooled, by the other backends, meanwhile
                assert await asyncio.wait_for(db.execute(size, "y" * n, key=key), 10) == "SELECT 1"
            assert (pipeline.queries, pipeline.refused) == (sent, refused + 3)
            assert not big.done()
        finally:
            os.kill(backend, signal.SIGCONT)
        assert await big == "SELECT 1"  # written whole once the backend read again
        await until(lambda: not pipeline.paused, "the transport writing again")
        assert await db.execute(size, "z", key=key) == "SELECT 1"
        assert pipeline.queries == sent + 1
        assert not pipeline.closed


async def test_a_dropped_pipeline_is_one_failure_of_the_instance(pg: PgServer) -> None:
    async with cluster(pg) as c, connect(c.url, tier="default", pipeline=True) as db:
        pipeline = await pipelined(db, c, "r2_1")
        keys = keys_of(c, "r2_1", 6)
        await db.execute(INSERT, keys[0], key=keys[0])  # prepared
        lock, waiting = await held(db, c, keys[0])
        behind = [asyncio.ensure_future(db.execute(INSERT, k, key=k)) for k in keys]
        await until(lambda: len(pipeline.sent) == 1 + len(keys), "all sent")
        c.forwarders["r2_1"].drop()
        for query in (waiting, *behind):
            with pytest.raises(asyncpg.ConnectionDoesNotExistError):
                await query
        await lock.close()
        health = db._health.health(db._pools[_uuid("r2_1")].uid)
        assert health is not None
        assert health.consecutive_failures == 1  # 7 queries failed, one connection broke
        assert health.state == "healthy"
        assert db.stats().ejections == 0


ROW = st.tuples(
    st.none() | st.integers(-(2**63), 2**63 - 1),
    st.none() | st.integers(-(2**31), 2**31 - 1),
    st.none() | st.integers(-(2**15), 2**15 - 1),
    st.none() | st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00")),
    st.none() | st.binary(),
    st.none() | st.booleans(),
    st.none() | st.floats(allow_nan=False),
    st.none() | st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00")),
)


def test_pipelined_values_are_stored_as_asyncpg_stores_them(pg: PgServer) -> None:
    """Rows of every encoded type, sent concurrently through the pipeline, land as the same
    rows sent through a plain asyncpg connection (asyncpg's own codecs: the reference), each
    caller answered for its own row."""
    loop = asyncio.new_event_loop()
    c = loop.run_until_complete(start_cluster(pg))
    ids = iter(range(10**9))
    columns = "a int8, b int4, c int2, d text, e bytea, f bool, g float8, h varchar"
    insert = "INSERT INTO {} VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"

    async def open_all() -> tuple[Client, asyncpg.Connection, Pipeline]:
        db = await connect(c.url, tier="default", pipeline=True)
        plain = await asyncpg.connect(c.url)
        for table in ("piped", "plain"):
            await plain.execute(f"CREATE TABLE {table} (id bigint, {columns})")
        pipeline = await pipelined(db, c, "r1_1")
        # prepared here, so that every example's rows are pipelined
        await db.execute(insert.format("piped"), -1, *[None] * 8, key=key)
        return db, plain, pipeline

    (key,) = keys_of(c, "r1_1", 1)
    db, plain, pipeline = loop.run_until_complete(open_all())

    @settings(max_examples=60, deadline=None)
    @given(rows=st.lists(ROW, min_size=1, max_size=6))
    def check(rows: list[tuple[Any, ...]]) -> None:
        async def both() -> None:
            numbered = [(next(ids), *row) for row in rows]
            sent = pipeline.queries
            statuses = await asyncio.gather(
                *(db.execute(insert.format("piped"), *row, key=key) for row in numbered)
            )
            assert statuses == ["INSERT 0 1"] * len(rows)
            assert pipeline.queries == sent + len(rows)
            for row in numbered:
                await plain.execute(insert.format("plain"), *row)
            where = "WHERE id = ANY($1::bigint[])"
            first = [row[0] for row in numbered]
            piped = await plain.fetch(f"SELECT * FROM piped {where} ORDER BY id", first)
            reference = await plain.fetch(f"SELECT * FROM plain {where} ORDER BY id", first)
            assert [tuple(r) for r in piped] == [tuple(r) for r in reference]

        loop.run_until_complete(asyncio.wait_for(both(), 30))

    try:
        check()
    finally:
        loop.run_until_complete(db.close())
        loop.run_until_complete(plain.close())
        loop.run_until_complete(stop_cluster(c))
        loop.close()


async def test_no_pipeline_but_in_utf8_and_none_for_a_bad_argument(pg: PgServer) -> None:
    with pytest.raises(InvalidArgumentType, match="pipeline must be a bool, got 'yes'"):
        connect("postgresql://u@127.0.0.1/db", pipeline="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="limit must be a positive int, got 0"):
        Pipeline(None, 0)
    latin1 = {"server_settings": {"client_encoding": "LATIN1"}}
    async with (
        cluster(pg) as c,
        connect(c.url, tier="default", pipeline=True, connect_kwargs=latin1) as db,
    ):
        (key,) = keys_of(c, "r1_1", 1)
        assert await db.execute("SELECT $1::text", "é", key=key) == "SELECT 1"
        pool = db._pools[_uuid("r1_1")]
        await until(lambda: pool._pipeline_task is None, "the pipeline's connection tried")
        assert await db.execute("SELECT $1::text", "é", key=key) == "SELECT 1"
        assert pool.pipeline is None
        assert pool._pipeline_task is None  # not tried again
    async with cluster(pg) as c, connect(c.url, tier="default", pipeline=True) as db:
        pipeline = await pipelined(db, c, "r1_1")
        to_latin1 = "SELECT set_config('client_encoding', $1, false)"
        assert await db.execute(to_latin1, "LATIN1", key=key) == "SELECT 1"
        assert pipeline.closed  # its text would no longer be read as UTF-8
        assert await db.execute("SELECT $1::text", "é", key=key) == "SELECT 1"
