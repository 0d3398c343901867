"""Readable names for the uuids the topology tests use: replicaset Rn and its master instance."""

from __future__ import annotations

import uuid

from shardline import InstanceEvent, ReplicasetEvent, Topology


def rs_uuid(n: int) -> str:
    """Replicaset Rn."""
    return str(uuid.UUID(int=0xA000 + n))


def inst_uuid(n: int) -> str:
    """The master instance of replicaset Rn."""
    return str(uuid.UUID(int=0xB000 + n))


def add_replicaset(topology: Topology, n: int, tier: str = "default") -> None:
    """Replicaset Rn with its master instance, in the seed's order (replicaset, then instance)."""
    topology.apply(
        ReplicasetEvent("replace", rs_uuid(n), tier=tier, current_master_uuid=inst_uuid(n))
    )
    topology.apply(
        InstanceEvent(
            "replace",
            inst_uuid(n),
            replicaset_uuid=rs_uuid(n),
            current_state="Online",
            address=f"127.0.0.1:{3300 + n}",
        )
    )
