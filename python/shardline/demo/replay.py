"""The replay driver: applies a scenario's steps to a :class:`shardline.Topology` and routes its key
stream after each step, recording what a user of the map would have seen.

Besides the per-step reports it records every *clearing*: an event after which a tier's map
covers fewer buckets than before. A clearing stays open until the map covers at least as many
buckets as it did before it; meanwhile the requests that found no route in that tier are counted.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from shardline import BucketEvent, Topology
from shardline.demo.scenario import BucketSnapshot, Event, Scenario, Step, apply_event

__all__ = ["Clearing", "MasterRequests", "Replay", "StepReport", "TierState"]


@dataclass(frozen=True, slots=True)
class MasterRequests:
    """How many of a step's requests were routed to one master instance."""

    instance_uuid: str
    address: str | None
    requests: int


@dataclass(frozen=True, slots=True)
class TierState:
    """One tier after a step: its map, its epoch, and where the key stream was routed."""

    tier: str
    bucket_count: int
    epoch: int
    ranges: tuple[tuple[int, int, str], ...]
    routed: tuple[MasterRequests, ...]
    unrouted: int

    @property
    def mapped(self) -> int:
        """How many of the tier's buckets a range covers."""
        return _mapped(self.ranges)


@dataclass(frozen=True, slots=True)
class StepReport:
    """The state of every tier after step ``number`` (1-based) of the scenario."""

    number: int
    step: Step
    tiers: tuple[TierState, ...]


@dataclass(slots=True)
class Clearing:
    """A drop in a tier's mapped buckets, and its re-fill.

    ``bucket_events`` counts the bucket events and snapshots of the tier applied from the
    clearing event up to the one that refilled the map; ``apply_ns`` is the wall time spent
    applying all events in that window (the demo's own routing between steps is excluded).
    """

    tier: str
    step: int
    description: str
    mapped_before: int
    unrouted: int = 0
    bucket_events: int = 0
    apply_ns: int = 0
    refilled_at: int | None = None


class Replay:
    """Replays ``scenario`` on a fresh topology; iterate :meth:`steps` to drive it."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.clearings: list[Clearing] = []
        self._topology = Topology()
        self._topology.apply_tiers(scenario.tiers)
        self._keys = scenario.keys.keys()
        self._mapped = dict.fromkeys(scenario.tiers, 0)
        self._open: dict[str, Clearing] = {}

    def steps(self) -> Iterator[StepReport]:
        """Applies each step's events, routes the key stream, and yields the step's report.

        :attr:`clearings` is complete once the iterator is exhausted.
        """
        for number, step in enumerate(self.scenario.steps, 1):
            for event in step.events:
                self._apply(number, step, event)
            yield self._route(number, step)

    def _apply(self, number: int, step: Step, event: Event) -> None:
        started = time.perf_counter_ns()
        apply_event(self._topology, event)
        elapsed = time.perf_counter_ns() - started
        # Any tier may have changed: a replicaset delete clears a tier the event does not name.
        for tier in self.scenario.tiers:
            mapped = _mapped(self._topology.ranges(tier))
            is_bucket_event = _bucket_tier(event) == tier
            clearing = self._open.get(tier)
            if clearing is not None:
                clearing.apply_ns += elapsed
                clearing.bucket_events += int(is_bucket_event)
                if mapped >= clearing.mapped_before:
                    clearing.refilled_at = number
                    del self._open[tier]
            elif mapped < self._mapped[tier]:
                clearing = Clearing(
                    tier,
                    number,
                    step.description,
                    mapped_before=self._mapped[tier],
                    bucket_events=int(is_bucket_event),
                    apply_ns=elapsed,
                )
                self.clearings.append(clearing)
                self._open[tier] = clearing
            self._mapped[tier] = mapped

    def _route(self, number: int, step: Step) -> StepReport:
        states = []
        for tier, bucket_count in self.scenario.tiers.items():
            masters = self._topology.route_many(tier, self._keys)
            counts = Counter(m.uuid for m in masters if m is not None)
            addresses = {m.uuid: m.address for m in masters if m is not None}
            unrouted = len(masters) - counts.total()
            if tier in self._open:
                self._open[tier].unrouted += unrouted
            states.append(
                TierState(
                    tier,
                    bucket_count,
                    self._topology.epoch(tier),
                    tuple(self._topology.ranges(tier)),
                    tuple(MasterRequests(u, addresses[u], n) for u, n in counts.items()),
                    unrouted,
                )
            )
        return StepReport(number, step, tuple(states))


def _mapped(ranges: tuple[tuple[int, int, str], ...] | list[tuple[int, int, str]]) -> int:
    return sum(end - start + 1 for start, end, _ in ranges)


def _bucket_tier(event: Event) -> str | None:
    if isinstance(event, BucketEvent | BucketSnapshot):
        return event.tier
    return None
