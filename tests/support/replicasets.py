"""Readable names for the uuids the topology tests use: replicaset Rn, its master instance and
its replicas (:data:`R`, :data:`I`, and :func:`names` for a tier's map in that notation), the
events that add them and their buckets (also as the rows a bucket poll returns), and helpers that
apply those to a topology."""

from __future__ import annotations

import uuid
from typing import Any

from shardline import BucketEvent, InstanceEvent, ReplicasetEvent, Topology


def rs_uuid(n: int) -> str:
    """Replicaset Rn."""
    return str(uuid.UUID(int=0xA000 + n))


def inst_uuid(n: int) -> str:
    """The master instance of replicaset Rn."""
    return str(uuid.UUID(int=0xB000 + n))


R = {n: rs_uuid(n) for n in range(1, 10)}
"""Replicaset Rn's uuid by n."""
I = {n: inst_uuid(n) for n in range(1, 10)}  # noqa: E741  (the master instance of Rn)
"""The uuid of Rn's master instance by n."""


def replicaset_events(
    n: int, tier: str = "default", *, address: str | None = None
) -> list[ReplicasetEvent | InstanceEvent]:
    """The events of replicaset Rn and its master instance, in the seed's order (replicaset,
    then instance); the instance serves ``address``, by default 127.0.0.1:(3300 + n)."""
    return [
        ReplicasetEvent("replace", rs_uuid(n), tier=tier, current_master_uuid=inst_uuid(n)),
        InstanceEvent(
            "replace",
            inst_uuid(n),
            replicaset_uuid=rs_uuid(n),
            current_state="Online",
            address=f"127.0.0.1:{3300 + n}" if address is None else address,
        ),
    ]


def add(n: int, tier: str = "default") -> list[ReplicasetEvent | InstanceEvent]:
    """Replicaset Rn and its master In at hn:1, in the seed's order: the notification tests'
    shorthand."""
    return replicaset_events(n, tier, address=f"h{n}:1")


def buckets(*ranges: tuple[int, int, int]) -> list[BucketEvent]:
    """Bucket events (start, end, n): buckets start..end of the default tier held by Rn."""
    return [BucketEvent("default", start, end, R[n]) for start, end, n in ranges]


def bucket_row(n: int, start: int, end: int, tier: str = "default", **extra: Any) -> dict[str, Any]:
    """One element of what ``SELECT _pico_bucket(tier)`` returns: buckets ``start..end`` of
    ``tier``, active on Rn; ``extra`` adds or overrides fields."""
    return {
        "bucket_id_start": start,
        "bucket_id_end": end,
        "current_replicaset_uuid": rs_uuid(n),
        "target_replicaset_uuid": rs_uuid(n),
        "state": "active",
        "tier_name": tier,
        **extra,
    }


def add_replicaset(topology: Topology, n: int, tier: str = "default") -> None:
    """Replicaset Rn with its master instance, applied to ``topology``."""
    for event in replicaset_events(n, tier):
        topology.apply(event)


def names(topology: Topology, tier: str = "default") -> list[tuple[int, int, str]]:
    """The tier's map with replicaset uuids shown as R1, R2, ...: the seed's notation."""
    by_uuid = {rs_uuid(n): f"R{n}" for n in range(1, 10)}
    return [(start, end, by_uuid[owner]) for start, end, owner in topology.ranges(tier)]


def replica_uuid(n: int, k: int) -> str:
    """Replica k (k >= 1) of replicaset Rn."""
    return str(uuid.UUID(int=0xC000 + 16 * n + k))


def add_replica(topology: Topology, n: int, k: int, state: str = "Online") -> None:
    topology.apply(
        InstanceEvent(
            "replace",
            replica_uuid(n, k),
            replicaset_uuid=rs_uuid(n),
            current_state=state,
            address=f"127.0.0.1:{4300 + 16 * n + k}",
        )
    )
