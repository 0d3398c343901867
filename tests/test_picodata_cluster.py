"""The stand-in Picodata cluster of tests/picodata_cluster.py on three real PostgreSQL servers:
the helper itself (servers, addresses, ``where``, kill and restart, the failing DSNs)."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import psycopg
import pytest
from picodata_cluster import (
    BUCKET_COUNT,
    DATABASE,
    PicodataCluster,
    picodata_cluster_fixture,  # noqa: F401  (the picodata_cluster fixture)
)

from shardline.picodata.sharding_keys import ShardingKey, key_of, load_tables


@pytest.fixture
def cluster(picodata_cluster: PicodataCluster) -> PicodataCluster:
    picodata_cluster.reset()
    return picodata_cluster


def run(coroutine: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, 30))


async def server_port(dsn: str) -> int:
    connection = await asyncpg.connect(dsn, timeout=10)
    try:
        port: int = await connection.fetchval("SELECT inet_server_port()")
        return port
    finally:
        await connection.close()


def catalog_addresses(cluster: PicodataCluster) -> dict[str, str]:
    with cluster.catalog_instance.connect() as connection:
        rows = connection.execute(
            "SELECT i.name, p.address FROM _pico_instance i JOIN _pico_peer_address p"
            " ON p.raft_id = i.raft_id AND p.connection_type = 'pgproto'"
        ).fetchall()
    return dict(rows)


def test_three_servers_each_at_its_catalog_address(cluster: PicodataCluster) -> None:
    ports = {name: i.server.port for name, i in cluster.instances.items()}
    assert len(set(ports.values())) == 3
    addresses = catalog_addresses(cluster)
    assert addresses == {name: f"127.0.0.1:{port}" for name, port in ports.items()}
    for name, address in addresses.items():
        host, port = address.split(":")
        dsn = f"postgresql://app:secret@{host}:{port}/{DATABASE}"
        assert cluster.instance_at(run(server_port(dsn))) == name


def test_the_catalog_describes_the_layout(cluster: PicodataCluster) -> None:
    assert cluster.catalog is not None
    expected = cluster.catalog.expected()
    masters = {rs: master for rs, (_, master) in expected.replicasets.items()}
    by_uuid = {i.uuid: name for name, i in cluster.instances.items()}
    assert sorted(by_uuid[m] for m in masters.values() if m) == ["m1", "m2"]
    assert expected.tiers == {"default": BUCKET_COUNT}
    ranges = expected.maps["default"]
    assert [(start, end) for start, end, _ in ranges] == [(1, 1500), (1501, 3000)]
    owners = [by_uuid[masters[owner]] for _, _, owner in ranges if masters[owner]]
    assert owners == ["m1", "m2"]


def test_every_instance_has_pico_table_saying_users_is_sharded_by_id(
    cluster: PicodataCluster,
) -> None:
    async def tables(dsn: str) -> Any:
        connection = await asyncpg.connect(dsn, timeout=10)
        try:
            return await load_tables(connection)
        finally:
            await connection.close()

    for name in cluster.instances:
        users = run(tables(cluster.dsn_of(name)))["users"]
        assert key_of(users, {"id": 5, "name": "x"}) == ShardingKey("users", "default", (5,))


def test_where_finds_the_server_holding_a_row(cluster: PicodataCluster) -> None:
    assert cluster.where(1) == []
    with cluster.instances["r1"].connect() as connection:
        connection.execute("INSERT INTO users VALUES (1, 'on r1')")
    with cluster.instances["m2"].connect() as connection:
        connection.execute("INSERT INTO users VALUES (2, 'on m2')")
    assert cluster.where(1) == ["r1"]
    assert cluster.where(2) == ["m2"]
    assert cluster.users("r1") == [(1, "on r1")]
    cluster.reset()
    assert cluster.where(1) == []


def test_the_application_user_writes_users(cluster: PicodataCluster) -> None:
    async def insert() -> None:
        connection = await asyncpg.connect(cluster.dsn_of("m1"), timeout=10)
        try:
            await connection.execute("INSERT INTO users VALUES ($1, $2)", 7, "seven")
        finally:
            await connection.close()

    run(insert())
    assert cluster.where(7) == ["m1"]


def test_kill_and_restart(cluster: PicodataCluster) -> None:
    with cluster.instances["m1"].connect() as connection:
        connection.execute("INSERT INTO users VALUES (3, 'kept')")
    port = cluster.instances["m1"].server.port
    cluster.kill("m1")
    assert not cluster.instances["m1"].running
    with pytest.raises(OSError, match=r"(?i)refused|connect"):
        run(server_port(cluster.dsn_of("m1")))
    assert cluster.where(3) == []  # a server that is down is left out
    cluster.restart("m1")
    assert cluster.instances["m1"].server.port == port
    assert run(server_port(cluster.dsn_of("m1"))) == port
    assert cluster.where(3) == ["m1"]
    assert catalog_addresses(cluster)["m1"] == f"127.0.0.1:{port}"


def test_the_catalog_survives_a_restart_of_its_server(cluster: PicodataCluster) -> None:
    cluster.kill("m2")
    assert cluster.where(1) == []  # the other servers still answer
    cluster.restart("m2")
    cluster.reset()  # changes the catalog again, over a new connection
    assert cluster.catalog is not None
    assert cluster.catalog.expected().tiers == {"default": BUCKET_COUNT}


def test_a_wrong_password_is_refused(cluster: PicodataCluster) -> None:
    with pytest.raises(asyncpg.InvalidPasswordError, match="password authentication failed"):
        run(server_port(cluster.wrong_password_dsn))


def test_tls_is_refused_by_the_servers(cluster: PicodataCluster) -> None:
    with pytest.raises(ConnectionError, match=r"(?i)ssl"):
        run(server_port(cluster.tls_required_dsn))
    with pytest.raises(psycopg.OperationalError, match=r"(?i)ssl"):
        psycopg.connect(cluster.tls_required_dsn, connect_timeout=5).close()
