"""What a query method of the Picodata client returns behaves as a coroutine to its callers:
awaited, made a task, gathered, cancelled midway, failing in the driver, closed or dropped
started or not, against one real PostgreSQL (``tests/support/forwarded_cluster.py``).

Both paths are pinned: the hot one (an idle connection of the key's master) and the slow one
(a connection still to open). They were written for an experiment that replaced the hot path's
coroutine frame by a native coroutine (benches/RESULTS.md, "Issue 11: a native awaitable
instead of the wrapper coroutine"), and pin what any such change must keep.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import warnings
from collections.abc import Coroutine

import asyncpg
import pytest

from shardline.picodata import Client, PoolStats, connect
from support.forwarded_cluster import Cluster, cluster
from support.pg_server import PgServer
from support.picodata_catalog import name_uuid

pytestmark = pytest.mark.async_timeout(60)

SLEEP = "SELECT pg_sleep(3)"  # a query that is still running when the test acts on it


def master_pool(db: Client, c: Cluster, key: int) -> PoolStats:
    return db.stats().pools[name_uuid(c.master_of(key))]


async def sleeping(db: Client) -> None:
    """Waits (bounded) until the server runs a ``pg_sleep`` query."""
    for _ in range(1000):
        pids = await db.fetch(
            "SELECT pid FROM pg_stat_activity WHERE query = $1 AND state = 'active'", SLEEP
        )
        if pids:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the query never started on the server")


async def warmed(db: Client, key: int) -> None:
    """One connection of the key's master opened and idle: the next query takes the hot path."""
    assert await db.fetchval("SELECT $1::bigint", key, key=key) == key


async def test_a_query_is_a_coroutine_to_asyncio(pg: PgServer) -> None:
    async with cluster(pg) as c, connect(c.url, tier="default") as db:
        await warmed(db, 7)
        query = db.fetchval("SELECT $1::bigint", 7, key=7)
        assert isinstance(query, Coroutine)
        assert asyncio.iscoroutine(query)
        assert inspect.isawaitable(query)
        task = asyncio.create_task(query)
        assert await task == 7
        results = await asyncio.gather(
            *(db.fetchval("SELECT $1::bigint", k, key=k) for k in range(40)),
            db.fetchval("SELECT 41::bigint"),
        )
        assert results == [*range(40), 41]
        # awaited once, like a coroutine
        done = db.fetchval("SELECT 1", key=7)
        assert await done == 1
        with pytest.raises(RuntimeError, match="cannot reuse already awaited coroutine"):
            await done
        # send() and the StopIteration that carries the result
        stepped = db.fetchval("SELECT $1::bigint", 9, key=9)
        with pytest.raises(TypeError, match="non-None value"):
            stepped.send(1)
        waited = stepped.send(None)
        assert isinstance(waited, asyncio.Future)
        await asyncio.wait([waited])
        with pytest.raises(StopIteration) as returned:
            stepped.send(None)
        assert returned.value.value == 9


async def test_a_query_cancelled_midway_has_its_connection_discarded(
    pg: PgServer,
) -> None:
    async with cluster(pg) as c, connect(c.url, tier="default") as db:
        await warmed(db, 7)
        before = master_pool(db, c, 7)
        task = asyncio.create_task(db.fetchval(SLEEP, key=7))
        await sleeping(db)
        assert master_pool(db, c, 7).in_use == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        after = master_pool(db, c, 7)
        assert after.in_use == 0
        assert after.discarded == before.discarded + 1  # as the async def did: not reused
        assert await db.fetchval("SELECT $1::bigint", 7, key=7) == 7


async def test_a_driver_error_goes_through_the_failed_path(pg: PgServer) -> None:
    async with cluster(pg) as c, connect(c.url, tier="default") as db:
        await warmed(db, 7)
        before = master_pool(db, c, 7)
        with pytest.raises(asyncpg.DivisionByZeroError):
            await db.fetchval("SELECT 1/0", key=7)
        after = master_pool(db, c, 7)
        assert (after.idle, after.in_use, after.discarded) == (before.idle, 0, before.discarded)
        # a connection broken under the query is discarded and a poll asked for
        polls = db.stats().polls
        with pytest.raises(asyncpg.PostgresError):
            await db.fetchval("SELECT pg_terminate_backend(pg_backend_pid())", key=7)
        broken = master_pool(db, c, 7)
        assert broken.discarded == before.discarded + 1
        assert broken.in_use == 0
        for _ in range(1000):
            if db.stats().polls > polls:
                break
            await asyncio.sleep(0.01)
        assert db.stats().polls > polls


async def test_a_query_never_awaited_takes_nothing_and_is_warned_about(pg: PgServer) -> None:
    async with cluster(pg) as c, connect(c.url, tier="default") as db:
        await warmed(db, 7)
        before = master_pool(db, c, 7)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            query = db.fetchval("SELECT 1", key=7)
            assert master_pool(db, c, 7) == before  # nothing taken before the first step
            del query
            gc.collect()
        assert [str(w.message) for w in caught] == ["coroutine 'Client.fetchval' was never awaited"]
        assert master_pool(db, c, 7) == before
        # thrown into before its first step: raises, takes nothing, is done
        thrown = db.fetchval("SELECT 1", key=7)
        with pytest.raises(KeyError):
            thrown.throw(KeyError("k"))
        with pytest.raises(RuntimeError, match="cannot reuse"):
            thrown.send(None)
        assert master_pool(db, c, 7) == before


@pytest.mark.parametrize("how", ["dropped", "closed"])
async def test_a_query_dropped_or_closed_midway_gives_its_connection_back(
    pg: PgServer, how: str
) -> None:
    async with cluster(pg) as c, connect(c.url, tier="default") as db:
        await warmed(db, 7)
        before = master_pool(db, c, 7)
        query = db.fetchval(SLEEP, key=7)
        query.send(None)  # sent: waiting for the server's answer
        await sleeping(db)
        assert master_pool(db, c, 7).in_use == 1
        if how == "closed":
            query.close()
            query.close()  # a second close does nothing
        else:
            del query
            gc.collect()
        after = master_pool(db, c, 7)
        assert after.in_use == 0
        # as the async def's close(): the connection, mid-query, is discarded (terminated)
        assert after.discarded == before.discarded + 1


async def test_the_slow_path_is_a_coroutine_too(pg: PgServer) -> None:
    async with cluster(pg) as c, connect(c.url, tier="default") as db:
        # no connection open yet: the first query of each master opens one
        assert await asyncio.gather(*(db.fetchval("SELECT $1::bigint", k, key=k) for k in range(8)))
        assert await db.fetchval("SELECT 1", key=7, read_only=True) == 1
        # cancelled while opening its connection: nothing is left in use
        opening = asyncio.create_task(db.fetchval("SELECT 1", key=7, read_only=True))
        await asyncio.sleep(0)
        opening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await opening
        assert all(stats.in_use == 0 for stats in db.stats().pools.values())
