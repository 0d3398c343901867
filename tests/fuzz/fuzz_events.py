"""Fuzz target: topology events built from hostile field values, ``BucketEvent.from_row`` on any
value, ``Topology.apply_tiers``, and the lookups that take caller input (tier, bucket id, key).

Contract: ``apply``/``apply_*`` raise only ``InvalidEvent`` (``UnknownTier`` for a tier never
configured, once tiers are known, and ``TierWithoutBuckets`` for one configured with 0 buckets: a
bucket event of either is never accepted) and change nothing then; an accepted event changes the
state exactly as the reference model does. ``from_row`` raises only ``InvalidEvent``.
``apply_tiers`` raises only ``InvalidEvent`` and never takes a bool for a count. Lookups never
change state and raise only ``UnknownTier`` (``TierWithoutBuckets`` exactly for a tier of 0
buckets), ``UnhashableKey`` or a ``ShardlineError`` that is also a ``ValueError`` (an
out-of-range bucket id); their answers are the model's.

Input layout: structure-aware throughout (``FuzzedDataProvider``); a seed is any byte string.
"""

from __future__ import annotations

from typing import Any

import atheris
from fuzzkit import (
    BUCKET_COUNTS,
    REFUSALS,
    TIERS,
    UUIDS,
    Violation,
    check,
    integer,
    main,
    rejects_cleanly,
    show,
    text,
    value,
)

from shardline import (
    BucketEvent,
    Instance,
    InstanceEvent,
    InvalidEvent,
    ReplicasetEvent,
    ShardlineError,
    TierWithoutBuckets,
    Topology,
    UnhashableKey,
    UnknownTier,
)
from support.strategies import full_state
from support.topology_model import Model, model_state

METHODS = ["apply_instance", "apply_replicaset", "apply_bucket"]


def good_or(fdp: atheris.FuzzedDataProvider, good: Any) -> Any:
    """``good`` most of the time, so that events get past the first field."""
    return good if fdp.ConsumeIntInRange(0, 7) else value(fdp)


def event(fdp: atheris.FuzzedDataProvider) -> Any:
    op = good_or(fdp, fdp.PickValueInList(["replace", "delete"]))
    kind = fdp.ConsumeIntInRange(0, 3)
    if kind == 0:
        return InstanceEvent(
            op,
            good_or(fdp, fdp.PickValueInList(UUIDS)),
            good_or(fdp, fdp.PickValueInList([*UUIDS, None])),
            good_or(fdp, fdp.PickValueInList(["Online", "Offline", None])),
            good_or(fdp, fdp.PickValueInList(["127.0.0.1:3301", None])),
        )
    if kind == 1:
        return ReplicasetEvent(
            op,
            good_or(fdp, fdp.PickValueInList(UUIDS)),
            good_or(fdp, fdp.PickValueInList([*TIERS, None])),
            good_or(fdp, fdp.PickValueInList([*UUIDS, None])),
        )
    if kind == 2:
        start = good_or(fdp, fdp.ConsumeIntInRange(1, 120))
        return BucketEvent(
            good_or(fdp, fdp.PickValueInList(TIERS)),
            start,
            good_or(fdp, start + fdp.ConsumeIntInRange(0, 50) if type(start) is int else 1),
            good_or(fdp, fdp.PickValueInList(UUIDS)),
            op=op,
        )
    return value(fdp)  # not an event at all


def row(fdp: atheris.FuzzedDataProvider) -> Any:
    if fdp.ConsumeIntInRange(0, 5) == 0:
        return value(fdp)
    fields: dict[Any, Any] = {
        "bucket_id_start": good_or(fdp, 1),
        "bucket_id_end": good_or(fdp, 10),
        "current_replicaset_uuid": good_or(fdp, fdp.PickValueInList(UUIDS)),
        "state": good_or(fdp, "active"),
        "tier_name": good_or(fdp, fdp.PickValueInList(TIERS)),
    }
    if fdp.ConsumeIntInRange(0, 7) == 0:
        del fields[fdp.PickValueInList(list(fields))]
    return fields


def from_row(fdp: atheris.FuzzedDataProvider) -> BucketEvent | None:
    given = row(fdp)
    try:
        parsed = BucketEvent.from_row(given)
    except InvalidEvent:
        return None
    check(
        isinstance(given, dict)
        and type(parsed.start) is int
        and type(parsed.end) is int
        and 1 <= parsed.start <= parsed.end <= 2**32 - 1
        and isinstance(parsed.tier, str)
        and parsed.tier == given.get("tier_name"),
        f"from_row accepted {show(given)} as {show(parsed)}",
    )
    return parsed


def apply_tiers(fdp: atheris.FuzzedDataProvider, topology: Topology, model: Model) -> None:
    tiers = dict(BUCKET_COUNTS) if fdp.ConsumeBool() else {text(fdp): value(fdp)}
    if fdp.ConsumeBool():
        tiers[fdp.PickValueInList(TIERS)] = value(fdp)
    known = bool(topology.tiers)
    accepted, changed = rejects_cleanly(
        topology, (InvalidEvent,), lambda: topology.apply_tiers(tiers), "apply_tiers"
    )
    if accepted and changed:
        check(not known, "apply_tiers changed a configuration already set")
        for name, count in tiers.items():
            check(
                type(count) is int and 0 <= count <= 2**32 - 1 and isinstance(name, str),
                f"apply_tiers accepted {show(name)}: {show(count)}",
            )
        model.apply_tiers(tiers)


def lookup_error(error: BaseException) -> bool:
    if isinstance(error, UnknownTier | UnhashableKey):
        return True
    return isinstance(error, ShardlineError) and isinstance(error, ValueError)


def lookup(fdp: atheris.FuzzedDataProvider, topology: Topology, model: Model) -> None:
    tier = fdp.PickValueInList(TIERS) if fdp.ConsumeIntInRange(0, 7) else text(fdp)
    bucket = integer(fdp) if fdp.ConsumeIntInRange(0, 7) else value(fdp)
    before = full_state(topology)
    kind = fdp.ConsumeIntInRange(0, 3)
    try:
        if kind == 0:
            answer = topology.owner(tier, bucket)
            expected = model.owner(tier, bucket) if tier in model.maps else None
            check(
                answer == expected,
                f"owner({show(tier)}, {show(bucket)}) = {show(answer)}, not {show(expected)}",
            )
        elif kind == 1:
            ids = [bucket, integer(fdp)]
            answers = topology.owners(tier, ids)
            expected_all = [model.owner(tier, i) if tier in model.maps else None for i in ids]
            check(answers == expected_all, f"owners({show(tier)}, {show(ids)}) = {show(answers)}")
        elif kind == 2:
            found = topology.find_bucket_master(tier, bucket)
            master = model.master(tier, bucket) if tier in model.maps else None
            check(
                found == (Instance(*master) if master else None),
                f"find_bucket_master({show(tier)}, {show(bucket)}) = {show(found)},"
                f" not {show(master)}",
            )
        else:
            key = value(fdp)
            topology.route(tier, key)
            computed = topology.bucket_id(tier, key)
            count = model.tiers.get(tier)
            check(
                count is not None and 1 <= computed <= count,
                f"bucket_id({show(tier)}, {show(key)}) = {computed} with bucket_count {count}",
            )
    except (TypeError, ValueError, LookupError) as error:
        # a bucket id of another type than int is the caller's bug: TypeError is its answer
        wrong_type = isinstance(error, TypeError) and type(bucket) is not int and kind < 3
        if not (lookup_error(error) or wrong_type):
            raise
        if isinstance(error, TierWithoutBuckets):
            check(model.tiers.get(tier) == 0, f"TierWithoutBuckets for the tier {show(tier)}")
        elif isinstance(error, UnknownTier):
            # hashing needs the tier's bucket count; the other lookups only its map
            known = model.tiers if kind == 3 else model.maps
            check(tier not in known, f"UnknownTier for the known tier {show(tier)}")
    check(full_state(topology) == before, "a lookup changed the topology")


def apply_event(topology: Topology, model: Model, given: Any, method: str) -> None:
    call = getattr(topology, method)
    accepted, _ = rejects_cleanly(
        topology, REFUSALS, lambda: call(given), f"{method}({show(given)})"
    )
    if not accepted:
        return
    configured = topology.tiers
    check(
        not (isinstance(given, BucketEvent) and configured and configured.get(given.tier, 0) == 0),
        f"{method} accepted a bucket event of a tier without buckets in {configured}:"
        f" {show(given)}",
    )
    try:
        model.apply(given) if method == "apply" else getattr(model, method)(given)
    except (ValueError, TypeError, AttributeError, AssertionError) as error:
        raise Violation(f"{method} accepted {show(given)}, which the model cannot read") from error
    after = full_state(topology)
    check(after == model_state(model), f"{method}({show(given)}) left {after}, not the model's")


def test_one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    topology, model = Topology(), Model()
    for _ in range(fdp.ConsumeIntInRange(1, 12)):
        step = fdp.ConsumeIntInRange(0, 7)
        if step == 0:
            apply_tiers(fdp, topology, model)
        elif step == 1:
            parsed = from_row(fdp)
            if parsed is not None:
                apply_event(topology, model, parsed, "apply")
        elif step == 2:
            lookup(fdp, topology, model)
        elif step == 3:
            method = fdp.PickValueInList(METHODS)
            apply_event(topology, model, event(fdp), method)
        else:
            apply_event(topology, model, event(fdp), "apply")


if __name__ == "__main__":
    main(test_one_input)
