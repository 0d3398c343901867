"""Every example of Picodata's topology-notification ADR, literally, through the document parser.

Source of every fixture below: repository picodata/picodata,
``doc/adr/2025-09-12-pgproto-topology-notifications.md`` (status: accepted), the section named
beside it. The texts are copied as the ADR prints them, trailing commas included.

Most examples parse to the event they describe. Four carry a value no Picodata cluster can send
(docs/notifications.md, "Where the ADR's examples disagree"): an instance uuid of 31 hex digits,
and bucket id 0. The parser refuses those documents naming the field and the value (they are
skipped and counted, never applied), and the same text with only that value corrected parses:
so the format of every example is accepted.
"""

from __future__ import annotations

import json

import pytest

from shardline import BucketEvent, InstanceEvent, ReplicasetEvent, Topology
from shardline.topology.sources.notification_documents import (
    DocumentError,
    RaftPosition,
    TopologyEvent,
    parse_event_document,
    parse_snapshot,
)

RS = "9e273105-5af8-4f77-8f47-3d9a68f772ca"
SHORT = "268a62a-8af6-4a3d-9f24-23e6c5f4bb32"  # 7 hex digits in its first group, not 8
FIXED = "0268a62a-8af6-4a3d-9f24-23e6c5f4bb32"

# ADR, "Примеры" / "Добавление репликасета"
ADD_REPLICASET = """{
  "op": "replace",
  "map": "replicaset",
  "timestamp": "2025-08-19T11:24:28+00:00",
  "raft": {
    "term": 1,
    "index": 2
  },
  "replicaset_uuid": "9e273105-5af8-4f77-8f47-3d9a68f772ca",
  "tier": "default",
}"""

# ADR, "Примеры" / "Удаление репликасета"
DELETE_REPLICASET = """{
  "op": "delete",
  "map": "replicaset",
  "timestamp": "2025-08-19T11:24:28+00:00",
  "raft": {
    "term": 1,
    "index": 2
  },
  "replicaset_uuid": "9e273105-5af8-4f77-8f47-3d9a68f772ca",
}"""

# ADR, "Примеры" / "Добавление инстанса"
ADD_INSTANCE = """{
  "op": "replace",
  "map": "instance",
  "timestamp": "2025-08-19T11:24:28+00:00",
  "raft": {
    "term": 1,
    "index": 2
  },
  "replicaset_uuid": "9e273105-5af8-4f77-8f47-3d9a68f772ca",
  "instance_uuid": "268a62a-8af6-4a3d-9f24-23e6c5f4bb32",
  "current_state": "Online",
  "address": "127.0.0.1:1333",
}"""

# ADR, "Примеры" / "Изменение статуса инстанса" (instance state change)
INSTANCE_STATE = """{
  "op": "replace",
  "map": "instance",
  "timestamp": "2025-08-19T11:24:28+00:00",
  "raft": {
    "term": 1,
    "index": 2
  },
  "instance_uuid": "268a62a-8af6-4a3d-9f24-23e6c5f4bb32",
  "current_state": "Offline",
}"""

# ADR, "Примеры" / "Удаление инстанса"
DELETE_INSTANCE = """{
  "op": "delete",
  "map": "instance",
  "timestamp": "2025-08-19T11:24:28+00:00",
  "raft": {
    "term": 1,
    "index": 2
  },
  "instance_uuid": "268a62a-8af6-4a3d-9f24-23e6c5f4bb32",
}"""

# ADR, "Примеры" / "Изменение роли инстанса"
MASTER_SWITCH = """{
  "op": "replace",
  "map": "replicaset",
  "timestamp": "2025-08-19T11:24:28+00:00",
  "raft": {
    "term": 1,
    "index": 2
  },
  "replicaset_uuid": "2638a62a-8af6-4a3d-9f24-23e6c5f4bb32",
  "current_master_uuid": "9e273105-5af8-4f77-8f47-3d9a68f772ca",
}"""

# ADR, "Примеры" / "Изменение адреса инстанса"
ADDRESS = """{
  "op": "replace",
  "map": "instance",
  "timestamp": "2025-08-19T11:24:28+00:00",
  "raft": {
    "term": 1,
    "index": 2
  },
  "instance_uuid": "9e273105-5af8-4f77-8f47-3d9a68f772ca",
  "address": "127.0.0.1:1333",
}"""

# ADR, "Примеры" / "Миграция бакетов между репликасетами"
MIGRATION = """{
  "op": "replace",
  "map": "bucket",
  "timestamp": "2025-08-19T11:24:28+00:00",
  "raft": {
    "term": 1,
    "index": 2
  },
  "tier": "default",
  "state": "copied",
  "bucket_id": {
    "start": 0,
    "end": 1000
  },
  "current_replicaset_uuid": "9e273105-5af8-4f77-8f47-3d9a68f772ca",
}"""

# ADR, "Отправка снапшота топологии" / "Алгоритм отправки": the burst, in its order
SNAPSHOT_REPLICASET = ADD_REPLICASET  # the same text, sent first
SNAPSHOT_INSTANCE = """{
  "op": "replace",
  "map": "instance",
  "timestamp": "2025-08-19T11:24:28+00:00",
  "raft": {
    "term": 1,
    "index": 2
  },
  "replicaset_uuid": "9e273105-5af8-4f77-8f47-3d9a68f772ca",
  "instance_uuid": "268a62a-8af6-4a3d-9f24-23e6c5f4bb32",
  "current_state": "Offline",
  "address": "127.0.0.1:1333",
}"""
SNAPSHOT_BUCKETS = """{
  "op": "replace",
  "map": "bucket",
  "timestamp": "2025-08-19T11:24:28+00:00",
  "raft": {
    "term": 1,
    "index": 2
  },
  "tier": "default",
  "state": "active",
  "bucket_id": {
    "start": 0,
    "end": 1000
  },
  "current_replicaset_uuid": "9e273105-5af8-4f77-8f47-3d9a68f772ca",
}"""


ACCEPTED: dict[str, tuple[str, TopologyEvent]] = {
    "replicaset added": (ADD_REPLICASET, ReplicasetEvent("replace", RS, tier="default")),
    "replicaset deleted": (DELETE_REPLICASET, ReplicasetEvent("delete", RS)),
    "master switch": (
        MASTER_SWITCH,
        ReplicasetEvent("replace", "2638a62a-8af6-4a3d-9f24-23e6c5f4bb32", current_master_uuid=RS),
    ),
    "address change": (ADDRESS, InstanceEvent("replace", RS, address="127.0.0.1:1333")),
}

# the example, the field the parser names, what the event is once that one value is corrected
REFUSED: dict[str, tuple[str, str, tuple[str, str], TopologyEvent]] = {
    "instance added": (
        ADD_INSTANCE,
        "'instance_uuid' must be a UUID string, got '268a62a-",
        (SHORT, FIXED),
        InstanceEvent("replace", FIXED, RS, "Online", "127.0.0.1:1333"),
    ),
    "instance state change": (
        INSTANCE_STATE,
        "'instance_uuid' must be a UUID string",
        (SHORT, FIXED),
        InstanceEvent("replace", FIXED, current_state="Offline"),
    ),
    "instance deleted": (
        DELETE_INSTANCE,
        "'instance_uuid' must be a UUID string",
        (SHORT, FIXED),
        InstanceEvent("delete", FIXED),
    ),
    "bucket migration": (
        MIGRATION,
        r"'bucket_id.start' must be a bucket id \(int >= 1\), got 0",
        ('"start": 0', '"start": 1'),
        BucketEvent("default", 1, 1000, RS, state="copied"),
    ),
}


@pytest.mark.parametrize("section", ACCEPTED)
def test_the_adr_examples_parse_to_their_events(section: str) -> None:
    text, event = ACCEPTED[section]
    decoded = parse_event_document(text)
    assert decoded.event == event
    assert decoded.position == RaftPosition(1, 2)
    assert decoded.map == text.split('"map": "')[1].split('"')[0]
    # str and bytes of one document parse alike
    assert parse_event_document(text.encode()) == decoded


@pytest.mark.parametrize("section", REFUSED)
def test_the_adr_examples_with_impossible_values_are_refused_naming_the_value(
    section: str,
) -> None:
    text, message, (wrong, right), event = REFUSED[section]
    with pytest.raises(DocumentError, match=message) as refused:
        parse_event_document(text)
    assert refused.value.reason == "malformed-row"
    assert text.count(wrong) == 1
    assert parse_event_document(text.replace(wrong, right)).event == event


def test_the_adr_snapshot_burst() -> None:
    burst = [SNAPSHOT_REPLICASET, SNAPSHOT_INSTANCE, SNAPSHOT_BUCKETS]
    with pytest.raises(DocumentError, match="snapshot document 2: 'instance_uuid'"):
        parse_snapshot(burst)
    fixed = [
        SNAPSHOT_REPLICASET,
        SNAPSHOT_INSTANCE.replace(SHORT, FIXED),
        SNAPSHOT_BUCKETS.replace('"start": 0', '"start": 1'),
    ]
    snapshot = parse_snapshot(fixed)
    assert snapshot.position == RaftPosition(1, 2)
    assert snapshot.replicasets == (ReplicasetEvent("replace", RS, tier="default"),)
    assert snapshot.instances == (InstanceEvent("replace", FIXED, RS, "Offline", "127.0.0.1:1333"),)
    assert snapshot.buckets == {"default": (BucketEvent("default", 1, 1000, RS),)}
    # and the events build a topology: the ADR's order sets replicasets up before buckets
    topology = Topology()
    topology.apply_tiers({"default": 3000})
    for event in (*snapshot.replicasets, *snapshot.instances):
        topology.apply(event)
    topology.apply_bucket_snapshot("default", snapshot.buckets["default"])
    assert topology.owner("default", 1000) == RS
    assert topology.owner("default", 1001) is None


def test_the_adr_trailing_comma_is_the_only_leniency() -> None:
    # strict JSON would refuse every example: each one ends its fields with a comma
    with pytest.raises(json.JSONDecodeError, match="Expecting property name"):
        json.loads(ADD_REPLICASET)
    # a comma inside a string is data, not a trailing comma
    text = ADD_REPLICASET.replace('"default"', '"a,}"')
    decoded = parse_event_document(text)
    assert decoded.event == ReplicasetEvent("replace", RS, tier="a,}")
    # anything else that is not JSON stays refused
    for broken in (ADD_REPLICASET.replace("{", "", 1), ADD_REPLICASET + "}", "{,}", "[1,,]"):
        with pytest.raises(DocumentError, match="not JSON"):
            parse_event_document(broken)
