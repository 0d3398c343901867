"""Picodata's catalog rows (tiers, replicasets, instances, peer addresses) read into a validated
:class:`Membership`, and two memberships compared as topology events.

Nothing here does I/O: :class:`~shardline.topology.sources.PollingSource` fetches the rows and
hands them over as tuples, in the column order of the ``*_QUERY`` constants.

Picodata keeps expelled members in its tables: a replicaset's ``state`` goes ``not-ready`` →
``ready`` → ``to-be-expelled`` → ``expelled``, and an expelled instance's ``current_state`` is
``["Expelled", n]`` (picodata/picodata ``src/replicaset.rs`` ``ReplicasetState``,
``test/int/test_expelling.py``). A membership leaves expelled replicasets, expelled instances
and the instances of expelled replicasets out, so comparing two polls turns an expel into the
``"delete"`` events of the bucket-map rules (the tier's map is cleared until its next bucket
map is applied). A ``to-be-expelled`` replicaset is still a member and still routable: Picodata
marks it so while its governor waits for every bucket to be transferred away from it, so until
then it still holds (and serves) the buckets ``_pico_bucket`` maps to it.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardline.topology.events import InstanceEvent, ReplicasetEvent
from shardline.topology.sources.state import CountedFailure, FailureReason

__all__ = [
    "ADDRESSES_OF_TYPE_QUERY",
    "ADDRESSES_QUERY",
    "INSTANCES_QUERY",
    "REPLICASETS_QUERY",
    "TIERS_QUERY",
    "CatalogError",
    "InstanceRecord",
    "Membership",
    "ReplicasetRecord",
]

TIERS_QUERY = "SELECT name, bucket_count FROM _pico_tier"
REPLICASETS_QUERY = "SELECT name, uuid, tier, current_master_name, state FROM _pico_replicaset"
INSTANCES_QUERY = "SELECT name, uuid, replicaset_uuid, raft_id, current_state FROM _pico_instance"
ADDRESSES_QUERY = "SELECT raft_id, address FROM _pico_peer_address"
ADDRESSES_OF_TYPE_QUERY = ADDRESSES_QUERY + " WHERE connection_type = $1"

MAX_TEXT = 1024
"""Longest name, uuid, address or state text accepted from a catalog row."""

MAX_BUCKET_COUNT = 2**32 - 1

EXPELLED_REPLICASET = "expelled"
"""``_pico_replicaset.state`` of an expelled replicaset (left out of a :class:`Membership`)."""

EXPELLED_INSTANCE = "Expelled"
"""The state name in ``_pico_instance.current_state`` of an expelled instance (left out)."""

_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")


class CatalogError(CountedFailure, ValueError):
    """A catalog result that cannot be used; ``reason`` is a :class:`FailureReason`."""


@dataclass(frozen=True, slots=True)
class ReplicasetRecord:
    uuid: str
    tier: str
    current_master_uuid: str | None
    name: str

    def event(self) -> ReplicasetEvent:
        return ReplicasetEvent(
            "replace",
            self.uuid,
            tier=self.tier,
            current_master_uuid=self.current_master_uuid,
            name=self.name,
        )


@dataclass(frozen=True, slots=True)
class InstanceRecord:
    uuid: str
    replicaset_uuid: str | None
    current_state: str | None
    address: str | None
    name: str

    def event(self) -> InstanceEvent:
        return InstanceEvent(
            "replace",
            self.uuid,
            replicaset_uuid=self.replicaset_uuid,
            current_state=self.current_state,
            address=self.address,
            name=self.name,
        )


@dataclass(frozen=True, slots=True)
class Membership:
    """Tiers (name → bucket count), replicasets and instances (by canonical uuid) of one poll.

    A tier's count is 0 for a tier without buckets (an "arbiter" tier: its members are kept,
    it has no bucket map). Expelled replicasets and instances, and the instances of an expelled
    replicaset, are not members; ``to-be-expelled`` replicasets are (see the module's doc).
    """

    tiers: Mapping[str, int]
    replicasets: Mapping[str, ReplicasetRecord]
    instances: Mapping[str, InstanceRecord]

    @classmethod
    def from_rows(
        cls,
        tiers: Iterable[Sequence[Any]],
        replicasets: Iterable[Sequence[Any]],
        instances: Iterable[Sequence[Any]],
        addresses: Iterable[Sequence[Any]],
        *,
        scope: frozenset[str] | None = None,
    ) -> Membership:
        """Reads the rows of the four ``*_QUERY`` queries; with ``scope``, keeps only the
        replicasets of those tiers and their instances. Expelled members are validated like
        the others, then left out. Raises :class:`CatalogError` (``malformed-row`` or
        ``too-large``) naming the table, the row and the field."""
        tier_counts: dict[str, int] = {}
        for row in tiers:
            name = _text("_pico_tier", row, 0, "name")
            if name in tier_counts:
                raise _malformed("_pico_tier", row, f"duplicate tier {name!r}")
            tier_counts[name] = _bucket_count(row)

        by_raft_id: dict[int, str] = {}
        for row in addresses:
            raft_id = _int("_pico_peer_address", row, 0, "raft_id")
            if raft_id in by_raft_id:
                raise _malformed("_pico_peer_address", row, f"two addresses for raft_id {raft_id}")
            by_raft_id[raft_id] = _text("_pico_peer_address", row, 1, "address")

        instance_records: dict[str, InstanceRecord] = {}
        uuid_by_name: dict[str, str] = {}
        instance_keys: set[str] = set()
        instance_names: set[str] = set()
        for row in instances:
            name = _text("_pico_instance", row, 0, "name")
            key = _uuid("_pico_instance", row, 1, "uuid")
            if key in instance_keys or name in instance_names:
                raise _malformed("_pico_instance", row, f"duplicate instance {name!r}")
            instance_keys.add(key)
            instance_names.add(name)
            owner = _field("_pico_instance", row, 2, "replicaset_uuid")
            if owner is not None:
                owner = _uuid("_pico_instance", row, 2, "replicaset_uuid")
            instance = InstanceRecord(
                uuid=key,
                replicaset_uuid=owner,
                current_state=_state(row),
                address=by_raft_id.get(_int("_pico_instance", row, 3, "raft_id")),
                name=name,
            )
            # an expelled instance is nobody's master any more
            if instance.current_state != EXPELLED_INSTANCE:
                instance_records[key] = instance
                uuid_by_name[name] = key

        replicaset_records: dict[str, ReplicasetRecord] = {}
        replicaset_keys: set[str] = set()
        expelled: set[str] = set()
        names: set[str] = set()
        for row in replicasets:
            name = _text("_pico_replicaset", row, 0, "name")
            key = _uuid("_pico_replicaset", row, 1, "uuid")
            if key in replicaset_keys or name in names:
                raise _malformed("_pico_replicaset", row, f"duplicate replicaset {name!r}")
            names.add(name)
            replicaset_keys.add(key)
            master = row[3] if len(row) > 3 else None
            if master is not None and master != "":
                # a master named but not (or no longer) among the instances is unknown
                master = uuid_by_name.get(_text("_pico_replicaset", row, 3, "current_master_name"))
            else:
                master = None
            record = ReplicasetRecord(
                uuid=key,
                tier=_text("_pico_replicaset", row, 2, "tier"),
                current_master_uuid=master,
                name=name,
            )
            # Picodata's column is never NULL (src/replicaset.rs, Replicaset::format): a
            # missing state is a malformed row, not a member of unknown standing
            if _text("_pico_replicaset", row, 4, "state") == EXPELLED_REPLICASET:
                expelled.add(key)
            else:
                replicaset_records[key] = record
        if expelled:
            instance_records = {
                key: i for key, i in instance_records.items() if i.replicaset_uuid not in expelled
            }

        if scope is not None:
            tier_counts = {name: count for name, count in tier_counts.items() if name in scope}
            replicaset_records = {
                key: rs for key, rs in replicaset_records.items() if rs.tier in scope
            }
            instance_records = {
                key: i
                for key, i in instance_records.items()
                if i.replicaset_uuid in replicaset_records
            }
        return cls(tier_counts, replicaset_records, instance_records)

    def events(self) -> tuple[tuple[ReplicasetEvent, ...], tuple[InstanceEvent, ...]]:
        """A ``"replace"`` event for every replicaset and every instance."""
        return (
            tuple(rs.event() for rs in self.replicasets.values()),
            tuple(i.event() for i in self.instances.values()),
        )

    def events_since(self, previous: Membership) -> list[ReplicasetEvent | InstanceEvent]:
        """The events that take a topology holding ``previous`` to this membership: replicasets
        (new or changed, then vanished ones deleted), then instances likewise.

        An instance that lost a field (its address, state or replicaset is no longer given) is
        deleted and added again, since a ``"replace"`` leaves a field it does not give
        unchanged. A replicaset whose master is no longer known keeps its last master in the
        topology (a ``"replace"`` cannot clear it, and deleting the replicaset would clear its
        tier's bucket map); its master instance is normally gone too, so lookups answer None.
        """
        changes: list[ReplicasetEvent | InstanceEvent] = []
        for key, rs in self.replicasets.items():
            if previous.replicasets.get(key) != rs:
                changes.append(rs.event())
        changes.extend(
            ReplicasetEvent("delete", key) for key in previous.replicasets.keys() - self.replicasets
        )
        for key, instance in self.instances.items():
            old = previous.instances.get(key)
            if old == instance:
                continue
            if old is not None and _lost_a_field(old, instance):
                changes.append(InstanceEvent("delete", key))
            changes.append(instance.event())
        changes.extend(
            InstanceEvent("delete", key) for key in previous.instances.keys() - self.instances
        )
        return changes


def _lost_a_field(old: InstanceRecord, new: InstanceRecord) -> bool:
    return (
        (old.replicaset_uuid is not None and new.replicaset_uuid is None)
        or (old.current_state is not None and new.current_state is None)
        or (old.address is not None and new.address is None)
    )


def _malformed(table: str, row: Sequence[Any], message: str) -> CatalogError:
    shown = repr(tuple(row))
    if len(shown) > 300:
        shown = shown[:300] + "…"
    return CatalogError(FailureReason.MALFORMED_ROW, f"{table} row {shown}: {message}")


def _field(table: str, row: Sequence[Any], index: int, name: str) -> Any:
    if index >= len(row):
        raise _malformed(table, row, f"no column {name!r}")
    return row[index]


def _text(table: str, row: Sequence[Any], index: int, name: str) -> str:
    value = _field(table, row, index, name)
    if not isinstance(value, str) or not value:
        raise _malformed(table, row, f"{name} must be a non-empty string, got {value!r}")
    if len(value) > MAX_TEXT:
        raise CatalogError(
            FailureReason.TOO_LARGE,
            f"{table}: {name} of length {len(value)} is over the limit of {MAX_TEXT}",
        )
    return value


def _uuid(table: str, row: Sequence[Any], index: int, name: str) -> str:
    value = _field(table, row, index, name)
    if isinstance(value, uuid.UUID):
        return str(value)
    text = _text(table, row, index, name)
    if _CANONICAL_UUID.match(text):
        return text
    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise _malformed(table, row, f"{name} must be a UUID, got {text!r}") from None


def _int(table: str, row: Sequence[Any], index: int, name: str) -> int:
    value = _field(table, row, index, name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _malformed(table, row, f"{name} must be an integer, got {value!r}")
    return value


def _bucket_count(row: Sequence[Any]) -> int:
    """0 is a tier without buckets (Picodata's ``Tier::has_buckets``, src/tier.rs)."""
    count = _int("_pico_tier", row, 1, "bucket_count")
    if not 0 <= count <= MAX_BUCKET_COUNT:
        raise _malformed("_pico_tier", row, f"bucket_count must be 0..{MAX_BUCKET_COUNT}")
    return count


def _state(row: Sequence[Any]) -> str | None:
    """The state's name out of ``current_state``: ``["Online", 1]`` or ``{"Online": 1}``, as
    JSON text or already decoded; ``None`` for SQL NULL."""
    value = _field(row=row, table="_pico_instance", index=4, name="current_state")
    if value is None:
        return None
    if isinstance(value, str | bytes):
        if len(value) > MAX_TEXT:
            raise CatalogError(
                FailureReason.TOO_LARGE,
                f"_pico_instance: current_state of length {len(value)} is over the limit",
            )
        try:
            value = json.loads(value)
        except ValueError:
            raise _malformed(
                "_pico_instance", row, "current_state is not JSON (want [state, incarnation])"
            ) from None
    if isinstance(value, list | tuple) and value:
        name = value[0]
    elif isinstance(value, dict) and len(value) == 1:
        name = next(iter(value))
    else:
        name = None
    if not isinstance(name, str) or not name or len(name) > MAX_TEXT:
        raise _malformed(
            "_pico_instance", row, f"current_state must be [state, incarnation], got {value!r}"
        )
    return name
