"""Literal catalog rows and ``_pico_bucket`` payloads, as Picodata's own docs and tests show them,
read through ``Membership.from_rows`` and ``BucketPayload`` into the events a driver hands out.

Each literal names its source (repository picodata/picodata unless said otherwise). Full rows
are written in the table's column order and projected onto the columns our queries select, by
name, so a query naming a column Picodata does not have fails here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest

from shardline import (
    InstanceEvent,
    ReplicasetEvent,
    TierWithoutBuckets,
    Topology,
)
from shardline.topology.sources import (
    BucketPayload,
    BucketSnapshot,
    TopologySnapshot,
    apply_change,
)
from shardline.topology.sources.membership import (
    ADDRESSES_OF_TYPE_QUERY,
    INSTANCES_QUERY,
    REPLICASETS_QUERY,
    TIERS_QUERY,
    Membership,
)
from support.picodata_catalog import Catalog, name_uuid

# Column orders: the system tables' reference in Picodata's docs ("Описание соответствует
# версии Picodata 25.5.0"), also src/tier.rs Tier::format and src/replicaset.rs
# Replicaset::format. Trailing columns the rows below do not need are left out.
TIER_COLUMNS = (
    "name",
    "replication_factor",
    "can_vote",
    "current_vshard_config_version",
    "target_vshard_config_version",
    "vshard_bootstrapped",
    "bucket_count",
    "is_default",
)
REPLICASET_COLUMNS = (
    "name",
    "uuid",
    "current_master_name",
    "target_master_name",
    "tier",
    "weight",
    "weight_origin",
    "state",
)
INSTANCE_COLUMNS = (
    "name",
    "uuid",
    "raft_id",
    "replicaset_name",
    "replicaset_uuid",
    "current_state",
    "target_state",
    "failure_domain",
    "tier",
)
PEER_ADDRESS_COLUMNS = ("raft_id", "address", "connection_type")

# The replicaset uuids of the bucket-map issue's example of SELECT _pico_bucket('default')
# (seed 002), so that the payload below maps buckets to the replicasets here.
R1 = "31f6051e-13aa-43fb-beb2-ae17155ac810"
R2 = "efb27727-df65-42bd-9ca4-001efea63d33"
# test/int/test_basics.py test_raft_log: the first instance's uuid and its replicaset's
R3 = "e0df68c5-e7f9-395f-86b3-30ad9e1b7b07"
I1 = "68d4a766-4144-3248-aeb4-e212356716e4"
# made up, for the instances no source names
I2 = "4b8a4e84-7e43-4d5c-9d0a-5b8a0d5f2e11"
I3 = "9a1c2f33-5c1e-4a77-8a0e-3f6b7d9e4c22"

# _pico_tier: test/int/test_expelling.py test_expel_zero_bucket_tier configures an "arbiter"
# tier with bucket_count 0 (vshard_bootstrapped stays false) beside a storage tier; 3000 is
# the default bucket count (test/pgproto/_pico_bucket_function_test.py DEFAULT_BUCKET_COUNT).
TIERS = [
    ("arbiter", 1, True, 1, 1, False, 0, False),
    ("default", 1, False, 1, 1, True, 3000, True),
]

# _pico_replicaset: the row of test/int/test_basics.py test_raft_log (weight 0.0, "auto",
# "not-ready", made "ready" with weight 1.0 by the governor), for three replicasets.
REPLICASETS = [
    ("r1", R1, "i1", "i1", "default", 1.0, "auto", "ready"),
    ("r2", R2, "i2", "i2", "default", 1.0, "auto", "ready"),
    ("arbiter_1", R3, "i3", "i3", "arbiter", 0.0, "auto", "ready"),
]

# _pico_instance: test_raft_log's row, current_state and target_state as [state, incarnation]
# arrays, failure_domain an empty map.
INSTANCES = [
    ("i1", I1, 1, "r1", R1, ["Online", 1], ["Online", 1], {}, "default"),
    ("i2", I2, 2, "r2", R2, ["Online", 1], ["Online", 1], {}, "default"),
    ("i3", I3, 3, "arbiter_1", R3, ["Online", 1], ["Online", 1], {}, "arbiter"),
]

# _pico_peer_address: one row per instance and connection type (primary key [raft_id,
# connection_type], docs above). Types: iproto and pgproto (docs, the guide to changing a
# stopped cluster's addresses: iproto ports from 3300, pgproto from 5436), http (CHANGELOG.md:
# the web UI reads HTTP addresses from this table) and a plugin listener, named
# "plugin:<plugin>.<service>" (a test/int plugin test reads
# "plugin:testplug_listener.listenerservice").
PEER_ADDRESSES = [
    row
    for raft_id in (1, 2, 3)
    for row in (
        (raft_id, f"127.0.0.1:{3300 + raft_id}", "iproto"),
        (raft_id, f"127.0.0.1:{5436 + raft_id}", "pgproto"),
        (raft_id, f"127.0.0.1:{8080 + raft_id}", "http"),
        (raft_id, f"127.0.0.1:{9000 + raft_id}", "plugin:testplug_listener.listenerservice"),
    )
]

# SELECT _pico_bucket('default'): the bucket-map issue's example (seed 002), verbatim.
PICO_BUCKET_DEFAULT = (
    '[{"bucket_id_start": 1, "target_replicaset_uuid": "31f6051e-13aa-43fb-beb2-ae17155ac810",'
    ' "tier_name": "default", "state": "active", "bucket_id_end": 1500,'
    ' "current_replicaset_uuid": "31f6051e-13aa-43fb-beb2-ae17155ac810"},'
    ' {"bucket_id_start": 1501, "target_replicaset_uuid": "efb27727-df65-42bd-9ca4-001efea63d33",'
    ' "tier_name": "default", "state": "active", "bucket_id_end": 3000,'
    ' "current_replicaset_uuid": "efb27727-df65-42bd-9ca4-001efea63d33"}]'
)


def selected(query: str) -> list[str]:
    """The column names a ``SELECT a, b FROM t`` query reads."""
    match = re.match(r"SELECT (.+?) FROM ", query)
    assert match, query
    return [name.strip() for name in match.group(1).split(",")]


def project(
    rows: Sequence[Sequence[Any]], columns: Sequence[str], query: str
) -> list[tuple[Any, ...]]:
    """The rows as ``query`` returns them: its columns, in its order."""
    indexes = [columns.index(name) for name in selected(query)]
    return [tuple(row[i] for i in indexes) for row in rows]


def membership(
    replicasets: Sequence[Sequence[Any]] = REPLICASETS,
    instances: Sequence[Sequence[Any]] = INSTANCES,
) -> Membership:
    assert "connection_type" in ADDRESSES_OF_TYPE_QUERY
    pgproto = [row for row in PEER_ADDRESSES if row[2] == "pgproto"]  # the query's WHERE
    return Membership.from_rows(
        project(TIERS, TIER_COLUMNS, TIERS_QUERY),
        project(replicasets, REPLICASET_COLUMNS, REPLICASETS_QUERY),
        project(instances, INSTANCE_COLUMNS, INSTANCES_QUERY),
        project(pgproto, PEER_ADDRESS_COLUMNS, ADDRESSES_OF_TYPE_QUERY),
    )


def with_state(rows: Sequence[Sequence[Any]], name: str, column: int, value: Any) -> list[Any]:
    return [(*row[:column], value, *row[column + 1 :]) if row[0] == name else row for row in rows]


def test_the_rows_become_the_events_of_the_whole_cluster() -> None:
    assert membership().tiers == {"arbiter": 0, "default": 3000}
    assert membership().events() == (
        (
            ReplicasetEvent("replace", R1, tier="default", current_master_uuid=I1, name="r1"),
            ReplicasetEvent("replace", R2, tier="default", current_master_uuid=I2, name="r2"),
            ReplicasetEvent(
                "replace", R3, tier="arbiter", current_master_uuid=I3, name="arbiter_1"
            ),
        ),
        (
            InstanceEvent("replace", I1, R1, "Online", "127.0.0.1:5437", name="i1"),
            InstanceEvent("replace", I2, R2, "Online", "127.0.0.1:5438", name="i2"),
            InstanceEvent("replace", I3, R3, "Online", "127.0.0.1:5439", name="i3"),
        ),
    )


def poll_snapshot() -> TopologySnapshot:
    replicasets, instances = membership().events()
    payload = BucketPayload("default", PICO_BUCKET_DEFAULT, 3000)
    return TopologySnapshot(
        tiers=membership().tiers,
        replicasets=replicasets,
        instances=instances,
        buckets=(BucketSnapshot("default", payload),),
    )


def test_the_bucket_payload_routes_keys_and_the_arbiter_tier_routes_none() -> None:
    payload = BucketPayload("default", PICO_BUCKET_DEFAULT, 3000)
    assert len(payload) == 2
    topology = Topology()
    apply_change(topology, poll_snapshot())
    assert topology.ranges("default") == [(1, 1500, R1), (1501, 3000, R2)]
    first, last = (
        topology.find_bucket_master("default", 1),
        topology.find_bucket_master("default", 3000),
    )
    assert first is not None
    assert last is not None
    assert (first.uuid, last.uuid) == (I1, I2)
    assert topology.replicasets[R3].tier == "arbiter"
    with pytest.raises(TierWithoutBuckets, match="'arbiter'"):
        topology.route("arbiter", 42)


def test_to_be_expelled_changes_nothing_and_expelled_is_deleted() -> None:
    """test/int/test_expelling.py test_join_replicaset_after_expel: the replicaset's state goes
    "to-be-expelled" while its buckets are moved away, then "expelled", and the instance's
    current_state ["Expelled", n]; the rows stay."""
    before = membership()
    leaving = membership(replicasets=with_state(REPLICASETS, "r2", 7, "to-be-expelled"))
    assert leaving.events_since(before) == []
    assert set(leaving.replicasets) == {R1, R2, R3}

    expelled_instance = with_state(INSTANCES, "i2", 5, ["Expelled", 1])
    gone = membership(
        replicasets=with_state(REPLICASETS, "r2", 7, "expelled"),
        instances=with_state(expelled_instance, "i2", 6, ["Expelled", 1]),
    )
    assert gone.events_since(leaving) == [
        ReplicasetEvent("delete", R2),
        InstanceEvent("delete", I2),
    ]
    # the seed's case 1: the delete clears the tier's map until its next bucket map
    topology = Topology()
    apply_change(topology, poll_snapshot())
    for event in gone.events_since(leaving):
        apply_change(topology, event)
    assert topology.ranges("default") == []
    assert R2 not in topology.replicasets
    assert I2 not in topology.instances


def test_an_expelled_instance_alone_is_deleted_and_is_nobodys_master() -> None:
    """test/int/test_expelling.py test_expel_zero_bucket_tier reads current_state of an
    expelled instance as [state, incarnation] with state "Expelled"."""
    gone = membership(instances=with_state(INSTANCES, "i3", 5, '["Expelled", 1]'))
    assert I3 not in gone.instances
    assert gone.replicasets[R3].current_master_uuid is None


def test_states_of_a_replicaset_that_stay_members() -> None:
    """src/replicaset.rs ReplicasetState: not-ready (not filled to the replication factor),
    ready, to-be-expelled are members; expelled is not."""
    for state in ("not-ready", "ready", "to-be-expelled"):
        assert R1 in membership(replicasets=with_state(REPLICASETS, "r1", 7, state)).replicasets
    assert (
        R1 not in membership(replicasets=with_state(REPLICASETS, "r1", 7, "expelled")).replicasets
    )


def test_the_stand_in_raises_picodatas_pico_bucket_errors(catalog: Catalog) -> None:
    """Texts: the SQL engine's Lua builtin _PICO_BUCKET and
    test/pgproto/_pico_bucket_function_test.py ("_pico_bucket: tier 'no_such_tier' doesn't
    exist"); an unbootstrapped tier fails to route bucket 1 with vshard's NO_ROUTE_TO_BUCKET
    text; the "sbroad: " prefix as the bucket-map seed shows it."""
    catalog.add_tier("default", 3000)
    catalog.add_tier("arbiter", 0)
    catalog.add_tier("late", 3000, bootstrapped=False)
    expected = {
        "no_such_tier": "sbroad: _pico_bucket: tier 'no_such_tier' doesn't exist",
        "arbiter": "sbroad: _pico_bucket: tier 'arbiter' doesn't exist",
        "late": "sbroad: _pico_bucket: Bucket 1 cannot be found. Is rebalancing in progress?",
    }
    for tier, message in expected.items():
        with pytest.raises(psycopg.errors.RaiseException) as caught:
            catalog.pico_bucket(tier)
        assert caught.value.diag.message_primary == message
    assert catalog.pico_bucket("default") == "[]"
    catalog.bootstrap("late")
    assert catalog.pico_bucket("late") == "[]"


def test_the_stand_in_keeps_expelled_rows_and_four_connection_types(catalog: Catalog) -> None:
    catalog.add_tier("default", 3000)
    catalog.add_replicaset("r1", instances=2)
    catalog.add_replicaset("r2")
    catalog.expel_instance("r1_2")
    catalog.start_expelling("r2")
    assert catalog._rows("SELECT state FROM _pico_replicaset WHERE name = 'r2'") == [
        ("to-be-expelled",)
    ]
    catalog.expel_replicaset("r2")
    rows = catalog._rows(
        "SELECT i.name, i.current_state, r.state FROM _pico_instance i"
        " JOIN _pico_replicaset r ON r.uuid = i.replicaset_uuid ORDER BY i.name"
    )
    assert rows == [
        ("r1_1", '["Online", 1]', "ready"),
        ("r1_2", '["Expelled", 1]', "ready"),
        ("r2_1", '["Expelled", 1]', "expelled"),
    ]
    types = catalog._rows(
        "SELECT connection_type FROM _pico_peer_address WHERE raft_id = 1 ORDER BY 1"
    )
    assert [kind for (kind,) in types] == ["http", "iproto", "pgproto", "plugin:radix.cache"]
    expected = catalog.expected()
    assert set(expected.replicasets) == {name_uuid("r1")}
    assert set(expected.instances) == {name_uuid("r1_1")}
