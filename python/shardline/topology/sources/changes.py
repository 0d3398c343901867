"""What a topology source hands out, and how each item is applied to a :class:`Topology`.

Besides the three events of :mod:`shardline.topology.events` a source hands out two
*snapshots*: :class:`BucketSnapshot`, one tier's whole bucket map (a full poll of
``_pico_bucket(tier)``), and :class:`TopologySnapshot`, everything the source knows, which
rebuilds a topology from scratch (after a connect or a reconnect).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from shardline._core import BucketPayload, Instance, Topology
from shardline.errors import UnknownTier
from shardline.topology.events import BucketEvent, InstanceEvent, ReplicasetEvent

__all__ = [
    "BucketSnapshot",
    "TopologyChange",
    "TopologySnapshot",
    "apply_change",
]


@dataclass(frozen=True, slots=True)
class BucketSnapshot:
    """The whole bucket map of ``tier``: ranges absent from it are gone.

    ``payload`` is what ``SELECT _pico_bucket(tier)`` returned: its JSON text (str or bytes,
    undecoded, so that an unchanged poll is recognised without decoding), that text already
    read into a :class:`BucketPayload` (which :class:`PollingSource` hands out, so the text is
    read once), or a sequence of :class:`BucketEvent` or of decoded ``_pico_bucket`` rows.
    """

    tier: str
    payload: str | bytes | BucketPayload | Sequence[BucketEvent | Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class TopologySnapshot:
    """Everything a source knows, to rebuild a topology from.

    ``tiers`` is the tier configuration (name → bucket count); ``replicasets`` and
    ``instances`` are ``"replace"`` events for every replicaset and instance that exists, in
    that order; ``buckets`` holds the tiers whose bucket maps were read. ``scope`` is the set
    of tiers the snapshot speaks for (``None``: the whole cluster): replicasets of those tiers
    missing from the snapshot, and their instances, are gone. A tier of the scope missing from
    ``buckets`` keeps its map as it is. A ``complete`` snapshot is everything there is (a pushed
    stream's snapshot after a reconnect): the topology is cleared before it is applied, so
    nothing it held before survives, whatever the snapshot says or omits.
    """

    tiers: Mapping[str, int]
    replicasets: tuple[ReplicasetEvent, ...] = ()
    instances: tuple[InstanceEvent, ...] = ()
    buckets: tuple[BucketSnapshot, ...] = ()
    scope: frozenset[str] | None = field(default=None)
    complete: bool = False


TopologyChange: TypeAlias = (
    InstanceEvent | ReplicasetEvent | BucketEvent | BucketSnapshot | TopologySnapshot
)
"""Anything a :class:`~shardline.topology.sources.TopologySource` hands out."""


def apply_change(topology: Topology, change: TopologyChange) -> int:
    """Applies one change to ``topology`` and returns how many changes it made (0: it already
    held all of it).

    Events go to :meth:`Topology.apply`, a :class:`BucketSnapshot` to
    :meth:`Topology.apply_bucket_snapshot`. A :class:`TopologySnapshot` sets the tier
    configuration if the topology has none, deletes what the topology holds in the snapshot's
    scope that the snapshot lacks, applies what differs (replicasets, then instances), then
    each tier's bucket map: the topology then holds exactly the snapshot, except for tiers
    whose bucket maps it lacks, which keep theirs.

    Raises :class:`shardline.InvalidEvent` for a malformed change (nothing of it applied) and
    :class:`shardline.UnknownTier` for a bucket map of a tier the topology has no bucket count
    for; a :class:`TopologySnapshot` applies everything else before raising the latter.
    """
    if isinstance(change, BucketSnapshot):
        return int(topology.apply_bucket_snapshot(change.tier, change.payload))
    if isinstance(change, TopologySnapshot):
        cleared = int(change.complete and topology.clear())
        return cleared + _apply_snapshot(topology, change)
    topology.apply(change)
    return 1


def _apply_snapshot(topology: Topology, snapshot: TopologySnapshot) -> int:
    applied = int(topology.apply_tiers(snapshot.tiers))
    configured = topology.tiers
    unmappable = sorted(
        tier for tier, count in snapshot.tiers.items() if configured.get(tier) != count
    )

    def in_scope(tier: str) -> bool:
        return snapshot.scope is None or tier in snapshot.scope

    known_replicasets = topology.replicasets
    scoped = {key for key, rs in known_replicasets.items() if in_scope(rs.tier)}
    wanted = {_canonical(event.replicaset_uuid) for event in snapshot.replicasets}
    for gone in sorted(scoped - wanted):
        topology.apply(ReplicasetEvent("delete", gone))
        applied += 1
    for event in snapshot.replicasets:
        known = known_replicasets.get(_canonical(event.replicaset_uuid))
        if (
            known is None
            or known.tier != event.tier
            or (
                event.current_master_uuid is not None
                and known.current_master_uuid != event.current_master_uuid
            )
        ):
            topology.apply(event)
            applied += 1

    known_instances = topology.instances
    wanted_instances = {_canonical(event.instance_uuid) for event in snapshot.instances}
    for key, instance in known_instances.items():
        # an instance is in the scope through the replicaset the topology knew it by
        if key not in wanted_instances and (
            snapshot.scope is None or instance.replicaset_uuid in scoped
        ):
            topology.apply(InstanceEvent("delete", key))
            applied += 1
    for instance_event in snapshot.instances:
        known_instance = known_instances.get(_canonical(instance_event.instance_uuid))
        applied += _apply_instance(topology, known_instance, instance_event)

    for buckets in snapshot.buckets:
        if buckets.tier not in unmappable:
            applied += int(topology.apply_bucket_snapshot(buckets.tier, buckets.payload))
    if unmappable:
        raise UnknownTier(
            f"the topology has no bucket count for tier(s) {', '.join(map(repr, unmappable))}"
            f" as the snapshot gives them ({_counts(snapshot.tiers, unmappable)}; the topology"
            f" has {_counts(configured, unmappable)}): their bucket maps were not applied"
        )
    return applied


def _apply_instance(topology: Topology, known: Instance | None, event: InstanceEvent) -> int:
    """Brings a known instance to ``event``'s fields; 0 if it already has them."""
    fields = (event.replicaset_uuid, event.current_state, event.address)
    if known is not None:
        held = (known.replicaset_uuid, known.current_state, known.address)
        if held == fields:
            return 0
        if any(value is None and old is not None for value, old in zip(fields, held, strict=True)):
            # "replace" leaves a field it does not give unchanged: drop the instance first
            topology.apply(InstanceEvent("delete", event.instance_uuid))
    topology.apply(event)
    return 1


def _canonical(text: str) -> str:
    """The topology's spelling of a uuid (a malformed one is left for the topology to refuse)."""
    try:
        return str(uuid.UUID(text))
    except ValueError:
        return text


def _counts(tiers: Mapping[str, int], names: Sequence[str]) -> str:
    return ", ".join(f"{name}={tiers.get(name, 'none')}" for name in names)
