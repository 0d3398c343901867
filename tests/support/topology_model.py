"""A deliberately simple reference model of the topology rules, for property tests.

Plain dicts and lists, no performance concerns: each rule reads the way the issue states it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from shardline import BucketEvent, Instance, InstanceEvent, Replicaset, ReplicasetEvent


def canonical(text: str) -> str:
    return str(uuid.UUID(text))


@dataclass
class Model:
    tiers: dict[str, int] = field(default_factory=dict)
    instances: dict[str, tuple[str, str | None, str | None, str | None]] = field(
        default_factory=dict
    )
    replicasets: dict[str, tuple[str, str, str | None]] = field(default_factory=dict)
    maps: dict[str, list[tuple[int, int, str]]] = field(default_factory=dict)
    epochs: dict[str, int] = field(default_factory=dict)

    def _set_map(self, tier: str, ranges: list[tuple[int, int, str]]) -> None:
        ranges = sorted(ranges)
        if self.maps.get(tier, []) != ranges:
            self.epochs[tier] = self.epochs.get(tier, 0) + 1
        self.maps[tier] = ranges
        self.epochs.setdefault(tier, 0)

    def clear(self, tier: str) -> None:
        self._set_map(tier, [])

    def apply_tiers(self, tiers: dict[str, int]) -> None:
        if self.tiers:
            return
        self.tiers = dict(tiers)
        for tier in tiers:
            self.maps.setdefault(tier, [])
            self.epochs.setdefault(tier, 0)

    def maps_tier(self, tier: str) -> bool:
        """Whether bucket events and snapshots of `tier` are accepted: any tier until
        `apply_tiers`, then only a configured one (else `UnknownTier`)."""
        return not self.tiers or tier in self.tiers

    def apply(self, event: Any) -> None:
        if isinstance(event, InstanceEvent):
            self.apply_instance(event)
        elif isinstance(event, ReplicasetEvent):
            self.apply_replicaset(event)
        else:
            self.apply_bucket(event)

    def apply_instance(self, e: InstanceEvent) -> None:
        key = canonical(e.instance_uuid)
        if e.op == "delete":
            self.instances.pop(key, None)
            return
        old = self.instances.get(key, (key, None, None, None))
        rs = canonical(e.replicaset_uuid) if e.replicaset_uuid else None
        self.instances[key] = (
            key,
            rs or old[1],
            e.current_state if e.current_state is not None else old[2],
            e.address if e.address is not None else old[3],
        )

    def apply_replicaset(self, e: ReplicasetEvent) -> None:
        key = canonical(e.replicaset_uuid)
        if e.op == "delete":
            gone = self.replicasets.pop(key, None)
            if gone:
                self.clear(gone[1])
            return
        master = canonical(e.current_master_uuid) if e.current_master_uuid else None
        if key not in self.replicasets:
            assert e.tier
            self.clear(e.tier)
            self.replicasets[key] = (key, e.tier, master)
            return
        _, old_tier, old_master = self.replicasets[key]
        tier = e.tier or old_tier
        if tier != old_tier:
            self.clear(old_tier)
            self.clear(tier)
        self.replicasets[key] = (key, tier, master or old_master)

    def apply_bucket(self, e: BucketEvent) -> None:
        owner = canonical(e.current_replicaset_uuid)
        ranges = list(self.maps.get(e.tier, []))
        hits = [r for r in ranges if r[0] <= e.end and e.start <= r[1]]
        if e.op == "delete":
            if hits == [(e.start, e.end, owner)]:
                ranges.remove(hits[0])
            elif hits:
                ranges = []
            if e.tier in self.maps:
                self._set_map(e.tier, ranges)
            return
        if hits == [(e.start, e.end, owner)]:
            self._set_map(e.tier, ranges)
            return
        if hits:
            ranges = []
        self._set_map(e.tier, [*ranges, (e.start, e.end, owner)])

    def apply_snapshot(self, tier: str, events: list[BucketEvent]) -> None:
        self._set_map(
            tier, [(e.start, e.end, canonical(e.current_replicaset_uuid)) for e in events]
        )

    def owner(self, tier: str, bucket: int) -> str | None:
        for start, end, owner in self.maps[tier]:
            if start <= bucket <= end:
                return owner
        return None

    def master(
        self, tier: str, bucket: int
    ) -> tuple[str, str | None, str | None, str | None] | None:
        owner = self.owner(tier, bucket)
        rs = self.replicasets.get(owner) if owner else None
        if rs is None or rs[2] is None:
            return None
        return self.instances.get(rs[2])


def model_state(model: Model) -> tuple[Any, ...]:
    """The model's state in the shape of ``strategies.full_state`` of a ``Topology``."""
    return (
        model.tiers,
        {k: Instance(*v) for k, v in model.instances.items()},
        {k: Replicaset(*v) for k, v in model.replicasets.items()},
        model.maps,
        model.epochs,
    )
