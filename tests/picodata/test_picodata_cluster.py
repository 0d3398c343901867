"""The stand-in Picodata cluster of tests/support/picodata_cluster.py on three real PostgreSQL
servers: the helper itself (servers, addresses, ``where``, kill and restart, the failing DSNs), then
the Picodata client end to end on it (issue 11, section 3), each routed query checked on the server
that answered it or holds its row, and a Hypothesis test of catalog histories against a
reference."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardline.picodata
from shardline.errors import InstanceUnavailable, NoWorkersAvailable, TierWithoutBuckets
from shardline.picodata.sharding_keys import ShardingKey, key_of, load_tables
from support.picodata_catalog import name_uuid
from support.picodata_cluster import (
    BUCKET_COUNT,
    DATABASE,
    REPLICASETS,
    PicodataCluster,
)

pytestmark = pytest.mark.async_timeout(30)  # each async test, start to finish


@pytest.fixture
def cluster(picodata_cluster: PicodataCluster) -> PicodataCluster:
    picodata_cluster.reset()
    return picodata_cluster


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


async def test_three_servers_each_at_its_catalog_address(cluster: PicodataCluster) -> None:
    ports = {name: i.server.port for name, i in cluster.instances.items()}
    assert len(set(ports.values())) == 3
    addresses = catalog_addresses(cluster)
    assert addresses == {name: f"127.0.0.1:{port}" for name, port in ports.items()}
    for name, address in addresses.items():
        host, port = address.split(":")
        dsn = f"postgresql://app:secret@{host}:{port}/{DATABASE}"
        assert cluster.instance_at(await server_port(dsn)) == name


def test_the_catalog_describes_the_layout(cluster: PicodataCluster) -> None:
    expected = cluster.catalog.expected()
    masters = {rs: master for rs, (_, master) in expected.replicasets.items()}
    by_uuid = {i.uuid: name for name, i in cluster.instances.items()}
    assert sorted(by_uuid[m] for m in masters.values() if m) == ["m1", "m2"]
    assert expected.tiers == {"default": BUCKET_COUNT}
    ranges = expected.maps["default"]
    assert [(start, end) for start, end, _ in ranges] == [(1, 1500), (1501, 3000)]
    owners = [by_uuid[masters[owner]] for _, _, owner in ranges if masters[owner]]
    assert owners == ["m1", "m2"]


async def test_every_instance_has_pico_table_saying_users_is_sharded_by_id(
    cluster: PicodataCluster,
) -> None:
    async def tables(dsn: str) -> Any:
        connection = await asyncpg.connect(dsn, timeout=10)
        try:
            return await load_tables(connection)
        finally:
            await connection.close()

    for name in cluster.instances:
        users = (await tables(cluster.dsn_of(name)))["users"]
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


async def test_the_application_user_writes_users(cluster: PicodataCluster) -> None:

    connection = await asyncpg.connect(cluster.dsn_of("m1"), timeout=10)
    try:
        await connection.execute("INSERT INTO users VALUES ($1, $2)", 7, "seven")
    finally:
        await connection.close()
    assert cluster.where(7) == ["m1"]


async def test_kill_and_restart(cluster: PicodataCluster) -> None:
    with cluster.instances["m1"].connect() as connection:
        connection.execute("INSERT INTO users VALUES (3, 'kept')")
    port = cluster.instances["m1"].server.port
    cluster.kill("m1")
    assert not cluster.instances["m1"].running
    with pytest.raises(OSError, match=r"(?i)refused|connect"):
        await server_port(cluster.dsn_of("m1"))
    assert cluster.where(3) == []  # a server that is down is left out
    cluster.restart("m1")
    assert cluster.instances["m1"].server.port == port
    assert await server_port(cluster.dsn_of("m1")) == port
    assert cluster.where(3) == ["m1"]
    assert catalog_addresses(cluster)["m1"] == f"127.0.0.1:{port}"


def test_the_catalog_survives_a_restart_of_its_server(cluster: PicodataCluster) -> None:
    cluster.kill("m2")
    assert cluster.where(1) == []  # the other servers still answer
    cluster.restart("m2")
    cluster.reset()  # changes the catalog again, over a new connection
    assert cluster.catalog.expected().tiers == {"default": BUCKET_COUNT}


async def test_a_wrong_password_is_refused(cluster: PicodataCluster) -> None:
    with pytest.raises(asyncpg.InvalidPasswordError, match="password authentication failed"):
        await server_port(cluster.wrong_password_dsn)


async def test_tls_is_refused_by_the_servers(cluster: PicodataCluster) -> None:
    with pytest.raises(ConnectionError, match=r"(?i)ssl"):
        await server_port(cluster.tls_required_dsn)
    with pytest.raises(psycopg.OperationalError, match=r"(?i)ssl"):
        psycopg.connect(cluster.tls_required_dsn, connect_timeout=5).close()


# --------------------------------------------------------------------------------------------
# The client end to end (issue 11, section 3): routed queries checked on the servers

KEYS = range(1, 41)


def owner_master(cluster: PicodataCluster, key: int, split: int = 1500) -> str:
    """m1 for rs1's buckets (1..split), m2 for rs2's, as reset() spreads them."""
    return "m1" if cluster.bucket_of(key) <= split else "m2"


async def answered_by(cluster: PicodataCluster, db: Any, **kwargs: Any) -> str:
    """The instance whose server ran ``SELECT inet_server_port()`` sent with ``kwargs``."""
    return cluster.instance_at(await db.fetchval("SELECT inet_server_port()", **kwargs))


def connect(cluster: PicodataCluster, dsn: str | None = None, **kwargs: Any) -> Any:
    kwargs = {"tier": "default", "poll_interval": 30.0, "route_wait": 1.0, **kwargs}
    return shardline.picodata.connect(dsn or cluster.dsn, **kwargs)


async def test_keyed_inserts_land_on_the_owning_masters_server(cluster: PicodataCluster) -> None:
    async def scenario() -> None:
        async with connect(cluster) as db:
            for key in KEYS:
                await db.execute("INSERT INTO users VALUES ($1, $2)", key, f"user {key}", key=key)
            row = await db.key_for("users", {"id": 41, "name": "by key_for"})
            await db.execute("INSERT INTO users VALUES ($1, $2)", 41, "by key_for", key=row)
            assert db.stats().routed["keyed"] == len(KEYS) + 1
            assert db.stats().fallbacks == {}

    await scenario()
    for key in [*KEYS, 41]:
        assert cluster.where(key) == [owner_master(cluster, key)], key
    assert {owner_master(cluster, key) for key in KEYS} == {"m1", "m2"}  # both were exercised


async def test_read_only_queries_reach_replicas(cluster: PicodataCluster) -> None:

    async with connect(cluster) as db:
        for key in KEYS:
            master = owner_master(cluster, key)
            # rs1 has the replica r1; rs2 has none, so its master serves its reads
            reader = "r1" if master == "m1" else "m2"
            assert await answered_by(cluster, db, key=key, read_only=True) == reader
            assert await answered_by(cluster, db, key=key) == master


async def test_buckets_moved_between_polls_move_later_queries(cluster: PicodataCluster) -> None:
    rs1, rs2 = (name_uuid(rs) for rs in ("rs1", "rs2"))

    async def scenario() -> None:
        async with connect(cluster) as db:
            for key in KEYS:
                assert await answered_by(cluster, db, key=key) == owner_master(cluster, key)
            # rs2 takes buckets 1..750 from rs1
            cluster.catalog.set_buckets(
                "default", [(1, 750, rs2), (751, 1500, rs1), (1501, 3000, rs2)]
            )
            assert await db.refresh()
            for key in KEYS:
                want = "m2" if cluster.bucket_of(key) <= 750 else owner_master(cluster, key)
                assert await answered_by(cluster, db, key=key) == want
            assert db.explain(KEYS[0]).epoch > 1

    await scenario()
    assert any(cluster.bucket_of(key) <= 750 for key in KEYS)


async def test_unkeyed_queries_reach_every_online_instance_in_turn(
    cluster: PicodataCluster,
) -> None:

    async with connect(cluster) as db:
        seen = [await answered_by(cluster, db) for _ in range(9)]
        assert {name: seen.count(name) for name in set(seen)} == {"m1": 3, "r1": 3, "m2": 3}
        assert db.stats().routed["unkeyed"] == 9


async def test_a_killed_master_fails_reads_over_and_writes_raise(cluster: PicodataCluster) -> None:
    key = next(k for k in KEYS if owner_master(cluster, k) == "m1")

    async with connect(cluster) as db:
        # warm the pools, so the kill also cuts pooled connections
        assert await answered_by(cluster, db, key=key) == "m1"
        assert await answered_by(cluster, db, key=key, read_only=True) == "r1"
        polls = db.stats().polls
        cluster.kill("m1")
        for _ in range(3):
            assert await answered_by(cluster, db, key=key, read_only=True) == "r1"
        # the pooled connections were cut: nothing is sent, the client refreshes and
        # retries once on the key's owner (still m1 in the catalog), then gives up
        address = cluster.instances["m1"].address
        with pytest.raises(InstanceUnavailable, match=rf"instance m1 .* at {address}"):
            await db.execute("INSERT INTO users VALUES ($1, 'lost')", key, key=key)
        assert db.stats().retries == 1
        assert db.stats().unavailable == 1
        assert db.stats().polls > polls
        assert db.stats().unavailable >= 1
        # Picodata elects r1; the next poll routes writes there
        cluster.catalog.switch_master("rs1", "r1")
        cluster.catalog.set_state("m1", "Offline")
        await db.refresh()
        await db.execute("INSERT INTO users VALUES ($1, 'kept')", key, key=key)
    assert cluster.where(key) == ["r1"]


async def test_a_killed_replica_fails_reads_over_to_the_master(cluster: PicodataCluster) -> None:
    key = next(k for k in KEYS if owner_master(cluster, k) == "m1")

    async with connect(cluster) as db:
        assert await answered_by(cluster, db, key=key, read_only=True) == "r1"
        cluster.kill("r1")  # the catalog still says r1 is online
        try:
            first = await answered_by(cluster, db, key=key, read_only=True)
        except asyncpg.ConnectionDoesNotExistError:
            # the pooled connection was cut but not yet seen closed: the query was sent on
            # it, so the driver's error is raised as is (and the connection discarded)
            first = "m1"
        assert first == "m1"
        for _ in range(3):
            assert await answered_by(cluster, db, key=key, read_only=True) == "m1"
        assert db.stats().unavailable == 0


async def test_a_master_not_online_falls_back_or_raises_when_strict(
    cluster: PicodataCluster,
) -> None:
    key = next(k for k in KEYS if owner_master(cluster, k) == "m1")
    bucket = cluster.bucket_of(key)
    cluster.catalog.set_state("m1", "Offline")

    async with connect(cluster, route_wait=0.2) as db:
        # the server routes it: any online instance, never the offline master
        assert await answered_by(cluster, db, key=key) in {"r1", "m2"}
        assert db.stats().fallbacks == {"master-not-online": 1}
        with pytest.raises(NoWorkersAvailable, match=rf"bucket {bucket}.*master-not-online"):
            await answered_by(cluster, db, key=key, strict=True)
        # a read still has rs1's online replica
        assert await answered_by(cluster, db, key=key, read_only=True, strict=True) == "r1"


async def test_a_wrong_password_is_a_clear_error(cluster: PicodataCluster) -> None:
    async def scenario() -> None:
        async with connect(cluster, cluster.wrong_password_dsn):
            pass

    with pytest.raises(InstanceUnavailable, match=r"(?i)password authentication failed"):
        await scenario()


async def test_a_refused_tls_handshake_is_a_clear_error(cluster: PicodataCluster) -> None:
    async def scenario() -> None:
        async with connect(cluster, cluster.tls_required_dsn):
            pass

    with pytest.raises(InstanceUnavailable, match=r"(?i)ssl|tls"):
        await scenario()


async def test_an_expelled_replicaset_leaves_the_routing(cluster: PicodataCluster) -> None:

    async with connect(cluster) as db:
        assert await answered_by(cluster, db, key=KEYS[0]) in {"m1", "m2"}
        # Picodata moves rs1's buckets away, then expels it (its rows stay, state expelled)
        cluster.catalog.set_buckets("default", [(1, 3000, name_uuid("rs2"))])
        cluster.catalog.expel_replicaset("rs1")
        assert await db.refresh()
        assert {await answered_by(cluster, db) for _ in range(12)} == {"m2"}
        for key in KEYS:
            assert await answered_by(cluster, db, key=key) == "m2"
            assert await answered_by(cluster, db, key=key, read_only=True) == "m2"
        assert set(db.stats().pools) == {name_uuid("m2")}


async def test_an_arbiter_tier_is_followed_and_never_routed(cluster: PicodataCluster) -> None:
    # test/int/test_expelling.py::test_expel_zero_bucket_tier: a tier with bucket_count 0
    with cluster.catalog.transaction():
        cluster.catalog.add_tier("arbiter", 0)
        cluster.catalog.add_replicaset("arb", "arbiter", instances=0)
        cluster.catalog.add_instance("a1", "arb")
        cluster.catalog.switch_master("arb", "a1")
        cluster.catalog.set_address("a1", cluster.instances["m2"].address)

    async with connect(cluster) as db:
        assert db.topology.tiers["arbiter"] == 0
        for key in KEYS:
            assert await answered_by(cluster, db, key=key) == owner_master(cluster, key)
        with pytest.raises(TierWithoutBuckets, match="arbiter"):
            await db.fetchval("SELECT 1", key=ShardingKey("t", "arbiter", (1,)))


# --------------------------------------------------------------------------------------------
# Catalog histories against a reference: where must each routed query land?

SAMPLE_KEYS = tuple(range(100, 124))


@dataclass
class Reference:
    """The catalog as the test changed it, and where each query must go."""

    ranges: list[tuple[int, int, str]] = field(
        default_factory=lambda: [(1, 1500, "rs1"), (1501, 3000, "rs2")]
    )
    masters: dict[str, str] = field(default_factory=lambda: {"rs1": "m1", "rs2": "m2"})
    online: dict[str, bool] = field(default_factory=lambda: dict.fromkeys(("m1", "r1", "m2"), True))
    expelled: set[str] = field(default_factory=set)

    def members(self, rs: str) -> tuple[str, ...]:
        return () if rs in self.expelled else REPLICASETS[rs]

    def owner(self, bucket: int) -> str:
        return next(rs for start, end, rs in self.ranges if start <= bucket <= end)

    def writer(self, bucket: int) -> str | None:
        """The master's server, or None: no route (strict raises)."""
        master = self.masters[self.owner(bucket)]
        return master if self.online[master] else None

    def readers(self, bucket: int) -> set[str]:
        """The online replicas, else the master if online; empty: no route."""
        rs = self.owner(bucket)
        replicas = {i for i in self.members(rs) if i != self.masters[rs] and self.online[i]}
        return replicas or ({self.masters[rs]} if self.online[self.masters[rs]] else set())

    def anyone(self) -> set[str]:
        return {i for rs in REPLICASETS for i in self.members(rs) if self.online[i]}


live_replicasets = ("rs1", "rs2")
moves = st.tuples(
    st.just("move"),
    st.lists(st.integers(2, BUCKET_COUNT), max_size=3, unique=True).map(sorted),
    st.lists(st.sampled_from(live_replicasets), min_size=4, max_size=4),
)
steps = st.one_of(
    moves,
    st.tuples(st.just("switch"), st.sampled_from(["m1", "r1"])),
    st.tuples(st.just("state"), st.sampled_from(["m1", "r1", "m2"]), st.booleans()),
    st.tuples(st.just("start_expelling")),
    st.tuples(st.just("expel")),
)


def apply_step(cluster: PicodataCluster, reference: Reference, step: tuple[Any, ...]) -> None:
    """Changes the catalog (one transaction) and the reference alike; a step that does not
    apply to the current state (a member of an expelled replicaset) changes nothing."""
    catalog = cluster.catalog
    live = [rs for rs in live_replicasets if rs not in reference.expelled]
    if step[0] == "move":
        cuts = [1, *step[1], BUCKET_COUNT + 1]
        owners = [rs if rs in live else live[0] for rs in step[2]]
        reference.ranges = [(cuts[n], cuts[n + 1] - 1, owners[n]) for n in range(len(cuts) - 1)]
        catalog.set_buckets("default", [(s, e, name_uuid(rs)) for s, e, rs in reference.ranges])
    elif step[0] == "switch" and "rs1" in live:
        reference.masters["rs1"] = step[1]
        catalog.switch_master("rs1", step[1])
    elif step[0] == "state" and any(step[1] in reference.members(rs) for rs in live):
        reference.online[step[1]] = step[2]
        catalog.set_state(step[1], "Online" if step[2] else "Offline")
    elif step[0] == "start_expelling" and "rs1" in live:
        # to-be-expelled: still a member, still serving its buckets until they are moved away
        catalog.start_expelling("rs1")
    elif step[0] == "expel" and "rs1" in live:
        # Picodata moves an expelled replicaset's buckets away first
        reference.ranges = [(1, BUCKET_COUNT, "rs2")]
        reference.expelled.add("rs1")
        with catalog.transaction():
            catalog.set_buckets("default", [(1, BUCKET_COUNT, name_uuid("rs2"))])
            catalog.expel_replicaset("rs1")


async def check_routes(cluster: PicodataCluster, db: Any, reference: Reference) -> None:
    for key in SAMPLE_KEYS:
        bucket = cluster.bucket_of(key)
        writer = reference.writer(bucket)
        if writer is None:
            with pytest.raises(NoWorkersAvailable, match=f"bucket {bucket}"):
                await answered_by(cluster, db, key=key)
        else:
            assert await answered_by(cluster, db, key=key) == writer, (key, bucket)
        readers = reference.readers(bucket)
        if not readers:
            with pytest.raises(NoWorkersAvailable, match=f"bucket {bucket}"):
                await answered_by(cluster, db, key=key, read_only=True)
        else:
            assert await answered_by(cluster, db, key=key, read_only=True) in readers
    if reference.anyone():
        assert await answered_by(cluster, db) in reference.anyone()


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=st.lists(steps, min_size=1, max_size=6))
def test_routed_queries_follow_catalog_histories(
    picodata_cluster: PicodataCluster, history: list[tuple[Any, ...]]
) -> None:
    cluster = picodata_cluster
    cluster.reset()
    reference = Reference()

    async def scenario() -> None:
        async with connect(cluster, strict=True, route_wait=0.2) as db:
            await check_routes(cluster, db, reference)
            for step in history:
                apply_step(cluster, reference, step)
                await db.refresh()
                await check_routes(cluster, db, reference)

    asyncio.run(asyncio.wait_for(scenario(), 30))
