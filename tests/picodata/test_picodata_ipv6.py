"""The Picodata client and its ``InstancePool`` against a PostgreSQL that listens on the IPv6
loopback only (``[::1]``, never another address): the catalog names the instance at
``[::1]:port``, as Picodata writes an IPv6 peer address."""

from __future__ import annotations

import asyncpg
import pytest

from shardline import InvalidAddress
from shardline.picodata import InstancePool, connect
from support.ipv6 import LOOPBACK, requires_ipv6
from support.pg_server import PASSWORD, SUPERUSER, PgServer
from support.picodata_catalog import Catalog, name_uuid

pytestmark = [pytest.mark.async_timeout(60), requires_ipv6]


async def test_an_instance_pool_dials_a_bracketed_ipv6_address(pg_ipv6: PgServer) -> None:

    dialled: list[tuple[str, int]] = []

    async def dial(host: str, port: int) -> asyncpg.Connection:
        dialled.append((host, port))
        return await asyncpg.connect(
            host=host, port=port, user=SUPERUSER, password=PASSWORD, database="postgres"
        )

    pool = InstancePool(
        name_uuid("r1_1"), f"[::1]:{pg_ipv6.port}", connect=dial, size=1, acquire_timeout=10
    )
    try:
        connection = await pool.acquire()
        assert await connection.fetchval("SELECT host(inet_server_addr())") == LOOPBACK
        pool.release(connection)
        assert dialled == [(LOOPBACK, pg_ipv6.port)]
    finally:
        await pool.aclose()


@pytest.mark.parametrize(
    ("address", "says"),
    [
        ("::1:5432", "an IPv6 host is written in brackets"),
        ("[127.0.0.1]:5432", "'127.0.0.1' is not an IPv6 address"),
        ("[::1]:0", "port 0 is out of range (1 to 65535)"),
    ],
)
def test_an_instance_pool_refuses_an_address_it_cannot_dial(address: str, says: str) -> None:

    async def dial(host: str, port: int) -> None:
        raise AssertionError("never dialled")

    with pytest.raises(InvalidAddress) as raised:
        InstancePool(name_uuid("r1_1"), address, connect=dial, size=1, acquire_timeout=1)
    assert str(raised.value).startswith(f"address must be host:port, got {address!r}: {says}")


async def test_the_client_routes_to_an_instance_at_an_ipv6_peer_address(
    pg_ipv6: PgServer,
) -> None:

    address = f"[::1]:{pg_ipv6.port}"
    with Catalog(pg_ipv6.create_schema()) as catalog:
        with catalog.transaction():
            catalog.add_tier("default", 3000)
            catalog.add_replicaset("r1")
            catalog.rebalance("default")
            catalog.set_address("r1_1", address)
        async with connect(catalog.dsn, tier="default") as db:
            assert await db.fetchval("SELECT host(inet_server_addr())", key=7) == LOOPBACK
            pool = db.stats().pools[name_uuid("r1_1")]
            assert (pool.address, pool.queries) == (address, 1)
            assert db.explain(7).address == address
