"""Bucket states beyond ``active`` (issue 27, item 3): where a range's reads and writes go.

The rows are Picodata's: the ``_pico_bucket(tier)`` fields of
``test/pgproto/_pico_bucket_function_test.py`` (``bucket_id_start``, ``bucket_id_end``,
``tier_name``, ``state``, ``current_replicaset_uuid``, ``target_replicaset_uuid``), with the
states of the topology-notifications ADR (``doc/adr/2025-09-12-pgproto-topology-notifications.md``:
``copying``, ``copied``, ``aborting-copy``) and of the ``_pico_bucket`` table of Picodata 26.2
(``src/catalog/pico_bucket.rs`` ``BucketState``: ``sending``, ``sent``). The decision
(``served_by_target`` in ``rust/core/src/topology/payload.rs``): ``copied`` and ``sent`` go to the
target (the data is whole there, the old owner may start neither a read nor a write, the next
state is ``active`` there); every other state goes to the current owner.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from shardline import Topology
from shardline.errors import InvalidEvent
from shardline.picodata import connect
from shardline.topology.sources import BucketPayload
from support.forwarded_cluster import BUCKETS, cluster
from support.pg_server import PgServer
from support.picodata_catalog import name_uuid as _uuid

CURRENT = "9e273105-5af8-4f77-8f47-3d9a68f772ca"  # the ADR's example uuid
TARGET = "31f6051e-13aa-43fb-beb2-ae17155ac810"  # the bucket-map seed's

CASES = [
    ("active", CURRENT),
    ("copying", CURRENT),
    ("sending", CURRENT),
    ("copied", TARGET),
    ("sent", TARGET),
    ("aborting-copy", CURRENT),
    ("a-state-of-a-later-release", CURRENT),
]


def row(state: str, target: str | None = TARGET) -> dict[str, Any]:
    return {
        "bucket_id_start": 1,
        "target_replicaset_uuid": target,
        "tier_name": "default",
        "state": state,
        "bucket_id_end": 1500,
        "current_replicaset_uuid": CURRENT,
    }


@pytest.mark.parametrize(("state", "owner"), CASES)
def test_each_state_routes_to_its_owner_in_both_parsers(state: str, owner: str) -> None:
    for rows in ([row(state)], BucketPayload("default", json.dumps([row(state)]), 3000)):
        topology = Topology()
        topology.apply_tiers({"default": 3000})
        topology.apply_bucket_snapshot("default", rows)
        assert topology.ranges("default") == [(1, 1500, owner)]


def test_a_null_target_is_the_current_owner_and_a_bad_one_is_refused() -> None:
    unset = [row("copied", None)]
    for rows in (unset, BucketPayload("default", json.dumps(unset), 3000)):
        topology = Topology()
        topology.apply_tiers({"default": 3000})
        topology.apply_bucket_snapshot("default", rows)
        assert topology.ranges("default") == [(1, 1500, CURRENT)]
    message = "field 'target_replicaset_uuid' must be a UUID string, got 'r2'"
    topology = Topology()
    topology.apply_tiers({"default": 3000})
    with pytest.raises(InvalidEvent, match=message):
        topology.apply_bucket_snapshot("default", [row("copied", "r2")])
    with pytest.raises(ValueError, match=message):
        BucketPayload("default", json.dumps([row("sent", "r2")]), 3000)
    # a target in a state served by the current owner is not read
    payload = BucketPayload("default", json.dumps([row("copying", "r2")]), 3000)
    assert len(payload) == 1


@pytest.mark.async_timeout(60)
async def test_the_client_follows_a_range_through_a_transfer(pg: PgServer) -> None:
    async with cluster(pg) as c, connect(c.url, tier="default") as db:
        key = c.key_of("r1_1")
        ranges = c.catalog.expected().maps["default"]
        (start, end) = next((s, e) for s, e, o in ranges if o == _uuid("r1"))
        landed = []
        for state in ("copying", "copied", "aborting-copy", "sending", "sent", "active"):
            c.catalog.connection.execute(
                "UPDATE _test_bucket SET state = %s, target_replicaset_uuid = %s"
                " WHERE bucket_id_start = %s",
                (state, _uuid("r2"), start),
            )
            assert await db.refresh()
            port = await db.fetchval("SELECT inet_client_port()", key=key)
            landed.append((state, c.instance_of(port)))
        assert landed == [
            ("copying", "r1_1"),
            ("copied", "r2_1"),
            ("aborting-copy", "r1_1"),
            ("sending", "r1_1"),
            ("sent", "r2_1"),
            ("active", "r1_1"),  # the transfer ended back where it was (current unchanged)
        ]
        assert (start, end) != (1, BUCKETS)
