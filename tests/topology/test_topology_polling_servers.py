"""PollingSource across server faults: a restart, a server down, a reconnect to a different
server (a multi-host DSN), and TLS. These tests start a second PostgreSQL of their own (with
TLS on), since they stop and restart it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from shardline import TierWithoutBuckets, Topology
from shardline.topology.sources import PollingSource
from support.etcd_server import make_certificates
from support.pg_server import PgServer, with_params
from support.picodata_catalog import Catalog, topology_state
from support.polling import owners, run_polled, seed_tier, started
from support.replicasets import rs_uuid

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class TlsServer:
    server: PgServer
    ca: Path


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServer]:
    """A PostgreSQL of this module's own, serving TLS (and plain TCP) with a throwaway CA."""
    certificates = make_certificates(tmp_path_factory.mktemp("pg-tls"))
    server = PgServer()
    try:
        server.settings.update(
            ssl="on",
            ssl_cert_file=str(server.install_file(certificates.server_cert, "server.crt")),
            ssl_key_file=str(server.install_file(certificates.server_key, "server.key")),
        )
        server.start()
        yield TlsServer(server, certificates.ca)
    finally:
        server.close()


async def test_the_server_restarted(tls: TlsServer) -> None:
    tls_pg = tls.server
    dsn = tls_pg.create_schema()
    with Catalog(dsn) as catalog:
        seed_tier(catalog, 3)

    async def scenario(topology: Topology, source: PollingSource) -> None:
        await started(source)
        assert await source.refresh()
        await asyncio.to_thread(tls_pg.stop)
        # down: every poll fails, and the view stays as it was (never cleared)
        assert not await source.refresh()
        assert not await source.refresh()
        failures = source.state.failures
        assert failures.get("connection-lost", 0) + failures.get("connect", 0) >= 2
        assert not source.state.connected
        assert owners(topology, 1, 1001, 2001) == ["r1", "r2", "r3"]
        await asyncio.to_thread(tls_pg.start)
        with Catalog(dsn, create=False) as catalog:
            with catalog.transaction():
                catalog.expel_replicaset("r2")
                catalog.rebalance("default")
            assert await source.refresh()
            assert topology_state(topology) == catalog.expected()
        assert source.state.connected
        assert source.state.connects == 2
        assert owners(topology, 1500, 1501) == ["r1", "r3"]

    await run_polled(dsn, scenario, retry=0.05, timeout=2)


async def test_a_reconnect_to_a_different_server_rebuilds_the_view(
    pg: PgServer, tls: TlsServer
) -> None:
    """Two servers hold different catalogs under one schema name; the DSN lists both. When
    the first goes away the source lands on the second, and the view becomes the second's:
    what only the first had is deleted, not kept."""
    tls_pg = tls.server
    schema = f"twin_{id(pg)}"
    first = Catalog(tls_pg.create_schema(schema))
    second = Catalog(pg.create_schema(schema))
    try:
        seed_tier(first, 3)
        with second.transaction():
            second.add_tier("default", 3000)
            second.add_replicaset("r1", uuid=rs_uuid(1))
            second.add_replicaset("r4", uuid=rs_uuid(4))
            second.rebalance("default")
        dsn = with_params(
            f"postgresql://shardline:shardline@127.0.0.1:{tls_pg.port},127.0.0.1:{pg.port}"
            "/postgres",
            options=f"-c search_path={schema}",
        )

        async def scenario(topology: Topology, source: PollingSource) -> None:
            await started(source)
            assert await source.refresh()
            assert source.state.server == f"127.0.0.1:{tls_pg.port}"
            assert owners(topology, 1, 1001, 2001) == ["r1", "r2", "r3"]
            await asyncio.to_thread(tls_pg.stop)
            for _ in range(5):
                if await source.refresh():
                    break
            assert source.state.server == f"127.0.0.1:{pg.port}"
            assert topology_state(topology) == second.expected()
            assert set(topology.replicasets) == {rs_uuid(1), rs_uuid(4)}
            assert owners(topology, 1, 1501) == ["r1", "r4"]

        try:
            await run_polled(dsn, scenario, retry=0.05, timeout=3)
        finally:
            tls_pg.start()
    finally:
        first.close()
        second.close()


async def test_tls_passes_through_the_dsn(tls: TlsServer) -> None:
    tls_pg, ca = tls.server, tls.ca
    dsn = tls_pg.create_schema()
    with Catalog(dsn) as catalog:
        seed_tier(catalog, 1)
    name = f"tls-{id(ca)}"

    async def verified(topology: Topology, source: PollingSource) -> None:
        await started(source)
        assert await source.refresh()
        assert owners(topology, 1) == ["r1"]
        with tls_pg.connect() as admin:
            row = admin.execute(
                "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)"
                " WHERE a.application_name = %s",
                (name,),
            ).fetchone()
        assert row == (True,)

    await run_polled(
        with_params(dsn, sslmode="verify-full", sslrootcert=str(ca)),
        verified,
        connect_kwargs={"server_settings": {"application_name": name}},
    )

    async def refused(topology: Topology, source: PollingSource) -> None:
        await started(source)
        assert not await source.refresh()
        assert source.state.failures["connect"] >= 1
        assert "certificate" in (source.state.last_failure or "")

    # the server's own certificate is not a CA: verification fails
    wrong = tls_pg.directory / "server.crt"
    await run_polled(
        with_params(dsn, sslmode="verify-full", sslrootcert=str(wrong)), refused, retry=0.05
    )


async def test_an_arbiter_tier_a_tier_not_bootstrapped_and_an_expel(pg: PgServer) -> None:
    """The catalog as Picodata keeps it (tests/support/picodata_catalog.py): an arbiter tier (bucket
    count 0) is followed for its members and never asked for buckets; a tier whose buckets
    are not bootstrapped yet fails alone, counted for it, while the others apply; a
    to-be-expelled replicaset stays routable until expelled, and an expelled one (its rows
    kept) is deleted."""
    dsn = pg.create_schema()
    with Catalog(dsn) as catalog:
        seed_tier(catalog, 3)
        with catalog.transaction():
            catalog.add_tier("arbiter", 0)
            catalog.add_replicaset("a1", "arbiter", uuid=rs_uuid(8))
            catalog.add_tier("late", 3000, bootstrapped=False)
            catalog.add_replicaset("l1", "late", uuid=rs_uuid(9))
            catalog.rebalance("late")

        async def scenario(topology: Topology, source: PollingSource) -> None:
            await started(source)
            assert not await source.refresh()
            failed = source.state.failures["bucket-error"]
            assert dict(source.state.failures) == {"bucket-error": failed}
            assert dict(source.state.tier_failures) == {"late": failed}
            assert "Bucket 1 cannot be found" in (source.state.last_failure or "")
            assert topology.tiers == {"default": 3000, "arbiter": 0, "late": 3000}
            assert owners(topology, 1, 1001, 2001) == ["r1", "r2", "r3"]
            assert topology.replicasets[rs_uuid(8)].tier == "arbiter"
            with pytest.raises(TierWithoutBuckets, match="'arbiter'"):
                topology.route("arbiter", 1)

            catalog.bootstrap("late")
            assert await source.refresh()
            assert topology_state(topology) == catalog.expected()
            assert owners(topology, 1, tier="late") == ["r9"]
            assert dict(source.state.tier_failures) == {"late": failed}

            with catalog.transaction():
                catalog.start_expelling("r2")
                catalog.set_weight("r2", 0.0)
                catalog.rebalance("default")
            assert await source.refresh()
            assert rs_uuid(2) in topology.replicasets  # to-be-expelled: still a member
            assert owners(topology, 1, 1500, 1501, 3000) == ["r1", "r1", "r3", "r3"]

            catalog.expel_replicaset("r2")
            assert await source.refresh()
            assert topology_state(topology) == catalog.expected()
            assert rs_uuid(2) not in topology.replicasets
            assert catalog._rows("SELECT state FROM _pico_replicaset WHERE name = 'r2'") == [
                ("expelled",)
            ]

        await run_polled(dsn, scenario, retry=60.0)
