"""Fuzz target: notification documents in the ADR's format (``parse_event_document``, and
``parse_snapshot`` for a burst), and the events they yield applied to a topology, as
``NotificationSource`` does.

Contract (the parsers' docstrings): a bad document raises ``DocumentError`` and nothing else; the
same document as str and as bytes parses alike. An accepted document holds only what the format
allows (canonical uuids, non-empty texts, bounded ids), and its events applied to a topology raise
only ``InvalidEvent``/``UnknownTier`` (changing nothing) or change it as the reference model does.

Input layout: byte 0 picks the parser (even: event document, odd: snapshot burst, its documents
separated by newlines) and byte 1 the form (even: str, odd: bytes); the rest is the document, so
a seed is ``b"\\x00\\x00" + json``.
With bit 1 of byte 1 set the document is nested deep first (``fuzzkit.nested_text``).
With byte 0 >= 128 the document is built from the input instead (structure-aware).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import atheris
from fuzzkit import (
    BUCKET_COUNTS,
    TIERS,
    UUIDS,
    check,
    json_value,
    main,
    nested_text,
    rejects_cleanly,
    show,
)

from shardline import InvalidEvent, Topology, UnknownTier
from shardline.topology.sources.notification_documents import (
    MAX_TEXT,
    DocumentError,
    parse_event_document,
    parse_snapshot,
)
from support.strategies import full_state
from support.topology_model import Model, model_state


def parse(document: str | bytes, snapshot: bool) -> Any:
    try:
        if not snapshot:
            return parse_event_document(document)
        if isinstance(document, str):
            return parse_snapshot(document.split("\n"))
        return parse_snapshot(document.split(b"\n"))
    except DocumentError as error:
        return ("rejected", error.reason)


def check_text(value: Any, name: str) -> None:
    check(
        isinstance(value, str) and 0 < len(value) <= MAX_TEXT,
        f"accepted the {name} {show(value)}",
    )


def check_uuid(value: Any, name: str) -> None:
    try:
        canonical = isinstance(value, str) and str(uuid.UUID(value)) == value
    except ValueError:
        canonical = False
    check(canonical, f"accepted the {name} {show(value)}, not a canonical uuid")


def apply(topology: Topology, model: Model, call: Any, mirror: Any, what: str) -> None:
    accepted, _ = rejects_cleanly(topology, (InvalidEvent, UnknownTier), call, what)
    if accepted:
        mirror()
        after = full_state(topology)
        check(after == model_state(model), f"{what} left {after}, not the model's")


def apply_event(topology: Topology, model: Model, event: Any) -> None:
    for name in (
        "instance_uuid",
        "replicaset_uuid",
        "current_replicaset_uuid",
        "current_master_uuid",
    ):
        if getattr(event, name, None) is not None:
            check_uuid(getattr(event, name), name)
    for name in ("tier", "current_state", "address", "state"):
        if getattr(event, name, None) is not None:
            check_text(getattr(event, name), name)
    apply(
        topology,
        model,
        lambda: topology.apply(event),
        lambda: model.apply(event),
        f"apply({show(event)})",
    )


def apply_snapshot(topology: Topology, model: Model, snapshot: Any) -> None:
    # the tiers a burst is applied under: the ADR's documents carry none
    apply(
        topology,
        model,
        lambda: topology.apply_tiers(BUCKET_COUNTS),
        lambda: model.apply_tiers(BUCKET_COUNTS),
        "apply_tiers",
    )
    for event in (*snapshot.replicasets, *snapshot.instances):
        apply_event(topology, model, event)
    for tier, ranges in snapshot.buckets.items():
        check_text(tier, "tier")

        def mirror(tier: str = tier, ranges: Any = ranges) -> None:
            model.apply_snapshot(tier, list(ranges))

        apply(
            topology,
            model,
            lambda tier=tier, ranges=ranges: topology.apply_bucket_snapshot(tier, ranges),
            mirror,
            f"apply_bucket_snapshot({show(tier)})",
        )


def built(fdp: atheris.FuzzedDataProvider, snapshot: bool) -> Any:
    """A document that is mostly right, with hostile values here and there."""

    def pick(good: Any) -> Any:
        return good if fdp.ConsumeIntInRange(0, 6) else json_value(fdp)

    def fields() -> dict[str, Any]:
        kind = fdp.ConsumeIntInRange(0, 3)
        if kind == 0:
            start = fdp.ConsumeIntInRange(1, 120)
            return {
                "map": pick("bucket"),
                "tier": pick(fdp.PickValueInList(TIERS)),
                "bucket_id": pick({"start": pick(start), "end": pick(start + 10)}),
                "current_replicaset_uuid": pick(fdp.PickValueInList(UUIDS)),
            }
        if kind == 1:
            return {
                "map": pick("instance"),
                "instance_uuid": pick(fdp.PickValueInList(UUIDS)),
                "replicaset_uuid": pick(fdp.PickValueInList(UUIDS)),
                "current_state": pick("Online"),
                "address": pick("127.0.0.1:3301"),
            }
        if kind == 2:
            return {"map": pick("plugin"), "name": json_value(fdp)}
        return {
            "map": pick("replicaset"),
            "replicaset_uuid": pick(fdp.PickValueInList(UUIDS)),
            "tier": pick(fdp.PickValueInList(TIERS)),
            "current_master_uuid": pick(fdp.PickValueInList(UUIDS)),
        }

    def document(op: str) -> dict[str, Any]:
        body: dict[str, Any] = {"raft": pick({"term": pick(1), "index": pick(7)})}
        if fdp.ConsumeBool():
            body["timestamp"] = json_value(fdp)
        body["op"] = pick(op)
        body.update(fields())
        return body

    if not snapshot:
        return json.dumps(document(fdp.PickValueInList(["replace", "delete"])))
    return "\n".join(json.dumps(document("replace")) for _ in range(fdp.ConsumeIntInRange(0, 4)))


def test_one_input(data: bytes) -> None:
    if len(data) < 2:
        return
    snapshot, as_bytes, body = bool(data[0] & 1), bool(data[1] & 1), data[2:]
    if data[1] & 2:
        body = nested_text(body)
    if data[0] >= 128:
        try:
            body = built(atheris.FuzzedDataProvider(body), snapshot).encode()
        except (ValueError, RecursionError):
            return
    # invalid UTF-8 in the str form becomes lone surrogates, which a Python str can hold
    parsed = parse(body if as_bytes else body.decode("utf-8", "surrogateescape"), snapshot)
    try:
        text = body.decode()
    except UnicodeDecodeError:
        text = None
    # bytes in UTF-16/32 or with a BOM are another document than their str: not compared
    if text is not None and json.detect_encoding(body) == "utf-8":
        other = parse(text if as_bytes else body, snapshot)
        check(
            other == parsed if isinstance(parsed, tuple) else not isinstance(other, tuple),
            f"str and bytes of one document parse differently: {show(parsed)}, {show(other)}",
        )
    if isinstance(parsed, tuple):
        return
    topology, model = Topology(), Model()
    if snapshot:
        apply_snapshot(topology, model, parsed)
    elif parsed.event is not None:
        apply_event(topology, model, parsed.event)


if __name__ == "__main__":
    main(test_one_input)
