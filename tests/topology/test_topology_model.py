"""The topology against the reference model, over random event histories (Hypothesis)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from shardline import BucketEvent, Instance, Topology, UnknownTier
from support.strategies import OP, RS, TIERS, bucket_events, full_state, snapshots, valid_events
from support.topology_model import Model, model_state

# Not in TIERS: mapped freely before apply_tiers, refused after.
OTHER_TIER = "c"


class TopologyMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.topology = Topology()
        self.model = Model()

    @rule()
    def apply_tiers(self) -> None:
        self.topology.apply_tiers(TIERS)
        self.model.apply_tiers(TIERS)

    @rule(event=valid_events)
    def apply(self, event: Any) -> None:
        self.topology.apply(event)
        self.model.apply(event)

    @rule(event=bucket_events(op=st.just("replace")))
    def apply_bucket(self, event: Any) -> None:
        self.topology.apply_bucket(event)
        self.model.apply_bucket(event)

    @rule(snapshot=snapshots(), as_text=st.booleans())
    def apply_snapshot(self, snapshot: tuple[str, list[Any]], as_text: bool) -> None:
        tier, events = snapshot
        before = self.topology.bucket_maps.get(tier, [])
        poll: Any = events
        if as_text:  # what `SELECT _pico_bucket(tier)` returns over pgwire
            poll = json.dumps(
                [
                    {
                        "bucket_id_start": e.start,
                        "bucket_id_end": e.end,
                        "current_replicaset_uuid": e.current_replicaset_uuid,
                        "state": "active",
                        "tier_name": e.tier,
                    }
                    for e in events
                ]
            )
        changed = self.topology.apply_bucket_snapshot(tier, poll)
        self.model.apply_snapshot(tier, events)
        assert changed == (before != self.model.maps[tier])

    @rule(
        start=st.integers(1, 30),
        length=st.integers(0, 5),
        owner=RS,
        op=OP,
        as_snapshot=st.booleans(),
    )
    def map_a_tier_outside_the_configuration(
        self, start: int, length: int, owner: str, op: str, as_snapshot: bool
    ) -> None:
        event = BucketEvent(OTHER_TIER, start, start + length, owner, op=op)  # type: ignore[arg-type]
        if as_snapshot:
            event = BucketEvent(OTHER_TIER, start, start + length, owner)

        def apply() -> None:
            if as_snapshot:
                self.topology.apply_bucket_snapshot(OTHER_TIER, [event])
            else:
                self.topology.apply(event)

        if not self.model.maps_tier(OTHER_TIER):
            before = full_state(self.topology)
            with pytest.raises(UnknownTier):
                apply()
            assert full_state(self.topology) == before
            return
        apply()
        if as_snapshot:
            self.model.apply_snapshot(OTHER_TIER, [event])
        else:
            self.model.apply(event)

    @invariant()
    def same_state(self) -> None:
        assert full_state(self.topology) == model_state(self.model)

    @invariant()
    def same_lookups(self) -> None:
        for tier in self.model.maps:
            for bucket in range(1, TIERS.get(tier, 40) + 2):
                assert self.topology.owner(tier, bucket) == self.model.owner(tier, bucket)
                expected = self.model.master(tier, bucket)
                found = self.topology.find_bucket_master(tier, bucket)
                assert found == (Instance(*expected) if expected else None)


TestTopologyAgainstModel = TopologyMachine.TestCase
TestTopologyAgainstModel.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)


@given(events=st.lists(valid_events, max_size=60))
def test_replaying_a_history_twice_gives_the_same_state(events: list[Any]) -> None:
    first, second = Topology(), Topology()
    for topology in (first, second):
        topology.apply_tiers(TIERS)
        for event in events:
            topology.apply(event)
    assert full_state(first) == full_state(second)
