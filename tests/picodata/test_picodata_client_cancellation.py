"""Client.close() whose caller is cancelled ends cancelled, and a later close() finishes the
closing it started (``docs/architecture.md``: a loop must also be stoppable), against one real
PostgreSQL."""

from __future__ import annotations

import asyncio

import pytest

from shardline.picodata import connect
from support.cancellation import others, stop_cancelled
from support.forwarded_cluster import Forwarder, cluster
from support.pg_server import PgServer

pytestmark = pytest.mark.async_timeout(60)


async def test_a_close_whose_caller_is_cancelled_ends_cancelled(pg: PgServer) -> None:
    async with cluster(pg) as c:
        # the catalog is read through a forwarder of its own, stopped before the close: the
        # client has no catalog connection left to say goodbye on, so close() goes straight
        # to waiting for its background tasks
        catalog = Forwarder(pg.port)
        await catalog.start()
        before = others()
        db = await connect(c.url.replace(f":{pg.port}/", f":{catalog.port}/"), tier="default")
        await catalog.stop()
        assert await db.refresh() is False
        background = others() - before  # the source's run() and the client's maintenance
        stopper = await stop_cancelled(db.close)
        assert stopper.cancelled()
        await asyncio.wait(background)  # they end too (bounded by the test's timeout)


async def test_a_close_cancelled_midway_is_finished_by_the_next_one(pg: PgServer) -> None:
    async with cluster(pg) as c:
        catalog = Forwarder(pg.port)
        await catalog.start()
        db = await connect(c.url.replace(f":{pg.port}/", f":{catalog.port}/"), tier="default")
        assert await db.fetchval("SELECT $1::bigint", 7, key=7) == 7
        master = c.forwarders[c.master_of(7)]
        assert master.open_links == 1  # the routed query's pooled connection
        await catalog.stop()
        assert await db.refresh() is False
        stopper = await stop_cancelled(db.close)
        assert stopper.cancelled()
        await db.close()  # waits for the closing the cancelled call started
        for _ in range(500):  # the forwarder sees the connection's end on its next reads
            if master.open_links == 0:
                break
            await asyncio.sleep(0.01)
        assert master.open_links == 0
