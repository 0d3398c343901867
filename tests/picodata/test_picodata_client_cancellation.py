"""Client.close() whose caller is cancelled ends cancelled (``docs/architecture.md``: a loop
must also be stoppable), against one real PostgreSQL."""

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
