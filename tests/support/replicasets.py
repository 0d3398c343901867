"""Readable names for the uuids the topology tests use: replicaset Rn, its master instance and
its replicas, and helpers that add them to a topology."""

from __future__ import annotations

import uuid

from shardline import InstanceEvent, ReplicasetEvent, Topology


def rs_uuid(n: int) -> str:
    """Replicaset Rn."""
    return str(uuid.UUID(int=0xA000 + n))


def inst_uuid(n: int) -> str:
    """The master instance of replicaset Rn."""
    return str(uuid.UUID(int=0xB000 + n))


def replicaset_events(n: int, tier: str = "default") -> list[ReplicasetEvent | InstanceEvent]:
    """The events of replicaset Rn and its master instance, in the seed's order (replicaset,
    then instance)."""
    return [
        ReplicasetEvent("replace", rs_uuid(n), tier=tier, current_master_uuid=inst_uuid(n)),
        InstanceEvent(
            "replace",
            inst_uuid(n),
            replicaset_uuid=rs_uuid(n),
            current_state="Online",
            address=f"127.0.0.1:{3300 + n}",
        ),
    ]


def add_replicaset(topology: Topology, n: int, tier: str = "default") -> None:
    """Replicaset Rn with its master instance, applied to ``topology``."""
    for event in replicaset_events(n, tier):
        topology.apply(event)


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
