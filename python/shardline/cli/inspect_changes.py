"""What changed between two polls of ``shardline inspect --watch``: a pure function of the two
snapshots (the documents ``inspect --json`` prints, with the tiers' epochs)."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Changed", "Changes", "Membership", "MovedRange", "changes_between", "moved_ranges"]

# The fields of a row that count as a change, and the key that names the row.
INSTANCE_FIELDS = ("name", "replicaset_uuid", "state", "address", "master")
REPLICASET_FIELDS = ("name", "tier", "master_uuid")
TIER_FIELDS = ("bucket_count",)
HEALTH_FIELDS = ("state",)


@dataclass(frozen=True, slots=True)
class Changed:
    """One member whose fields changed: ``fields`` maps each to ``(before, after)``."""

    key: str
    fields: Mapping[str, tuple[Any, Any]]


@dataclass(frozen=True, slots=True)
class Membership:
    """The members of one kind (tiers, replicasets, instances) added, removed and changed,
    each sorted by key."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[Changed, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)


@dataclass(frozen=True, slots=True)
class MovedRange:
    """Buckets ``start``..``end`` of ``tier`` owned by ``before`` and now by ``after`` (a
    replicaset uuid; ``None``: no range held them)."""

    tier: str
    start: int
    end: int
    before: str | None
    after: str | None


@dataclass(frozen=True, slots=True)
class Changes:
    """What changed from one poll to the next: membership, epochs (tier → ``(before,
    after)``; a tier new or gone has ``None`` on that side) and the bucket ranges whose owner
    changed, as maximal runs of buckets; with ``--probe``, ``health``: the instances whose
    health state changed (only ``changed``: an instance that comes or goes is in
    ``instances``)."""

    tiers: Membership
    replicasets: Membership
    instances: Membership
    epochs: Mapping[str, tuple[int | None, int | None]]
    moved: tuple[MovedRange, ...]
    health: Membership = Membership()

    def __bool__(self) -> bool:
        return bool(
            self.tiers
            or self.replicasets
            or self.instances
            or self.epochs
            or self.moved
            or self.health
        )

    def to_json(self) -> dict[str, Any]:
        """JSON-ready data (``inspect --watch --json`` writes it as ``changes``)."""

        def membership(part: Membership) -> dict[str, Any]:
            return {
                "added": list(part.added),
                "removed": list(part.removed),
                "changed": [
                    {"key": c.key, "fields": {f: list(v) for f, v in c.fields.items()}}
                    for c in part.changed
                ],
            }

        return {
            "tiers": membership(self.tiers),
            "replicasets": membership(self.replicasets),
            "instances": membership(self.instances),
            "epochs": {tier: list(pair) for tier, pair in self.epochs.items()},
            "moved_ranges": [
                {"tier": m.tier, "start": m.start, "end": m.end, "from": m.before, "to": m.after}
                for m in self.moved
            ],
            "health": membership(self.health),
        }

    def lines(self) -> list[str]:
        """One line per change, for a person (``inspect --watch --plain``)."""
        out: list[str] = []
        for kind, part in (
            ("tier", self.tiers),
            ("replicaset", self.replicasets),
            ("instance", self.instances),
            ("health of instance", self.health),
        ):
            out.extend(f"{kind} {key} added" for key in part.added)
            out.extend(f"{kind} {key} removed" for key in part.removed)
            for changed in part.changed:
                what = ", ".join(
                    f"{field} {_shown(before)} -> {_shown(after)}"
                    for field, (before, after) in changed.fields.items()
                )
                out.append(f"{kind} {changed.key} changed: {what}")
        for tier, (before, after) in self.epochs.items():
            out.append(f"tier {tier} epoch {_shown(before)} -> {_shown(after)}")
        for m in self.moved:
            out.append(
                f"tier {m.tier} buckets {m.start}-{m.end} moved:"
                f" {m.before or 'unmapped'} -> {m.after or 'unmapped'}"
            )
        return out


def _shown(value: Any) -> str:
    return "-" if value is None else str(value)


def _membership(
    before: Iterable[Mapping[str, Any]],
    after: Iterable[Mapping[str, Any]],
    key: str,
    fields: Sequence[str],
) -> Membership:
    old = {row[key]: row for row in before}
    new = {row[key]: row for row in after}
    changed = []
    for name in sorted(old.keys() & new.keys()):
        diff = {
            field: (old[name].get(field), new[name].get(field))
            for field in fields
            if old[name].get(field) != new[name].get(field)
        }
        if diff:
            changed.append(Changed(name, diff))
    return Membership(
        added=tuple(sorted(new.keys() - old.keys())),
        removed=tuple(sorted(old.keys() - new.keys())),
        changed=tuple(changed),
    )


def moved_ranges(
    tier: str,
    before: Sequence[tuple[int, int, str]],
    after: Sequence[tuple[int, int, str]],
) -> list[MovedRange]:
    """The maximal runs of buckets of ``tier`` whose owner differs between two maps (each a
    list of non-overlapping ``(start, end, owner)``), in bucket order.

    Implementation notes:
        The boundaries of both maps cut the buckets into pieces within which neither map
        changes owner; each piece is compared once, and neighbours with the same move are
        joined. O((r + r') log(r + r')) in the ranges, whatever the bucket count.
    """

    def owners(ranges: Sequence[tuple[int, int, str]]) -> tuple[list[int], list[int], list[str]]:
        ordered = sorted(ranges)
        return [r[0] for r in ordered], [r[1] for r in ordered], [r[2] for r in ordered]

    def owner_at(map_: tuple[list[int], list[int], list[str]], bucket: int) -> str | None:
        starts, ends, names = map_
        at = bisect.bisect_right(starts, bucket) - 1
        return names[at] if at >= 0 and bucket <= ends[at] else None

    old, new = owners(before), owners(after)
    cuts = sorted({start for start in old[0] + new[0]} | {end + 1 for end in old[1] + new[1]})
    moved: list[MovedRange] = []
    for start, stop in itertools.pairwise(cuts):
        was, now = owner_at(old, start), owner_at(new, start)
        if was == now:
            continue
        last = moved[-1] if moved else None
        if last is not None and last.end == start - 1 and (last.before, last.after) == (was, now):
            moved[-1] = MovedRange(tier, last.start, stop - 1, was, now)
        else:
            moved.append(MovedRange(tier, start, stop - 1, was, now))
    return moved


def changes_between(before: Mapping[str, Any], after: Mapping[str, Any]) -> Changes:
    """What changed from the snapshot ``before`` to ``after``.

    A snapshot is the document ``shardline inspect --json`` prints (``tiers``,
    ``replicasets``, ``instances``, ``bucket_ranges``) with ``epochs``, tier → the tier's
    epoch. Tiers are keyed by name, replicasets and instances by uuid; an instance's name,
    replicaset, state, address and role, a replicaset's name, tier and master, and a tier's
    bucket count are compared; when both have a ``health`` part (``--probe``), each instance's
    health state. Pure: it reads nothing else.
    """
    epochs_before: Mapping[str, int] = before.get("epochs", {})
    epochs_after: Mapping[str, int] = after.get("epochs", {})
    epochs = {
        tier: (epochs_before.get(tier), epochs_after.get(tier))
        for tier in sorted(epochs_before.keys() | epochs_after.keys())
        if epochs_before.get(tier) != epochs_after.get(tier)
    }

    def by_tier(document: Mapping[str, Any]) -> dict[str, list[tuple[int, int, str]]]:
        maps: dict[str, list[tuple[int, int, str]]] = {}
        for row in document["bucket_ranges"]:
            maps.setdefault(row["tier"], []).append(
                (row["start"], row["end"], row["replicaset_uuid"])
            )
        return maps

    maps_before, maps_after = by_tier(before), by_tier(after)
    moved = [
        move
        for tier in sorted(maps_before.keys() | maps_after.keys())
        for move in moved_ranges(tier, maps_before.get(tier, []), maps_after.get(tier, []))
    ]
    health = Membership()
    if before.get("health") and after.get("health"):
        probed = _membership(
            before["health"]["instances"], after["health"]["instances"], "uuid", HEALTH_FIELDS
        )
        health = Membership(changed=probed.changed)
    return Changes(
        health=health,
        tiers=_membership(before["tiers"], after["tiers"], "name", TIER_FIELDS),
        replicasets=_membership(
            before["replicasets"], after["replicasets"], "uuid", REPLICASET_FIELDS
        ),
        instances=_membership(before["instances"], after["instances"], "uuid", INSTANCE_FIELDS),
        epochs=epochs,
        moved=tuple(moved),
    )
