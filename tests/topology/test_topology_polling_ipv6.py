"""A PollingSource reading a catalog from a PostgreSQL on the IPv6 loopback only (``[::1]``,
never another address): it names the server it reached as ``[::1]:port``."""

from __future__ import annotations

import pytest

from shardline import Topology
from shardline.topology.sources import PollingSource
from support.ipv6 import requires_ipv6
from support.pg_server import PgServer
from support.picodata_catalog import Catalog
from support.polling import owners, run_polled, seed_tier

pytestmark = [pytest.mark.async_timeout(60), requires_ipv6]


async def test_a_source_on_ipv6_loopback_names_its_server_in_brackets(pg_ipv6: PgServer) -> None:

    with Catalog(pg_ipv6.create_schema()) as catalog:
        seed_tier(catalog, 2)
        assert "@[::1]:" in catalog.dsn

        async def scenario(topology: Topology, source: PollingSource) -> None:
            assert await source.refresh()
            assert owners(topology, 1, 3000) == ["r1", "r2"]
            assert source.state.server == f"[::1]:{pg_ipv6.port}"

        await run_polled(catalog.dsn, scenario)
