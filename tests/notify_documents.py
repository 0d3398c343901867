"""The notification document format, written out independently of the library's decoder.

:mod:`shardline.topology.sources.notification` documents the format; these encoders follow that
text, so a test that decodes their output checks the decoder against the documentation rather
than against itself.
"""

from __future__ import annotations

import json
from typing import Any

from shardline import BucketEvent, InstanceEvent, ReplicasetEvent, Topology

Event = InstanceEvent | ReplicasetEvent | BucketEvent


def event_map(event: Event) -> dict[str, Any]:
    """The ADR ``map`` of one event (``None`` fields written as ``null``)."""
    if isinstance(event, InstanceEvent):
        return {
            "instance_uuid": event.instance_uuid,
            "replicaset_uuid": event.replicaset_uuid,
            "current_state": event.current_state,
            "address": event.address,
        }
    if isinstance(event, ReplicasetEvent):
        return {
            "replicaset_uuid": event.replicaset_uuid,
            "tier": event.tier,
            "current_master_uuid": event.current_master_uuid,
        }
    return {
        "tier": event.tier,
        "state": event.state,
        "bucket_id": {"start": event.start, "end": event.end},
        "current_replicaset_uuid": event.current_replicaset_uuid,
    }


def event_document(event: Event, term: int, index: int, *, timestamp: float = 0.0) -> str:
    """One event document, as a publisher sends it."""
    return json.dumps(
        {
            "op": event.op,
            "map": event_map(event),
            "timestamp": timestamp,
            "raft": {"term": term, "index": index},
        }
    )


def snapshot_document(topology: Topology, term: int, index: int) -> str:
    """The snapshot document of everything ``topology`` holds, at raft position term:index."""
    buckets = [
        event_map(BucketEvent(tier, start, end, owner))
        for tier, ranges in sorted(topology.bucket_maps.items())
        if tier in topology.tiers
        for start, end, owner in ranges
    ]
    return json.dumps(
        {
            "raft": {"term": term, "index": index},
            "timestamp": 0.0,
            "tiers": topology.tiers,
            "replicasets": [
                event_map(ReplicasetEvent("replace", rs.uuid, rs.tier, rs.current_master_uuid))
                for rs in topology.replicasets.values()
            ],
            "instances": [
                event_map(
                    InstanceEvent("replace", i.uuid, i.replicaset_uuid, i.current_state, i.address)
                )
                for i in topology.instances.values()
            ],
            "buckets": buckets,
        }
    )
