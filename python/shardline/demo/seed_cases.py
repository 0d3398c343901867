"""The built-in scenario: the three worked cases of the Picodata bucket-map issue, in sequence.

Tier ``hot`` starts as the seed's R1(1-1000), R2(1001-2000), R3(2001-3000) and goes through:

1. R2 is expelled: a replicaset delete clears the map, bucket events for R1 and R3 refill it;
2. a replicaset joins: its replicaset event clears the map, bucket events for all three refill it;
3. weights change with no replicaset event: the first bucket event overlaps the old map, which
   is cleared, and the next two refill it to the seed's final 1-750 / 751-1500 / 1501-3000.

The joining replicaset is R4, not R2 again, because an expelled replicaset never comes back under
its uuid. Tier ``cold`` (C1, C2) receives no event after the bootstrap, to show that clearing one
tier never touches another. The scenario is the same document a ``--scenario`` file holds, so
both go through one loader and one replay driver.
"""

from __future__ import annotations

import uuid
from typing import Any

__all__ = ["SOURCE", "seed_cases"]

SOURCE = "built-in scenario (the Picodata bucket-map issue's three cases)"

_NAMESPACE = uuid.UUID("6f1c2d4e-9a7b-4c3d-8e5f-0a1b2c3d4e5f")


def _uuid(name: str) -> str:
    # Fixed uuids, so the demo's output is the same on every run.
    return str(uuid.uuid5(_NAMESPACE, name))


def _replicaset(name: str, tier: str) -> dict[str, Any]:
    return {
        "kind": "replicaset",
        "op": "replace",
        "replicaset_uuid": _uuid(name),
        "tier": tier,
        "current_master_uuid": _uuid(name.lower()),
    }


def _instance(name: str, address: str) -> dict[str, Any]:
    return {
        "kind": "instance",
        "op": "replace",
        "instance_uuid": _uuid(name.lower()),
        "replicaset_uuid": _uuid(name),
        "current_state": "Online",
        "address": address,
    }


def _bucket(tier: str, start: int, end: int, name: str) -> dict[str, Any]:
    return {
        "kind": "bucket",
        "tier": tier,
        "start": start,
        "end": end,
        "current_replicaset_uuid": _uuid(name),
    }


def _poll(tier: str, ranges: list[tuple[int, int, str]]) -> dict[str, Any]:
    rows = [
        {
            "bucket_id_start": start,
            "bucket_id_end": end,
            "current_replicaset_uuid": _uuid(name),
            "target_replicaset_uuid": _uuid(name),
            "tier_name": tier,
            "state": "active",
        }
        for start, end, name in ranges
    ]
    return {"kind": "bucket_snapshot", "tier": tier, "rows": rows}


def seed_cases() -> dict[str, Any]:
    """The built-in scenario as a scenario document (see ``docs/demo.md``)."""
    hot = ["R1", "R2", "R3", "R4"]
    cold = ["C1", "C2"]
    names = {_uuid(n): n for n in hot + cold} | {_uuid(n.lower()): n.lower() for n in hot + cold}
    addresses = {n: f"10.0.1.{i}:3301" for i, n in enumerate(hot, 1)} | {
        n: f"10.0.2.{i}:3301" for i, n in enumerate(cold, 1)
    }
    return {
        "version": 1,
        "tiers": {"hot": 3000, "cold": 3000},
        "keys": {"count": 2000, "pattern": "user:{i}"},
        "names": names,
        "steps": [
            {
                "description": "Bootstrap: replicasets, then instances, then a _pico_bucket poll"
                " of each tier",
                "events": [
                    *(_replicaset(n, "hot") for n in ["R1", "R2", "R3"]),
                    *(_replicaset(n, "cold") for n in cold),
                    *(_instance(n, addresses[n]) for n in ["R1", "R2", "R3", *cold]),
                    _poll("hot", [(1, 1000, "R1"), (1001, 2000, "R2"), (2001, 3000, "R3")]),
                    _poll("cold", [(1, 1500, "C1"), (1501, 3000, "C2")]),
                ],
            },
            {
                "description": "Case 1, R2 expelled: its replicaset delete clears the hot map",
                "events": [
                    {"kind": "replicaset", "op": "delete", "replicaset_uuid": _uuid("R2")},
                    {"kind": "instance", "op": "delete", "instance_uuid": _uuid("r2")},
                ],
            },
            {
                "description": "Case 1: bucket event R1 1-1500",
                "events": [_bucket("hot", 1, 1500, "R1")],
            },
            {
                "description": "Case 1: bucket event R3 1501-3000 (the map is whole again)",
                "events": [_bucket("hot", 1501, 3000, "R3")],
            },
            {
                "description": "Case 2, R4 added: the new replicaset's event clears the hot map",
                "events": [_replicaset("R4", "hot"), _instance("R4", addresses["R4"])],
            },
            {
                "description": "Case 2: bucket event R1 1-1000",
                "events": [_bucket("hot", 1, 1000, "R1")],
            },
            {
                "description": "Case 2: bucket event R3 1001-2000",
                "events": [_bucket("hot", 1001, 2000, "R3")],
            },
            {
                "description": "Case 2: bucket event R4 2001-3000 (the map is whole again)",
                "events": [_bucket("hot", 2001, 3000, "R4")],
            },
            {
                "description": "Case 3, weights changed (no replicaset event): bucket event"
                " R1 1-750 overlaps the old map, which is cleared",
                "events": [_bucket("hot", 1, 750, "R1")],
            },
            {
                "description": "Case 3: bucket event R3 751-1500",
                "events": [_bucket("hot", 751, 1500, "R3")],
            },
            {
                "description": "Case 3: bucket event R4 1501-3000 (the map is whole again)",
                "events": [_bucket("hot", 1501, 3000, "R4")],
            },
        ],
    }
