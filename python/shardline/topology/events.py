"""Topology events, shaped like Picodata's topology-notification ADR.

An event is a plain frozen value; :class:`shardline.Topology` validates it when it is applied,
so a malformed event raises :class:`shardline.InvalidEvent` there and changes nothing. In a
``"replace"`` event a field left as ``None`` means "leave unchanged".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Literal

from shardline._core import parse_bucket_row

__all__ = ["BucketEvent", "InstanceEvent", "Op", "ReplicasetEvent"]

Op = Literal["replace", "delete"]


@dataclass(frozen=True, slots=True)
class InstanceEvent:
    """An instance appeared, changed (state, address, replicaset, name) or left.

    ``op`` is ``"replace"`` (the fields given are set, a ``None`` one left unchanged) or
    ``"delete"``; ``instance_uuid`` and ``replicaset_uuid`` are UUID strings. ``name`` is the
    instance's name in the cluster, kept for people reading the topology. Nothing is checked
    here: :meth:`shardline.Topology.apply` raises :class:`shardline.InvalidEvent` for a
    malformed event and applies nothing of it.
    """

    topology_event: ClassVar[str] = "instance"
    """What ``Topology.apply`` dispatches on (the same in the two other event classes)."""

    op: Op
    instance_uuid: str
    replicaset_uuid: str | None = None
    current_state: str | None = None
    address: str | None = None
    name: str | None = None


@dataclass(frozen=True, slots=True)
class ReplicasetEvent:
    """A replicaset appeared, changed (master switch, tier) or was expelled.

    ``op`` is ``"replace"`` (the fields given are set, a ``None`` one left unchanged) or
    ``"delete"``. ``tier`` is required when the replicaset is not yet known to the topology.
    ``name`` is its name in the cluster, kept for people reading the topology. Nothing is
    checked here: :meth:`shardline.Topology.apply` raises :class:`shardline.InvalidEvent` for
    a malformed event and applies nothing of it.
    """

    topology_event: ClassVar[str] = "replicaset"

    op: Op
    replicaset_uuid: str
    tier: str | None = None
    current_master_uuid: str | None = None
    name: str | None = None


@dataclass(frozen=True, slots=True)
class BucketEvent:
    """The buckets ``start..end`` (inclusive) of ``tier`` are held by the replicaset
    ``current_replicaset_uuid`` (``op="replace"``), or no longer are (``op="delete"``).

    Nothing is checked here: :meth:`shardline.Topology.apply` raises
    :class:`shardline.InvalidEvent` for a malformed event (bounds outside the tier's bucket
    count included) and :class:`shardline.UnknownTier` for a tier it does not map, and
    applies nothing of it.
    """

    topology_event: ClassVar[str] = "bucket"

    tier: str
    start: int
    end: int
    current_replicaset_uuid: str
    state: str = "active"
    op: Op = "replace"

    @classmethod
    def from_row(cls, row: object) -> BucketEvent:
        """Builds the event for one element of the JSON array ``SELECT _pico_bucket(tier)`` returns.

        The row is a mapping with ``bucket_id_start``, ``bucket_id_end``,
        ``current_replicaset_uuid``, ``state`` and ``tier_name``; in a state whose buckets are
        served by their target (``copied``, ``sent``: see docs/picodata.md), a non-null
        ``target_replicaset_uuid`` is the event's ``current_replicaset_uuid`` (the replicaset
        requests go to), else it is not read. Raises
        :class:`shardline.InvalidEvent` naming the missing or malformed field, or the row itself
        when it is not a mapping (a number, a str, None, a list, ...).
        """
        # Only a mapping is copied into a dict: dict() would also accept a list of pairs as a row.
        fields = dict(row) if isinstance(row, Mapping) else row
        tier, start, end, owner, state = parse_bucket_row(fields)
        return cls(tier=tier, start=start, end=end, current_replicaset_uuid=owner, state=state)
