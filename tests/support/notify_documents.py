"""Picodata's topology-notification documents, written out independently of the library's
decoder, as the ADR specifies them: repository picodata/picodata,
``doc/adr/2025-09-12-pgproto-topology-notifications.md`` ("Структуры событий", "Примеры",
"Отправка снапшота топологии").

Each document is flat: ``op``, ``map`` (the table without its ``_pico_`` prefix),
``timestamp``, ``raft: {term, index}``, then the fields of the map; a field that is ``None`` is
left out ("При сериализации они не будут включены в итоговое JSON-сообщение"). The snapshot is
a burst of ``replace`` documents: replicasets, then instances, then bucket ranges. A test that
decodes these encoders' output checks the decoder against the ADR rather than against itself.
"""

from __future__ import annotations

import json
from typing import Any

from shardline import BucketEvent, InstanceEvent, ReplicasetEvent, Topology

Event = InstanceEvent | ReplicasetEvent | BucketEvent

TIMESTAMP = "2025-08-19T11:24:28+00:00"
"""The timestamp of the ADR's examples (an ISO 8601 string, its ``timestamp: String``)."""


def event_fields(event: Event) -> dict[str, Any]:
    """The ADR fields of one event, ``map`` included, ``None`` fields left out."""
    fields: dict[str, Any]
    if isinstance(event, InstanceEvent):
        fields = {
            "map": "instance",
            "replicaset_uuid": event.replicaset_uuid,
            "instance_uuid": event.instance_uuid,
            "current_state": event.current_state,
            "address": event.address,
        }
    elif isinstance(event, ReplicasetEvent):
        fields = {
            "map": "replicaset",
            "replicaset_uuid": event.replicaset_uuid,
            "tier": event.tier,
            "current_master_uuid": event.current_master_uuid,
        }
    else:
        fields = {
            "map": "bucket",
            "tier": event.tier,
            "state": event.state,
            "bucket_id": {"start": event.start, "end": event.end},
            "current_replicaset_uuid": event.current_replicaset_uuid,
        }
    return {key: value for key, value in fields.items() if value is not None}


def event_document(event: Event, term: int, index: int, *, timestamp: Any = TIMESTAMP) -> str:
    """One document, as Picodata would send it for ``event`` committed at term:index."""
    fields = event_fields(event)
    return json.dumps(
        {
            "op": event.op,
            "map": fields.pop("map"),
            "timestamp": timestamp,
            "raft": {"term": term, "index": index},
            **fields,
        }
    )


def snapshot_documents(topology: Topology, term: int, index: int) -> list[str]:
    """The snapshot burst of everything ``topology`` holds, every document at term:index."""
    events: list[Event] = [
        ReplicasetEvent("replace", rs.uuid, rs.tier, rs.current_master_uuid)
        for rs in topology.replicasets.values()
    ]
    events += [
        InstanceEvent("replace", i.uuid, i.replicaset_uuid, i.current_state, i.address)
        for i in topology.instances.values()
    ]
    events += [
        BucketEvent(tier, start, end, owner)
        for tier, ranges in sorted(topology.bucket_maps.items())
        if tier in topology.tiers
        for start, end, owner in ranges
    ]
    return [event_document(event, term, index) for event in events]


def raw(term: int, index: int, **body: Any) -> str:
    """A document at raft position term:index with ``body`` as its other fields, as given: how a
    test writes one that is malformed or leaves fields out."""
    return json.dumps({"raft": {"term": term, "index": index}, **body})
