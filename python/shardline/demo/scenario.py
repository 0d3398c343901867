"""Scenario files: a versioned JSON description of tiers, a key stream and steps of topology events.

The format is documented in ``docs/demo.md``. A :class:`Scenario` returned by
:func:`parse_scenario` or :func:`load_scenario` is known to replay: its events were applied once to
a scratch :class:`shardline.Topology`, so every error is reported before anything is shown.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from shardline import (
    BucketEvent,
    InstanceEvent,
    ReplicasetEvent,
    ShardlineError,
    Topology,
)

__all__ = [
    "MAX_FILE_BYTES",
    "MAX_KEYS",
    "VERSION",
    "BucketSnapshot",
    "Event",
    "KeyStream",
    "Scenario",
    "ScenarioError",
    "Step",
    "apply_event",
    "load_scenario",
    "parse_scenario",
]

logger = logging.getLogger("shardline.demo")

VERSION = 1
MAX_FILE_BYTES = 16 * 1024 * 1024
MAX_KEYS = 1_000_000
KEY_PLACEHOLDER = "{i}"


class ScenarioError(ShardlineError, ValueError):
    """A malformed scenario; the message names the location (``steps[2].events[0]``) and field."""


@dataclass(frozen=True, slots=True)
class BucketSnapshot:
    """A full poll of one tier's buckets: rows as ``SELECT _pico_bucket(tier)`` returns them."""

    tier: str
    rows: tuple[Mapping[str, Any], ...]


Event = InstanceEvent | ReplicasetEvent | BucketEvent | BucketSnapshot


@dataclass(frozen=True, slots=True)
class Step:
    """Events applied together, after which the key stream is routed once."""

    description: str
    events: tuple[Event, ...]


@dataclass(frozen=True, slots=True)
class KeyStream:
    """``count`` request keys made from ``pattern`` by replacing ``{i}`` with 0, 1, 2, ..."""

    count: int
    pattern: str

    def keys(self) -> list[str]:
        """The keys, in order; the same on every call."""
        return [self.pattern.replace(KEY_PLACEHOLDER, str(i)) for i in range(self.count)]


@dataclass(frozen=True, slots=True)
class Scenario:
    """A validated scenario: tier → bucket count, the key stream, display names and the steps."""

    source: str
    tiers: Mapping[str, int]
    keys: KeyStream
    names: Mapping[str, str]
    steps: tuple[Step, ...]

    def with_key_count(self, count: int) -> Scenario:
        """The same scenario routing ``count`` keys per tier after each step."""
        _check_key_count(count, "--keys")
        return Scenario(
            self.source, self.tiers, KeyStream(count, self.keys.pattern), self.names, self.steps
        )


def apply_event(topology: Topology, event: Event) -> None:
    """Applies one scenario event to ``topology`` through its public API."""
    if isinstance(event, BucketSnapshot):
        topology.apply_bucket_snapshot(event.tier, event.rows)
    else:
        topology.apply(event)


def load_scenario(path: str | Path) -> Scenario:
    """Reads and validates a scenario file of at most :data:`MAX_FILE_BYTES`.

    Raises :class:`ScenarioError` naming the file and the location of the first problem.
    """
    source = str(path)
    try:
        with open(path, "rb") as file:
            # Reading one byte past the limit tells an oversized file (or an endless FIFO) apart
            # without trusting its reported size.
            data = file.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ScenarioError(f"{source}: cannot read: {exc.strerror or exc}") from exc
    if len(data) > MAX_FILE_BYTES:
        raise ScenarioError(f"{source}: file is larger than {MAX_FILE_BYTES} bytes")
    try:
        document = json.loads(
            data.decode("utf-8"),
            object_pairs_hook=_unique_keys,
            parse_constant=_reject_constant,
        )
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"{source}: not UTF-8 text: {exc.reason} at byte {exc.start}") from exc
    except json.JSONDecodeError as exc:
        raise ScenarioError(
            f"{source}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from exc
    except (ValueError, RecursionError) as exc:
        raise ScenarioError(f"{source}: invalid JSON: {exc}") from exc
    return parse_scenario(document, source=source)


def parse_scenario(document: object, *, source: str = "<scenario>") -> Scenario:
    """Validates a decoded scenario document and builds the :class:`Scenario`.

    Raises :class:`ScenarioError` naming ``source``, the location and the field at fault.
    """
    try:
        scenario = _parse(document, source)
        _dry_run(scenario)
    except ScenarioError as exc:
        raise ScenarioError(f"{source}: {exc}") from exc
    logger.debug(
        "scenario %s: %d tiers, %d steps, %d events",
        source,
        len(scenario.tiers),
        len(scenario.steps),
        sum(len(step.events) for step in scenario.steps),
    )
    return scenario


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json keeps the last of duplicate keys silently, which would hide a typo in a long file.
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r} in an object")
        result[key] = value
    return result


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


def _parse(document: object, source: str) -> Scenario:
    root = _object(document, "the top level")
    _fields(
        root, "the top level", required={"version", "tiers", "steps"}, optional={"keys", "names"}
    )
    version = root["version"]
    if not _is_int(version) or version != VERSION:
        raise ScenarioError(f"field 'version' must be {VERSION}, got {version!r}")
    tiers = _tiers(root["tiers"])
    keys = _key_stream(root.get("keys", {}))
    names = _names(root.get("names", {}))
    steps_value = root["steps"]
    if not isinstance(steps_value, list) or not steps_value:
        raise ScenarioError("field 'steps' must be a non-empty list")
    steps = tuple(_step(value, f"steps[{i}]", tiers) for i, value in enumerate(steps_value))
    return Scenario(source, tiers, keys, names, steps)


def _is_int(value: object) -> TypeGuard[int]:
    # bool is an int subclass, but `true` is never a count.
    return isinstance(value, int) and not isinstance(value, bool)


def _object(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ScenarioError(f"{where} must be a JSON object, got {_json_type(value)}")
    return value


def _json_type(value: object) -> str:
    names = {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        float: "a float",
    }
    if value is None:
        return "null"
    if _is_int(value):
        return "an integer"
    return names.get(type(value), type(value).__name__)


def _fields(
    value: Mapping[str, Any], where: str, *, required: set[str], optional: set[str]
) -> None:
    missing = sorted(required - value.keys())
    if missing:
        raise ScenarioError(f"{where}: missing field '{missing[0]}'")
    unknown = sorted(value.keys() - required - optional)
    if unknown:
        allowed = ", ".join(sorted(required | optional))
        raise ScenarioError(f"{where}: unknown field '{unknown[0]}' (allowed: {allowed})")


def _tiers(value: object) -> dict[str, int]:
    tiers = _object(value, "field 'tiers'")
    if not tiers:
        raise ScenarioError("field 'tiers' must name at least one tier")
    for name, count in tiers.items():
        if not name:
            raise ScenarioError("tiers: a tier name must not be empty")
        if not _is_int(count) or count < 1:
            raise ScenarioError(f"tiers.{name}: bucket count must be an int >= 1, got {count!r}")
    return dict(tiers)


def _check_key_count(count: object, where: str) -> None:
    if not _is_int(count) or not 1 <= count <= MAX_KEYS:
        raise ScenarioError(f"{where} must be an integer from 1 to {MAX_KEYS}, got {count!r}")


def _key_stream(value: object) -> KeyStream:
    keys = _object(value, "field 'keys'")
    _fields(keys, "keys", required=set(), optional={"count", "pattern"})
    count = keys.get("count", 2000)
    pattern = keys.get("pattern", "user:{i}")
    _check_key_count(count, "keys.count")
    if not isinstance(pattern, str) or KEY_PLACEHOLDER not in pattern:
        raise ScenarioError(f"keys.pattern must be a string containing '{{i}}', got {pattern!r}")
    return KeyStream(count, pattern)


def _names(value: object) -> dict[str, str]:
    names = _object(value, "field 'names'")
    for uuid, name in names.items():
        if not isinstance(name, str) or not name:
            raise ScenarioError(f"names.{uuid}: must be a non-empty string, got {name!r}")
    return dict(names)


def _step(value: object, where: str, tiers: Mapping[str, int]) -> Step:
    step = _object(value, where)
    _fields(step, where, required={"description", "events"}, optional=set())
    description = step["description"]
    if not isinstance(description, str) or not description:
        raise ScenarioError(f"{where}: field 'description' must be a non-empty string")
    events = step["events"]
    if not isinstance(events, list) or not events:
        raise ScenarioError(f"{where}: field 'events' must be a non-empty list")
    return Step(
        description,
        tuple(_event(event, f"{where}.events[{i}]", tiers) for i, event in enumerate(events)),
    )


_EVENT_FIELDS: dict[str, tuple[set[str], set[str]]] = {
    "instance": (
        {"op", "instance_uuid"},
        {"replicaset_uuid", "current_state", "address"},
    ),
    "replicaset": ({"op", "replicaset_uuid"}, {"tier", "current_master_uuid"}),
    "bucket": ({"tier", "start", "end", "current_replicaset_uuid"}, {"state", "op"}),
    "bucket_snapshot": ({"tier", "rows"}, set()),
}


def _event(value: object, where: str, tiers: Mapping[str, int]) -> Event:
    fields = dict(_object(value, where))
    kind = fields.pop("kind", None)
    if kind not in _EVENT_FIELDS:
        kinds = ", ".join(f"'{k}'" for k in _EVENT_FIELDS)
        raise ScenarioError(f"{where}: field 'kind' must be one of {kinds}, got {kind!r}")
    required, optional = _EVENT_FIELDS[kind]
    _fields(fields, f"{where} ({kind})", required=required, optional=optional)
    tier = fields.get("tier")
    if isinstance(tier, str) and tier not in tiers:
        raise ScenarioError(f"{where} ({kind}): tier {tier!r} is not declared in 'tiers'")
    if kind == "instance":
        return InstanceEvent(**fields)
    if kind == "replicaset":
        return ReplicasetEvent(**fields)
    if kind == "bucket":
        return BucketEvent(**fields)
    return BucketSnapshot(fields["tier"], _rows(fields["rows"], f"{where}.rows"))


def _rows(value: object, where: str) -> tuple[Mapping[str, Any], ...]:
    if not isinstance(value, list):
        raise ScenarioError(f"{where} must be a list, got {_json_type(value)}")
    for i, row in enumerate(value):
        # Parsing each row alone lets the message name the row; the snapshot as a whole
        # (overlaps, tier names) is checked when the dry run applies it.
        checked = _object(row, f"{where}[{i}]")
        try:
            BucketEvent.from_row(checked)
        except ShardlineError as exc:
            raise ScenarioError(f"{where}[{i}]: {exc}") from exc
    return tuple(value)


def _dry_run(scenario: Scenario) -> None:
    topology = Topology()
    try:
        topology.apply_tiers(scenario.tiers)
    except ShardlineError as exc:
        raise ScenarioError(f"tiers: {exc}") from exc
    for i, step in enumerate(scenario.steps):
        for j, event in enumerate(step.events):
            try:
                apply_event(topology, event)
            except ShardlineError as exc:
                raise ScenarioError(f"steps[{i}].events[{j}] ({_kind_of(event)}): {exc}") from exc


def _kind_of(event: Event) -> str:
    if isinstance(event, InstanceEvent):
        return "instance"
    if isinstance(event, ReplicasetEvent):
        return "replicaset"
    if isinstance(event, BucketEvent):
        return "bucket"
    return "bucket_snapshot"
