"""Fuzz target: a poll of ``_pico_bucket(tier)`` given to ``Topology.apply_bucket_snapshot``, as
JSON text (str and bytes), as rows (dicts) and as ``BucketEvent`` objects.

Contract (the method's docstring): a bad poll raises ``InvalidEvent`` (``UnknownTier`` for a tier
never configured, once tiers are known) and the old map stays, epoch included; an accepted poll
makes the tier's map exactly its ranges, as the reference model computes them, returns whether
the map changed, and is recognised as unchanged when applied again. The same rows given as rows,
as text and as bytes are accepted or rejected alike, with the same resulting map. Reading a poll
text, accepted or not, allocates (as far as ``tracemalloc`` sees) at most 4 times its size and
16 KiB more.

Input layout: byte 0 picks the mode. Modes 0 and 1 give the rest of the input as the poll text
(0: str, decoded as UTF-8 with surrogates let through; 1: bytes), and byte 1 the setting (bit 0:
tiers configured; bit 1: the poll is for tier "v", else "t"), so a seed is ``b"\\x00\\x01" + text``.
With bit 2 of byte 1 set the text is nested deep first (``fuzzkit.nested_text``).
Mode 2 and up build rows from the input (structure-aware), mostly valid with hostile fields.
"""

from __future__ import annotations

import itertools
import json
import tracemalloc
import uuid
from collections.abc import Callable
from typing import Any

import atheris
from fuzzkit import (
    BUCKET_COUNTS,
    REFUSALS,
    UUIDS,
    Violation,
    check,
    integer,
    main,
    nested_text,
    rejects_cleanly,
    show,
    text,
    value,
)

from shardline import BucketEvent, ShardlineError, Topology
from shardline.topology.sources import BucketPayload
from support.strategies import full_state
from support.topology_model import Model, model_state

# Issue 10: a poll never costs more than a small multiple of its size (the goal is 4x).
MEMORY_FACTOR = 4
MEMORY_SLACK = 16 << 10
BASE = [BucketEvent("t", 1, 1000, UUIDS[0]), BucketEvent("t", 1001, 3000, UUIDS[1])]


def setup(configured: bool) -> tuple[Topology, Model]:
    """A topology (and its model) with a map already in place, so a change shows."""
    topology, model = Topology(), Model()
    if configured:
        topology.apply_tiers(BUCKET_COUNTS)
        model.apply_tiers(BUCKET_COUNTS)
    topology.apply_bucket_snapshot("t", BASE)
    model.apply_snapshot("t", BASE)
    return topology, model


def bound_ok(bound: Any, count: int | None) -> bool:
    return type(bound) is int and 1 <= bound <= (count or 2**32 - 1)


def check_accepted(
    topology: Topology,
    model: Model,
    tier: str,
    rows: Any,
    changed: Any,
    before: tuple[Any, ...],
    what: str,
) -> None:
    """An accepted poll: every row was valid, and the map is the model's."""
    check(isinstance(rows, list), f"{what}: accepted a poll that is not an array: {show(rows)}")
    configured = topology.tiers
    ranges = []
    for row in rows:
        check(isinstance(row, dict), f"{what}: accepted a row that is not an object: {show(row)}")
        start, end = row.get("bucket_id_start"), row.get("bucket_id_end")
        count = configured.get(tier)
        check(
            bound_ok(start, count) and bound_ok(end, count) and start <= end,
            f"{what}: accepted the bounds {show(start)}..{show(end)} (bucket_count {count})",
        )
        check(row.get("tier_name") == tier, f"{what}: accepted a row of tier {show(row)}")
        owner = row.get("current_replicaset_uuid")
        check(isinstance(owner, str), f"{what}: accepted the owner {show(owner)}")
        ranges.append(BucketEvent(tier, start, end, str(uuid.UUID(owner))))
    check(
        not configured or tier in configured,
        f"{what}: accepted a poll of tier {show(tier)}, not configured in {configured}",
    )
    model.apply_snapshot(tier, ranges)
    after = full_state(topology)
    check(after == model_state(model), f"{what}: {after} differs from the model's")
    check(
        changed == (before[3].get(tier, []) != after[3][tier]),
        f"{what}: returned {show(changed)} for a map that went from {before[3].get(tier)}",
    )


def bounded(tier: str, poll: Any, call: Callable[[], Any]) -> Any:
    """``call()``, after checking that reading the poll text (``BucketPayload``, what
    ``apply_bucket_snapshot`` does with text) costs Python allocations of at most
    ``MEMORY_FACTOR`` times its size (plus a little), whether it is accepted or rejected.

    Only the reading is measured: registering a new tier interns its name, and the
    interpreter-wide table of interned strings now and then resizes itself (about 1 MB after a
    long run), a cost of the interpreter that is not the poll's."""
    if not isinstance(poll, str | bytes):
        return call()
    size = len(poll) if isinstance(poll, bytes) else len(poll.encode("utf-8", "surrogatepass"))
    tracemalloc.start()
    try:
        BucketPayload(tier, poll)
    except ShardlineError:
        pass
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    check(
        peak <= MEMORY_SLACK + MEMORY_FACTOR * size,
        f"a poll text of {size} bytes took {peak} bytes of Python allocations to read",
    )
    return call()


def apply_poll(configured: bool, tier: str, poll: Any, rows: Any, what: str) -> tuple[Any, ...]:
    """Applies one poll to a fresh topology; the topology's state after it, or None."""
    topology, model = setup(configured)
    before = full_state(topology)
    accepted, changed = rejects_cleanly(
        topology,
        REFUSALS,
        lambda: bounded(tier, poll, lambda: topology.apply_bucket_snapshot(tier, poll)),
        what,
    )
    if not accepted:
        return ("rejected",)
    if isinstance(poll, str | bytes):
        try:
            rows = json.loads(poll)
        except (ValueError, RecursionError) as error:
            raise Violation(f"{what}: accepted text that is not JSON ({error})") from None
    check_accepted(topology, model, tier, rows, changed, before, what)
    settled = full_state(topology)
    again = topology.apply_bucket_snapshot(tier, poll)
    check(
        again is False and full_state(topology) == settled,
        f"{what}: the same poll applied twice returned {show(again)} or changed the map",
    )
    return ("accepted", tuple(settled[3][tier]))


# The text forms refuse what decoded rows cannot be checked for without reading every field
# (documented on BucketPayload): nesting this deep (serde_json's limit) and a lone surrogate
# escape anywhere, ignored fields included.
TEXT_DEPTH_LIMIT = 128


def text_refusal(rows: Any) -> str | None:
    """Why the JSON text of `rows` is refused whatever its rows say, or None; walks the value
    without recursing in Python."""
    deepest, pending = 0, [(rows, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, str) and any("\ud800" <= char <= "\udfff" for char in item):
            return f"a lone surrogate in {item!r}"
        if isinstance(item, dict):
            pending.extend((key, depth + 1) for key in item)
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, depth)
            pending.extend((child, depth + 1) for child in item)
    return f"nested {deepest} deep" if deepest >= TEXT_DEPTH_LIMIT else None


def structured(fdp: atheris.FuzzedDataProvider) -> None:
    configured = fdp.ConsumeBool()
    tier = "t" if fdp.ConsumeProbability() < 0.8 else text(fdp)
    cuts = sorted({integer(fdp) for _ in range(fdp.ConsumeIntInRange(0, 4))})
    bounds = [1, *cuts, 3000]
    rows: list[Any] = []
    for start, end in itertools.pairwise(bounds):
        row: Any = {
            "bucket_id_start": start,
            "bucket_id_end": end - 1 if end > start else end,
            "current_replicaset_uuid": fdp.PickValueInList(UUIDS),
            "state": "active",
            "tier_name": tier,
            "target_replicaset_uuid": None,
        }
        for field in list(row):
            chance = fdp.ConsumeIntInRange(0, 15)
            if chance == 0:
                row[field] = value(fdp)
            elif chance == 1:
                del row[field]
        if fdp.ConsumeIntInRange(0, 30) == 0:
            row = value(fdp)
        rows.append(row)
    outcomes = {"rows": apply_poll(configured, tier, rows, rows, "rows")}
    events = [
        BucketEvent(
            row.get("tier_name"),
            row.get("bucket_id_start"),
            row.get("bucket_id_end"),
            row.get("current_replicaset_uuid"),
        )
        for row in rows
        if isinstance(row, dict)
    ]
    if len(events) == len(rows):
        outcomes["events"] = apply_poll(configured, tier, events, rows, "events")
    try:
        poll_text = json.dumps(rows, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        poll_text = None
    refusal = None if poll_text is None else text_refusal(rows)
    if poll_text is not None and refusal is not None:
        for form, poll in (("str", poll_text), ("bytes", poll_text.encode())):
            check(
                apply_poll(configured, tier, poll, rows, form) == ("rejected",),
                f"{form} with {refusal} was not rejected",
            )
        poll_text = None
    if poll_text is not None:
        outcomes["str"] = apply_poll(configured, tier, poll_text, rows, "str")
        outcomes["bytes"] = apply_poll(configured, tier, poll_text.encode(), rows, "bytes")
    check(
        len(set(outcomes.values())) == 1,
        f"the same rows in different forms got different outcomes: {outcomes}",
    )


def test_one_input(data: bytes) -> None:
    if len(data) < 2:
        return
    mode, flags, body = data[0] % 4, data[1], data[2:]
    if flags & 4:
        body = nested_text(body)
    if mode >= 2:
        structured(atheris.FuzzedDataProvider(data[1:]))
        return
    poll: str | bytes = body
    if mode == 0:
        try:
            poll = body.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            # still a str: invalid bytes become lone surrogates, which a str can hold
            poll = body.decode("utf-8", "surrogateescape")
    tier = "t" if flags & 2 == 0 else "v"  # "v" is in no configuration
    apply_poll(bool(flags & 1), tier, poll, None, "str" if mode == 0 else "bytes")


if __name__ == "__main__":
    main(test_one_input)
