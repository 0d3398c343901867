"""PollingSource against a real PostgreSQL holding a Picodata-like catalog
(tests/support/picodata_catalog).

The seed's three cases as catalog changes between polls, with ``find_bucket_master`` answering
as the seed says after each step; partial and failed polls; the soak.
"""

from __future__ import annotations

import asyncio
import functools
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from shardline import InstanceEvent, ReplicasetEvent, Topology
from shardline.topology.sources import (
    BucketPayload,
    PollingSource,
    TopologyChange,
    TopologySnapshot,
    apply_change,
)
from support.parked import parked
from support.pg_server import PgServer, with_params
from support.picodata_catalog import Catalog, Expected, name_uuid, topology_state
from support.polling import owners, run_polled, seed_tier, started
from support.replicasets import rs_uuid
from support.waiting import until

T = TypeVar("T")


# the first poll


async def test_first_poll_rebuilds_the_topology_from_the_catalog(catalog: Catalog) -> None:
    seed_tier(catalog, 3)

    async def scenario(topology: Topology, source: PollingSource) -> None:
        await started(source)
        assert await source.refresh()
        assert topology_state(topology) == catalog.expected()
        assert topology.tiers == {"default": 3000}
        assert owners(topology, 1, 1000, 1001, 2000, 2001, 3000) == [
            "r1", "r1", "r2", "r2", "r3", "r3",
        ]  # fmt: skip
        master = topology.find_bucket_master("default", 1)
        assert master is not None
        assert master.is_online
        assert master.address
        state = source.state
        assert state.connected
        assert state.server is not None
        assert state.connects == 1
        assert state.refreshes >= 1
        assert state.last_refresh is not None
        assert dict(state.failures) == {}
        assert state.events_applied > 0

    await run_polled(catalog.dsn, scenario)


async def test_an_unchanged_catalog_hands_out_only_bucket_snapshots_and_applies_nothing(
    catalog: Catalog,
) -> None:
    seed_tier(catalog, 2)

    async def scenario(topology: Topology, source: PollingSource) -> None:
        await started(source)
        await source.refresh()
        epoch, applied = topology.epoch("default"), source.state.events_applied
        for _ in range(3):
            assert await source.refresh()
        assert topology.epoch("default") == epoch
        assert source.state.events_applied == applied

    await run_polled(catalog.dsn, scenario)


# the seed's three cases, step by step, through the changes the source hands out


async def step_by_step(
    catalog: Catalog,
    steps: list[tuple[Callable[[], None], Callable[[Topology, list[TopologyChange]], None]]],
) -> None:
    """Polls once, then for each step changes the catalog, polls once and checks the changes
    that poll handed out and the topology after applying them."""
    topology = Topology()
    handed_out: list[TopologyChange] = []

    async def consume(source: PollingSource) -> None:
        async for change in source:
            apply_change(topology, change)
            handed_out.append(change)

    async with PollingSource(catalog.dsn, interval=60) as source:
        task = asyncio.create_task(consume(source))
        await started(source)
        assert await source.refresh()
        assert isinstance(handed_out[0], TopologySnapshot)
        for change_catalog, check in steps:
            change_catalog()
            handed_out.clear()
            await source.refresh()
            check(topology, list(handed_out))
    await asyncio.wait_for(task, 10)


def kinds(changes: list[TopologyChange]) -> list[str]:
    out = []
    for change in changes:
        if isinstance(change, ReplicasetEvent | InstanceEvent):
            out.append(f"{type(change).__name__[:-5].lower()} {change.op}")
        else:
            out.append(type(change).__name__)
    return out


async def test_seed_case_expel_a_replicaset(catalog: Catalog) -> None:
    # R1(1-1000), R2(1001-2000), R3(2001-3000); R2 is expelled and its buckets spread over R1, R3
    seed_tier(catalog, 3)

    def expel_r2_while_rebalancing() -> None:
        with catalog.transaction():
            catalog.expel_replicaset("r2")
            catalog.fail_buckets("default")

    def r2_gone_and_the_map_cleared(topology: Topology, changes: list[TopologyChange]) -> None:
        assert kinds(changes) == ["replicaset delete", "instance delete"]
        assert rs_uuid(2) not in topology.replicasets
        # the map can no longer be trusted: unknown, not stale, until buckets arrive
        assert owners(topology, 1, 1500, 2500) == [None, None, None]

    def rebalance_done() -> None:
        with catalog.transaction():
            catalog.heal_buckets("default")
            catalog.rebalance("default")
        assert catalog.expected().maps["default"] == [
            (1, 1500, rs_uuid(1)),
            (1501, 3000, rs_uuid(3)),
        ]

    def r1_and_r3_share_the_buckets(topology: Topology, changes: list[TopologyChange]) -> None:
        assert kinds(changes) == ["BucketSnapshot"]
        assert owners(topology, 1, 1500, 1501, 3000) == ["r1", "r1", "r3", "r3"]
        assert topology_state(topology) == catalog.expected()

    await step_by_step(
        catalog,
        [
            (expel_r2_while_rebalancing, r2_gone_and_the_map_cleared),
            (rebalance_done, r1_and_r3_share_the_buckets),
        ],
    )


async def test_seed_case_add_a_replicaset(catalog: Catalog) -> None:
    # R1(1-1500), R2(1501-3000); R3 joins and the buckets spread over the three
    seed_tier(catalog, 2)

    def add_r3_while_rebalancing() -> None:
        with catalog.transaction():
            catalog.add_replicaset("r3", uuid=rs_uuid(3))
            catalog.fail_buckets("default")

    def r3_known_and_the_map_cleared(topology: Topology, changes: list[TopologyChange]) -> None:
        assert kinds(changes) == ["replicaset replace", "instance replace"]
        assert topology.replicasets[rs_uuid(3)].tier == "default"
        assert owners(topology, 1, 1501, 3000) == [None, None, None]

    def rebalance_done() -> None:
        with catalog.transaction():
            catalog.heal_buckets("default")
            catalog.rebalance("default")
        assert catalog.expected().maps["default"] == [
            (1, 1000, rs_uuid(1)),
            (1001, 2000, rs_uuid(2)),
            (2001, 3000, rs_uuid(3)),
        ]

    def three_thirds(topology: Topology, changes: list[TopologyChange]) -> None:
        assert kinds(changes) == ["BucketSnapshot"]
        assert owners(topology, 1, 1000, 1001, 2000, 2001, 3000) == [
            "r1", "r1", "r2", "r2", "r3", "r3",
        ]  # fmt: skip
        assert topology_state(topology) == catalog.expected()

    await step_by_step(
        catalog,
        [
            (add_r3_while_rebalancing, r3_known_and_the_map_cleared),
            (rebalance_done, three_thirds),
        ],
    )


async def test_seed_case_change_weights(catalog: Catalog) -> None:
    # R1, R2, R3 with equal weights; the weights become 1:1:2 and buckets move 0.25/0.25/0.5
    seed_tier(catalog, 3)

    def reweigh_while_rebalancing() -> None:
        with catalog.transaction():
            catalog.set_weight("r3", 2.0)
            catalog.fail_buckets("default")

    def nothing_changes(topology: Topology, changes: list[TopologyChange]) -> None:
        # no replicaset event for a weight; the source never clears a map on its own
        assert kinds(changes) == []
        assert owners(topology, 1, 1000, 1001, 2000, 2001, 3000) == [
            "r1", "r1", "r2", "r2", "r3", "r3",
        ]  # fmt: skip

    def rebalance_done() -> None:
        with catalog.transaction():
            catalog.heal_buckets("default")
            catalog.rebalance("default")
        assert catalog.expected().maps["default"] == [
            (1, 750, rs_uuid(1)),
            (751, 1500, rs_uuid(2)),
            (1501, 3000, rs_uuid(3)),
        ]

    def quarter_quarter_half(topology: Topology, changes: list[TopologyChange]) -> None:
        assert kinds(changes) == ["BucketSnapshot"]
        assert owners(topology, 1, 750, 751, 1500, 1501, 3000) == [
            "r1", "r1", "r2", "r2", "r3", "r3",
        ]  # fmt: skip
        assert topology_state(topology) == catalog.expected()

    await step_by_step(
        catalog,
        [
            (reweigh_while_rebalancing, nothing_changes),
            (rebalance_done, quarter_quarter_half),
        ],
    )


async def test_the_seed_cases_in_one_poll_each(catalog: Catalog) -> None:
    """Without a rebalance window, each case is one poll: the final answers at once."""
    seed_tier(catalog, 3)

    async def scenario(topology: Topology, source: PollingSource) -> None:
        await started(source)
        assert await source.refresh()
        with catalog.transaction():
            catalog.expel_replicaset("r2")
            catalog.rebalance("default")
        assert await source.refresh()
        assert owners(topology, 1500, 1501) == ["r1", "r3"]
        with catalog.transaction():
            catalog.add_replicaset("r2", uuid=rs_uuid(2))
            catalog.rebalance("default")
        assert await source.refresh()
        assert owners(topology, 1000, 1001, 2001) == ["r1", "r2", "r3"]
        with catalog.transaction():
            catalog.set_weight("r3", 2.0)
            catalog.rebalance("default")
        assert await source.refresh()
        assert owners(topology, 750, 751, 1500, 1501) == ["r1", "r2", "r2", "r3"]
        assert topology_state(topology) == catalog.expected()

    await run_polled(catalog.dsn, scenario)


# instances and replicasets


async def test_instance_and_replicaset_changes_become_events(catalog: Catalog) -> None:
    seed_tier(catalog, 2)

    async def scenario(topology: Topology, source: PollingSource) -> None:
        await started(source)
        assert await source.refresh()
        epoch = topology.epoch("default")
        second = catalog.add_instance("r1_2", "r1")
        catalog.switch_master("r1", "r1_2")
        catalog.set_state("r2_1", "Offline")
        catalog.set_address("r1_1", "10.0.0.9:4327")
        assert await source.refresh()
        assert topology_state(topology) == catalog.expected()
        master = topology.find_bucket_master("default", 1)
        assert master is not None
        assert master.uuid == second
        offline = topology.find_bucket_master("default", 3000)
        assert offline is not None
        assert not offline.is_online
        assert topology.instances[name_uuid("r1_1")].address == "10.0.0.9:4327"
        assert topology.epoch("default") == epoch  # master switches leave the map alone
        catalog.switch_master("r1", "r1_1")
        catalog.expel_instance("r1_2")
        assert await source.refresh()
        assert second not in topology.instances
        assert topology_state(topology) == catalog.expected()

    await run_polled(catalog.dsn, scenario)


async def test_an_instance_that_loses_its_address_loses_it_in_the_topology(
    catalog: Catalog,
) -> None:
    seed_tier(catalog, 1)

    async def scenario(topology: Topology, source: PollingSource) -> None:
        await started(source)
        assert await source.refresh()
        catalog._run("DELETE FROM _pico_peer_address WHERE connection_type = 'pgproto'")
        assert await source.refresh()
        assert topology.instances[name_uuid("r1_1")].address is None
        assert topology_state(topology) == catalog.expected()

    await run_polled(catalog.dsn, scenario)


async def test_tiers_limits_what_is_followed(catalog: Catalog) -> None:
    seed_tier(catalog, 2)
    seed_tier(catalog, 1, "other", first=3)

    async def scenario(topology: Topology, source: PollingSource) -> None:
        await started(source)
        assert await source.refresh()
        assert topology.tiers == {"other": 3000}
        assert set(topology.replicasets) == {rs_uuid(3)}
        assert owners(topology, 1, tier="other") == ["r3"]

    await run_polled(catalog.dsn, scenario, tiers=["other"])


async def test_a_tier_asked_for_but_missing_is_counted(catalog: Catalog) -> None:
    seed_tier(catalog, 1)

    async def scenario(topology: Topology, source: PollingSource) -> None:
        await started(source)
        assert not await source.refresh()
        assert source.state.failures["unknown-tier"] >= 1
        assert owners(topology, 1) == ["r1"]

    await run_polled(catalog.dsn, scenario, tiers=["default", "nope"])


async def test_a_tier_added_after_the_first_poll_is_reported_not_followed(catalog: Catalog) -> None:
    seed_tier(catalog, 2)

    async def scenario(topology: Topology, source: PollingSource) -> None:
        await started(source)
        assert await source.refresh()
        seed_tier(catalog, 1, "late", first=3)
        with catalog.transaction():
            catalog.expel_replicaset("r2")
            catalog.rebalance("default")
        assert not await source.refresh()
        assert source.state.failures["unknown-tier"] == 1
        assert "late" in (source.state.last_failure or "")
        assert owners(topology, 1, 3000) == ["r1", "r1"]  # the rest is followed
        assert rs_uuid(3) in topology.replicasets

    await run_polled(catalog.dsn, scenario)


@pytest.mark.parametrize("sql_type", ["json", "jsonb"])
async def test_a_json_typed_pico_bucket_still_reaches_the_topology_as_text(
    catalog: Catalog, sql_type: str
) -> None:
    seed_tier(catalog, 2)
    with catalog.transaction():
        catalog._run("ALTER FUNCTION _pico_bucket(text) RENAME TO _pico_bucket_text")
        catalog._run(
            f"CREATE FUNCTION _pico_bucket(tier text) RETURNS {sql_type} LANGUAGE sql STABLE"
            f" AS $$ SELECT _pico_bucket_text(tier)::{sql_type} $$"
        )

    async def main() -> list[TopologyChange]:
        topology, handed_out = Topology(), []
        async with PollingSource(catalog.dsn, interval=60) as source:
            async for change in source:
                apply_change(topology, change)
                handed_out.append(change)
                break
        assert owners(topology, 1, 3000) == ["r1", "r2"]
        return handed_out

    (snapshot,) = await main()
    assert isinstance(snapshot, TopologySnapshot)
    assert [type(b.payload) for b in snapshot.buckets] == [BucketPayload]
    assert [
        type(b.payload.text) for b in snapshot.buckets if isinstance(b.payload, BucketPayload)
    ] == [str]


async def test_address_type_chooses_the_address(catalog: Catalog) -> None:
    seed_tier(catalog, 1)

    async def iproto(topology: Topology, source: PollingSource) -> None:
        await started(source)
        assert await source.refresh()
        address = topology.instances[name_uuid("r1_1")].address
        assert address is not None
        assert int(address.rsplit(":", 1)[1]) > 10_000  # the catalog's iproto ports

    await run_polled(catalog.dsn, iproto, address_type="iproto")

    async def ambiguous(topology: Topology, source: PollingSource) -> None:
        await started(source)
        assert not await source.refresh()
        assert "two addresses" in (source.state.last_failure or "")

    # without a connection_type filter, an instance with two addresses is ambiguous
    await run_polled(catalog.dsn, ambiguous, address_type=None)


# failed and partial polls


def two_tiers(catalog: Catalog) -> None:
    seed_tier(catalog, 2)
    seed_tier(catalog, 2, "other", first=3)


async def test_pico_bucket_raising_for_one_tier_keeps_that_map_and_applies_the_rest(
    catalog: Catalog,
) -> None:
    two_tiers(catalog)

    async def scenario(topology: Topology, source: PollingSource) -> None:
        await started(source)
        assert await source.refresh()
        other_before = topology.ranges("other")
        with catalog.transaction():
            catalog.fail_buckets("other")
            catalog.set_buckets("other", [(1, 3000, rs_uuid(4))])
            catalog.set_buckets("default", [(1, 3000, rs_uuid(2))])
            catalog.set_state("r1_1", "Offline")
        assert not await source.refresh()
        assert source.state.failures["bucket-error"] == 1
        assert "rebalance in progress" in (source.state.last_failure or "")
        assert topology.ranges("other") == other_before
        assert owners(topology, 1) == ["r2"]
        assert not topology.instances[name_uuid("r1_1")].is_online
        refreshes = source.state.refreshes
        catalog.heal_buckets("other")
        # retried by itself, without a refresh()
        await until(lambda: source.state.refreshes != refreshes, "a retry of its own")
        assert owners(topology, 1, tier="other") == ["r4"]
        assert topology_state(topology) == catalog.expected()

    await run_polled(catalog.dsn, scenario, retry=0.01)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ('[{"bucket_id_start": 1,', "not valid JSON"),
        ('{"bucket_id_start": 1}', "JSON array"),
        (
            '[{"bucket_id_start": 1, "bucket_id_end": 3001, "tier_name": "default",'
            f' "state": "active", "current_replicaset_uuid": "{rs_uuid(1)}"}}]',
            "3001",
        ),
        (
            '[{"bucket_id_start": 1, "bucket_id_end": 10, "tier_name": "default",'
            ' "state": "active", "current_replicaset_uuid": "r1"}]',
            "'r1'",
        ),
        ("", "not valid JSON"),
    ],
)
async def test_a_malformed_bucket_map_keeps_the_old_map(
    catalog: Catalog, payload: str, message: str
) -> None:
    seed_tier(catalog, 2)

    async def scenario(topology: Topology, source: PollingSource) -> None:
        await started(source)
        assert await source.refresh()
        before, epoch = topology.ranges("default"), topology.epoch("default")
        with catalog.transaction():
            catalog.serve_raw_buckets("default", payload)
            catalog.set_state("r1_1", "Offline")
        assert not await source.refresh()
        assert source.state.failures["malformed-buckets"] == 1
        assert message in (source.state.last_failure or "")
        assert topology.ranges("default") == before
        assert topology.epoch("default") == epoch
        assert not topology.instances[name_uuid("r1_1")].is_online  # the rest applied
        catalog.heal_buckets("default")
        assert await source.refresh()
        assert topology_state(topology) == catalog.expected()

    await run_polled(catalog.dsn, scenario)


@pytest.mark.parametrize(
    ("table", "column", "value", "where", "key", "message"),
    [
        ("_pico_replicaset", "uuid", "not-a-uuid", "name", "r2", "uuid must be a UUID"),
        ("_pico_instance", "current_state", '["Online", 1', "name", "r1_1", "not JSON"),
        ("_pico_instance", "current_state", "[]", "name", "r1_1", "[state, incarnation]"),
        ("_pico_instance", "uuid", "", "name", "r1_1", "non-empty string"),
        ("_pico_instance", "uuid", name_uuid("r2_1"), "name", "r1_1", "duplicate"),
        ("_pico_instance", "replicaset_uuid", "x" * 2000, "name", "r1_1", "over the limit"),
    ],
)
async def test_a_malformed_row_fails_the_poll_and_changes_nothing(
    catalog: Catalog, table: str, column: str, value: str, where: str, key: str, message: str
) -> None:
    seed_tier(catalog, 2)

    async def scenario(topology: Topology, source: PollingSource) -> None:
        await started(source)
        assert await source.refresh()
        before = topology_state(topology)
        epoch = topology.epoch("default")
        with catalog.transaction():
            catalog.add_replicaset("r3", uuid=rs_uuid(3))
            catalog.rebalance("default")
            catalog._run(f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {table}_{column}_key")
            catalog.set_raw(table, column, value, where, key)
        assert not await source.refresh()
        failures = source.state.failures
        assert failures.get("malformed-row", 0) + failures.get("too-large", 0) == 1
        assert message in (source.state.last_failure or "")
        assert topology_state(topology) == before
        assert topology.epoch("default") == epoch

    await run_polled(catalog.dsn, scenario)


async def test_a_poll_failing_half_way_through_the_tables_changes_nothing(catalog: Catalog) -> None:
    seed_tier(catalog, 2)

    async def scenario(topology: Topology, source: PollingSource) -> None:
        await started(source)
        assert await source.refresh()
        before = topology_state(topology)
        with catalog.transaction():
            # _pico_tier and _pico_replicaset read fine, _pico_instance fails
            catalog.add_replicaset("r3", uuid=rs_uuid(3))
            catalog.rebalance("default")
            catalog._run("ALTER TABLE _pico_instance RENAME TO _pico_instance_away")
        assert not await source.refresh()
        assert source.state.failures["query-error"] == 1
        assert "_pico_instance" in (source.state.last_failure or "")
        assert topology_state(topology) == before
        assert source.state.connected  # an error answer keeps the connection
        catalog._run("ALTER TABLE _pico_instance_away RENAME TO _pico_instance")
        assert await source.refresh()
        assert topology_state(topology) == catalog.expected()
        assert source.state.connects == 1

    await run_polled(catalog.dsn, scenario)


async def test_a_connection_killed_mid_poll(pg: PgServer, catalog: Catalog) -> None:
    two_tiers(catalog)
    name = f"killed-{catalog.schema}"

    async def scenario(topology: Topology, source: PollingSource) -> None:
        await started(source)
        assert await source.refresh()
        other_before = topology.ranges("other")
        with catalog.transaction():
            catalog.set_buckets("default", [(1, 3000, rs_uuid(2))])
            catalog.set_buckets("other", [(1, 3000, rs_uuid(4))])
            catalog.set_state("r3_1", "Offline")
            catalog.delay_buckets("other", 30)  # "default" is read before "other"
        refresh = asyncio.create_task(source.refresh())
        await asyncio.to_thread(wait_for_query, pg, name, "_pico_bucket")
        assert pg.terminate_backends(catalog.database, application_name=name) == 1
        assert not await asyncio.wait_for(refresh, 10)
        state = source.state
        assert state.failures["connection-lost"] == 1
        assert not state.connected
        # everything read before the connection died is applied, the rest keeps its map
        assert owners(topology, 1) == ["r2"]
        assert not topology.instances[name_uuid("r3_1")].is_online
        assert topology.ranges("other") == other_before
        catalog.heal_buckets("other")
        assert await source.refresh()
        assert source.state.connects == 2
        assert topology_state(topology) == catalog.expected()

    await run_polled(
        catalog.dsn, scenario, connect_kwargs={"server_settings": {"application_name": name}}
    )


async def test_sessions_are_named_shardline_unless_the_dsn_names_them(
    pg: PgServer, catalog: Catalog
) -> None:
    seed_tier(catalog, 1)
    given = f"dsn-{catalog.schema}"

    def names() -> list[str]:
        with pg.connect() as admin:
            rows = admin.execute(
                "SELECT application_name FROM pg_stat_activity"
                " WHERE datname = %s AND application_name IN ('shardline', %s)",
                (catalog.database, given),
            ).fetchall()
        return [name for (name,) in rows]

    async def named(expected: str, topology: Topology, source: PollingSource) -> None:
        await started(source)
        assert await source.refresh()
        # the database is shared: a backend whose client (an earlier test's, or the first
        # run's) has closed is listed until it has exited, a moment later
        deadline = time.monotonic() + 10
        while (seen := await asyncio.to_thread(names)) != [expected]:
            assert time.monotonic() < deadline, seen
            await asyncio.sleep(0.01)

    await run_polled(catalog.dsn, functools.partial(named, "shardline"))
    await run_polled(
        with_params(catalog.dsn, application_name=given), functools.partial(named, given)
    )


def wait_for_query(pg: PgServer, application_name: str, fragment: str) -> None:
    """Blocks until a session named ``application_name`` runs a query containing ``fragment``."""
    deadline = time.monotonic() + 10
    with pg.connect() as connection:
        while time.monotonic() < deadline:
            row = connection.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
                " AND state = 'active' AND query LIKE %s",
                (application_name, f"%{fragment}%"),
            ).fetchone()
            if row and row[0]:
                return
            time.sleep(0.005)
    raise AssertionError(f"no session ran {fragment!r}")


async def test_a_poll_over_its_timeout_fails_and_reconnects(catalog: Catalog) -> None:
    seed_tier(catalog, 1)

    async def scenario(topology: Topology, source: PollingSource) -> None:
        await started(source)
        assert await source.refresh()
        catalog.delay_buckets("default", 5)
        assert not await source.refresh()
        assert source.state.failures["timeout"] == 1
        catalog.heal_buckets("default")
        assert await source.refresh()
        assert owners(topology, 1) == ["r1"]

    await run_polled(catalog.dsn, scenario, timeout=0.5)


async def test_row_and_payload_bounds(catalog: Catalog) -> None:
    seed_tier(catalog, 3)

    async def too_many_rows(topology: Topology, source: PollingSource) -> None:
        await started(source)
        assert not await source.refresh()
        assert source.state.failures["too-large"] >= 1
        assert topology.replicasets == {}

    await run_polled(catalog.dsn, too_many_rows, max_rows=2)

    async def too_long_a_map(topology: Topology, source: PollingSource) -> None:
        await started(source)
        assert not await source.refresh()
        assert source.state.failures["too-large"] >= 1
        assert "max_payload" in (source.state.last_failure or "")
        assert len(topology.replicasets) == 3
        assert topology.ranges("default") == []

    await run_polled(catalog.dsn, too_long_a_map, max_payload=100)


async def test_a_wrong_password_is_a_connect_failure_and_credentials_pass_through(
    pg: PgServer, catalog: Catalog
) -> None:
    seed_tier(catalog, 1)
    schema, database = catalog.schema, catalog.database
    reader = f"reader_{schema}"
    with pg.connect(database) as admin:
        admin.execute(f"CREATE ROLE {reader} LOGIN PASSWORD 'secret'")
        admin.execute(f"GRANT USAGE ON SCHEMA {schema} TO {reader}")
        admin.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {reader}")
        admin.execute(f"ALTER ROLE {reader} SET search_path = {schema}")

    async def refused(topology: Topology, source: PollingSource) -> None:
        await started(source)
        assert not await source.refresh()
        assert source.state.failures["connect"] >= 1
        assert "password" in (source.state.last_failure or "")
        assert not source.state.connected

    await run_polled(pg.dsn_for(database, user=reader, password="wrong"), refused, retry=0.05)

    async def accepted(topology: Topology, source: PollingSource) -> None:
        await started(source)
        assert await source.refresh()
        assert owners(topology, 1) == ["r1"]

    dsn = pg.dsn_for(database, user=reader, password=None)
    await run_polled(dsn, accepted, connect_kwargs={"password": "secret"})


# the soak


async def test_soak_1000_polls_against_a_changing_catalog(catalog: Catalog) -> None:
    seed_tier(catalog, 3)
    seed_tier(catalog, 2, "other", first=4)
    rng = random.Random(6)
    next_rs = iter(range(6, 10_000))
    live: dict[str, list[str]] = {"default": ["r1", "r2", "r3"], "other": ["r4", "r5"]}

    def change(expected: Expected) -> None:
        tier = rng.choice(["default", "other"])
        members = live[tier]
        action = rng.randrange(9)
        with catalog.transaction():
            if action == 0 and len(members) < 5:
                name = f"r{next(next_rs)}"
                catalog.add_replicaset(name, tier, instances=rng.randint(1, 2))
                members.append(name)
                catalog.rebalance(tier)
            elif action == 1 and len(members) > 1:
                name = members.pop(rng.randrange(len(members)))
                catalog.expel_replicaset(name)
                catalog.rebalance(tier)
            elif action == 2:
                catalog.set_weight(rng.choice(members), rng.choice([0.5, 1.0, 2.0, 3.0]))
                catalog.rebalance(tier)
            elif action == 3:
                name = rng.choice(members)
                catalog.add_instance(f"{name}_{next(next_rs)}", name)
            elif action == 4:
                instance = rng.choice(sorted(expected.instances))
                catalog.set_raw(
                    "_pico_instance",
                    "current_state",
                    f'["{rng.choice(["Online", "Offline"])}", 3]',
                    "uuid",
                    instance,
                )
            elif action == 5:
                instance = rng.choice(sorted(expected.instances))
                catalog._run(
                    "UPDATE _pico_peer_address SET address = %s WHERE connection_type = 'pgproto'"
                    " AND raft_id = (SELECT raft_id FROM _pico_instance WHERE uuid = %s)",
                    (f"10.1.{rng.randrange(256)}.{rng.randrange(256)}:4327", instance),
                )
            elif action == 6:
                rows = catalog._rows(
                    "SELECT name FROM _pico_instance WHERE replicaset_name = %s ORDER BY name",
                    (rng.choice(members),),
                )
                catalog._run(
                    "UPDATE _pico_replicaset SET current_master_name = %s"
                    " WHERE name = (SELECT replicaset_name FROM _pico_instance WHERE name = %s)",
                    (rng.choice(rows)[0], rows[0][0]),
                )
            elif action == 7:
                ranges = expected.maps[tier]
                if len(ranges) > 1:  # move one boundary
                    i = rng.randrange(len(ranges) - 1)
                    (s1, _e1, o1), (_s2, e2, o2) = ranges[i], ranges[i + 1]
                    cut = rng.randint(s1, e2 - 1)
                    moved = [*ranges[:i], (s1, cut, o1), (cut + 1, e2, o2), *ranges[i + 2 :]]
                    catalog.set_buckets(tier, moved)
            # action 8: nothing changes

    async def scenario(topology: Topology, source: PollingSource) -> None:
        await started(source)
        assert await source.refresh()
        expected = catalog.expected()
        started_at = time.perf_counter()
        for poll in range(1000):
            change(expected)
            assert await source.refresh(), source.state.last_failure
            expected = catalog.expected()
            assert topology_state(topology) == expected, f"after poll {poll}"
        elapsed = time.perf_counter() - started_at
        state = source.state
        assert dict(state.failures) == {}
        assert state.connects == 1
        print(f"soak: {elapsed / 1000 * 1e3:.2f} ms per change + poll + check")

    await run_polled(catalog.dsn, scenario)


# the loop itself


async def test_trigger_polls_early_and_the_interval_polls_by_itself(catalog: Catalog) -> None:
    seed_tier(catalog, 1)

    async def scenario(topology: Topology, source: PollingSource) -> None:
        await started(source)
        assert await source.refresh()
        attempts = source.state.attempts
        source.trigger()
        await until(lambda: source.state.attempts != attempts, "the triggered poll")
        assert source.state.attempts == attempts + 1

    await run_polled(catalog.dsn, scenario, min_interval=0.01)

    async def by_itself(topology: Topology, source: PollingSource) -> None:
        await until(lambda: source.state.refreshes >= 3, "three polls of its own")
        assert source.state.refreshes >= 3

    await run_polled(catalog.dsn, by_itself, interval=0.05)


async def test_a_trigger_during_a_failing_poll_gets_a_poll_of_its_own(catalog: Catalog) -> None:
    # a routing miss during a poll that then fails must still be followed by a poll, which
    # reads the catalog as it is after the miss, though retry would wait a minute
    seed_tier(catalog, 1)

    async def scenario(topology: Topology, source: PollingSource) -> None:
        await started(source)
        assert await source.refresh()
        catalog.fail_buckets("default", delay=0.5)
        attempts = source.state.attempts
        failing = asyncio.create_task(source.refresh())
        await until(lambda: source.state.attempts > attempts, "the failing poll")
        assert not failing.done()  # the poll is in flight, held in _pico_bucket
        source.trigger()
        assert not await failing
        await until(lambda: source.state.attempts > attempts + 1, "the poll the trigger asked for")

    await run_polled(catalog.dsn, scenario, retry=60.0, min_interval=0.0)


async def test_refresh_needs_a_consumer_and_a_source_has_one_at_a_time(catalog: Catalog) -> None:

    source = PollingSource(catalog.dsn)
    with pytest.raises(RuntimeError, match="run"):
        await source.refresh()
    changes = source.__aiter__()
    with pytest.raises(RuntimeError, match="already"):
        source.__aiter__()
    await changes.aclose()  # type: ignore[attr-defined]
    await source.aclose()
    with pytest.raises(RuntimeError, match="closed"):
        source.__aiter__()


async def test_aclose_ends_run_and_answers_waiting_refreshes(catalog: Catalog) -> None:
    seed_tier(catalog, 1)
    catalog.delay_buckets("default", 30)

    topology = Topology()
    source = PollingSource(catalog.dsn, interval=60)
    task = asyncio.create_task(source.run(topology))
    await started(source)
    refresh = asyncio.create_task(source.refresh())
    await parked(refresh, "refresh")  # it waits for the poll after the delayed one
    await source.aclose()
    assert await asyncio.wait_for(refresh, 5) is False
    await asyncio.wait_for(task, 5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"interval": 0}, "interval"),
        ({"interval": float("nan")}, "interval"),
        ({"timeout": -1}, "timeout"),
        ({"retry": "1"}, "retry"),
        ({"min_interval": -0.1}, "min_interval"),
        ({"tiers": "default"}, "tiers"),
        ({"tiers": []}, "tiers"),
        ({"tiers": ["default", ""]}, "tiers"),
        ({"max_rows": 0}, "max_rows"),
        ({"max_payload": True}, "max_payload"),
        ({"address_type": ""}, "address_type"),
        ({"connect_kwargs": {"timeout": 1}}, "timeout"),
        ({"connect_kwargs": {"dsn": "postgresql://x"}}, "dsn"),
        ({"connect_kwargs": {"application_name": "x"}}, "does not take: application_name"),
        ({"connect_kwargs": {"server_settings": {"application_name": 1}}}, "server_settings"),
    ],
)
def test_arguments_are_validated(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PollingSource("postgresql://127.0.0.1", **kwargs)


@pytest.mark.parametrize(
    ("dsn", "message"),
    [
        ("host=127.0.0.1 port=5432", "dsn must be a postgresql:// or postgres:// URI.*no scheme"),
        ("mysql://127.0.0.1", "scheme 'mysql'"),
        ("postgresql://127.0.0.1:port/db", "dsn has a port that is not a number: 'port'"),
        ("postgresql://127.0.0.1/db?sslmode", "dsn has a malformed query string"),
        (None, "dsn must be a str"),
    ],
)
def test_a_dsn_that_does_not_parse_is_refused(dsn: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PollingSource(dsn)


def test_a_password_in_the_dsn_stays_out_of_the_error() -> None:
    with pytest.raises(ValueError, match="dsn") as refused:
        PollingSource("host=127.0.0.1 password=secret")
    assert "secret" not in str(refused.value)


@pytest.mark.parametrize(
    ("dsn", "server"),
    [
        ("postgresql://u:secret@db.example:4327/app", "db.example:4327"),
        ("postgres://u@[::1]:5432,10.0.0.2:5433/app", "[::1]:5432,10.0.0.2:5433"),
        ("postgresql:///app?host=/run/postgresql&port=5433", "/run/postgresql:5433"),
        ("postgresql://", "localhost"),
    ],
)
def test_the_source_is_logged_as_the_dsn_hosts_without_credentials(dsn: str, server: str) -> None:
    assert PollingSource(dsn)._recorder.name == f"PollingSource({server})"
