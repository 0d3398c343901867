"""The Picodata client stays on its tier (issue 27, item 4).

Queries without a key go to the client's tier; other tiers only when none of its instances can
be reached (a counted fallback); an arbiter tier's instances (bucket count 0) are never dialled.
``tier=`` defaults to the catalog's default tier (``_pico_tier.is_default``, Picodata 26.1
``src/tier.rs``; the tier named ``default`` before), and a DSN that reaches a plain PostgreSQL
says it is not Picodata.

The cluster is ``tests/support/forwarded_cluster.py``'s, with tiers added: each instance a TCP
forwarder to one PostgreSQL, so a test counts the connections an instance was offered.
"""

from __future__ import annotations

import logging

import pytest

from shardline import TierWithoutBuckets, UnknownTier
from shardline.errors import InstanceUnavailable, NotPicodata
from shardline.picodata import connect
from support.forwarded_cluster import Cluster, Forwarder, cluster
from support.pg_server import PgServer

pytestmark = pytest.mark.async_timeout(60)


async def add_tier(c: Cluster, tier: str, buckets: int, replicaset: str, instances: int) -> None:
    """A tier with one replicaset of ``instances`` instances, each behind its own forwarder."""
    with c.catalog.transaction():
        c.catalog.add_tier(tier, buckets)
        c.catalog.add_replicaset(replicaset, tier, instances=instances)
        if buckets:
            c.catalog.rebalance(tier)
    for n in range(1, instances + 1):
        name = f"{replicaset}_{n}"
        forwarder = Forwarder(c.pg.port)
        await forwarder.start()
        c.forwarders[name] = forwarder
        c.catalog.set_address(name, forwarder.address)


def accepted(c: Cluster, prefix: str) -> int:
    return sum(f.accepted for name, f in c.forwarders.items() if name.startswith(prefix))


async def test_unkeyed_queries_stay_on_the_tier_and_never_reach_an_arbiter(pg: PgServer) -> None:
    async with cluster(pg) as c:
        await add_tier(c, "arbiter", 0, "a1", 2)
        await add_tier(c, "cold", 300, "c1", 1)
        async with connect(c.url, tier="default") as db:
            ports = [await db.fetchval("SELECT inet_client_port()") for _ in range(20)]
            served = {c.instance_of(port) for port in ports}
            assert served == {"r1_1", "r1_2", "r1_3", "r2_1", "r2_2"}
            assert accepted(c, "a1") == 0
            assert accepted(c, "c1") == 0
            assert db.stats().fallbacks == {}
        async with connect(c.url, tier="cold") as db:
            assert {
                c.instance_of(await db.fetchval("SELECT inet_client_port()")) for _ in range(5)
            } == {"c1_1"}
        assert accepted(c, "a1") == 0


async def test_other_tiers_serve_only_when_none_of_the_tier_can_be_reached(
    pg: PgServer, caplog: pytest.LogCaptureFixture
) -> None:
    async with cluster(pg) as c:
        await add_tier(c, "arbiter", 0, "a1", 1)
        await add_tier(c, "cold", 300, "c1", 1)
        async with connect(c.url, tier="default", poll_interval=60.0) as db:
            for name in ("r1_1", "r1_2", "r1_3", "r2_1", "r2_2"):
                await c.forwarders[name].stop()
            with caplog.at_level(logging.WARNING, "shardline.picodata"):
                for _ in range(3):
                    port = await db.fetchval("SELECT inet_client_port()")
                    assert c.instance_of(port) == "c1_1"
            stats = db.stats()
            assert stats.fallbacks == {"other-tier": 3}
            assert stats.routed["unkeyed"] == 3
            assert accepted(c, "a1") == 0
            warnings = [r for r in caplog.records if "other tiers" in r.getMessage()]
            assert len(warnings) == 1, "warned once a minute, not per query"
            await c.forwarders["c1_1"].stop()
            with pytest.raises(InstanceUnavailable):
                await db.fetchval("SELECT 1")
            assert accepted(c, "a1") == 0


async def test_tier_defaults_to_the_catalogs_default_tier(pg: PgServer) -> None:
    async with cluster(pg) as c:
        await add_tier(c, "hot", 300, "h1", 1)
        async with connect(c.url) as db:  # `default` is the default tier (is_default true)
            assert c.instance_of(await db.fetchval("SELECT inet_client_port()")) != "h1_1"
        # Picodata 26.1: the default tier is the first of the configuration, whatever its name
        with c.catalog.transaction():
            c.catalog.set_raw("_pico_tier", "is_default", False, "name", "default")
            c.catalog.set_raw("_pico_tier", "is_default", True, "name", "hot")
        async with connect(c.url) as db:
            assert c.instance_of(await db.fetchval("SELECT inet_client_port()")) == "h1_1"
            key = next(k for k in range(100))
            assert db.explain(key).tier == "hot"
        # before 26.1 (no flag set anywhere): the tier named `default`
        c.catalog.set_raw("_pico_tier", "is_default", False, "name", "hot")
        async with connect(c.url) as db:
            assert c.instance_of(await db.fetchval("SELECT inet_client_port()")) != "h1_1"
        c.catalog.connection.execute("ALTER TABLE _pico_tier DROP COLUMN is_default")
        async with connect(c.url) as db:
            assert c.instance_of(await db.fetchval("SELECT inet_client_port()")) != "h1_1"


async def test_no_default_tier_and_an_arbiter_tier_are_refused(pg: PgServer) -> None:
    async with cluster(pg) as c:
        await add_tier(c, "arbiter", 0, "a1", 1)
        with pytest.raises(TierWithoutBuckets, match="'arbiter' has no buckets"):
            await connect(c.url, tier="arbiter")
        c.catalog.connection.execute("UPDATE _pico_tier SET is_default = false")
        c.catalog.connection.execute("UPDATE _pico_tier SET name = 'main' WHERE name = 'default'")
        with pytest.raises(UnknownTier, match=r"names no default tier.*pass tier="):
            await connect(c.url)
        assert accepted(c, "a1") == 0


async def test_a_plain_postgresql_is_named_as_not_picodata(pg: PgServer) -> None:
    dsn = pg.create_schema()  # reachable, SQL works, no Picodata catalog
    with pytest.raises(NotPicodata, match="is not a Picodata instance: it has no _pico_tier") as e:
        await connect(dsn, tier="default")
    assert e.value.address == f"127.0.0.1:{pg.port}"
    assert isinstance(e.value, ValueError)
    with pytest.raises(NotPicodata):
        await connect(dsn)
