"""What `db.explain(key)` and a client's member tables read from the topology.

`Topology.bucket_range` (a range with the epoch, time and kind of the apply that last set it),
`Topology.membership_version` and `Topology.replicaset_instances`, against a reference model
over random histories (Hypothesis), plus the cases spelled out.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from shardline import (
    BucketEvent,
    BucketRange,
    Instance,
    InstanceEvent,
    InvalidArgument,
    ReplicasetEvent,
    Topology,
    UnknownTier,
)
from shardline.topology.sources import BucketPayload
from support.reentry import REENTRIES, child_code, run_child
from support.replicasets import inst_uuid, rs_uuid
from support.strategies import RS, TIERS, snapshots, valid_events
from support.topology_model import Model

# time.time() and the Rust clock read the same clock, but may round the last bit differently.
CLOCK_SLACK = 1e-6

Key = tuple[int, int, str]


@dataclass(frozen=True)
class Stamp:
    epoch: int
    set_by: str
    # The wall-clock window of the apply that set the range.
    not_before: float
    not_after: float


def rows(tier: str, ranges: list[Key]) -> list[dict[str, Any]]:
    """`_pico_bucket(tier)` rows, as in tests/support/picodata_catalog.py."""
    return [
        {
            "bucket_id_start": start,
            "bucket_id_end": end,
            "current_replicaset_uuid": owner,
            "state": "active",
            "tier_name": tier,
        }
        for start, end, owner in ranges
    ]


def as_poll(tier: str, ranges: list[Key], form: str) -> Any:
    """A full snapshot of `tier` in one of the forms `apply_bucket_snapshot` takes."""
    if form == "events":
        return [BucketEvent(tier, start, end, owner) for start, end, owner in ranges]
    if form == "rows":
        return rows(tier, ranges)
    text = json.dumps(rows(tier, ranges))
    return text if form == "text" else BucketPayload(tier, text)


SET_BY = {"events": "snapshot", "rows": "snapshot", "text": "poll", "payload": "poll"}
FORMS = st.sampled_from(sorted(SET_BY))


def membership(model: Model) -> tuple[Any, ...]:
    return (dict(model.instances), dict(model.replicasets))


class ExplainMachine(RuleBasedStateMachine):
    """The reference for stamps: a range present in the map both before and after an apply
    keeps its stamp; a range present only after is stamped with the apply's epoch, kind and
    time. The reference for the membership version: it moves exactly when the model's
    instances or replicasets differ after an apply."""

    def __init__(self) -> None:
        super().__init__()
        self.topology = Topology()
        self.topology.apply_tiers(TIERS)
        self.model = Model()
        self.model.apply_tiers(TIERS)
        self.stamps: dict[str, dict[Key, Stamp]] = {tier: {} for tier in TIERS}
        self.version = self.topology.membership_version

    def applied(self, apply: Any, model_apply: Any, set_by: str) -> None:
        """Runs `apply` on the topology and `model_apply` on the model, then moves the
        reference stamps and membership version on."""
        members_before = membership(self.model)
        not_before = time.time()
        apply()
        not_after = time.time()
        model_apply()
        for tier, ranges in self.model.maps.items():
            old = self.stamps[tier]
            epoch = self.model.epochs[tier]
            self.stamps[tier] = {
                key: old.get(key) or Stamp(epoch, set_by, not_before, not_after) for key in ranges
            }
        version = self.topology.membership_version
        assert (version != self.version) == (membership(self.model) != members_before)
        assert version >= self.version
        self.version = version

    @rule(event=valid_events)
    def apply(self, event: Any) -> None:
        self.applied(lambda: self.topology.apply(event), lambda: self.model.apply(event), "event")

    @rule(snapshot=snapshots(), form=FORMS)
    def apply_snapshot(self, snapshot: tuple[str, list[BucketEvent]], form: str) -> None:
        tier, events = snapshot
        ranges = [(e.start, e.end, e.current_replicaset_uuid) for e in events]
        self.applied(
            lambda: self.topology.apply_bucket_snapshot(tier, as_poll(tier, ranges, form)),
            lambda: self.model.apply_snapshot(tier, events),
            SET_BY[form],
        )

    @precondition(lambda self: any(self.model.maps.values()))
    @rule(data=st.data(), form=FORMS, change_one=st.booleans())
    def repeat_the_map(self, data: st.DataObject, form: str, change_one: bool) -> None:
        """The current map again as a snapshot (shuffled), or with one range's owner changed:
        the case a poll of a quiet cluster and a single move produce."""
        tier = data.draw(st.sampled_from(sorted(t for t, m in self.model.maps.items() if m)))
        ranges = list(self.model.maps[tier])
        if change_one:
            at = data.draw(st.integers(0, len(ranges) - 1))
            start, end, _ = ranges[at]
            ranges[at] = (start, end, data.draw(RS))
        ranges = data.draw(st.permutations(ranges))
        events = [BucketEvent(tier, start, end, owner) for start, end, owner in ranges]
        self.applied(
            lambda: self.topology.apply_bucket_snapshot(tier, as_poll(tier, ranges, form)),
            lambda: self.model.apply_snapshot(tier, events),
            SET_BY[form],
        )

    @rule()
    def clear(self) -> None:
        def model_clear() -> None:
            self.model.instances.clear()
            self.model.replicasets.clear()
            for tier in self.model.maps:
                self.model.clear(tier)

        self.applied(self.topology.clear, model_clear, "clear sets no range")

    @invariant()
    def same_ranges_and_stamps(self) -> None:
        for tier, count in TIERS.items():
            expected: dict[int, tuple[Key, Stamp]] = {}
            for key, stamp in self.stamps[tier].items():
                for bucket in range(key[0], key[1] + 1):
                    expected[bucket] = (key, stamp)
            for bucket in range(1, count + 2):
                found = self.topology.bucket_range(tier, bucket)
                if bucket not in expected:
                    assert found is None
                    continue
                (start, end, owner), stamp = expected[bucket]
                assert found is not None
                assert (found.start, found.end, found.replicaset_uuid) == (start, end, owner)
                assert (found.epoch, found.set_by) == (stamp.epoch, stamp.set_by)
                assert stamp.not_before - CLOCK_SLACK <= found.set_at
                assert found.set_at <= stamp.not_after + CLOCK_SLACK

    @invariant()
    def same_members(self) -> None:
        for n in range(5):  # the replicasets strategies.RS draws from
            rs = rs_uuid(n)
            expected = sorted(
                (key, *rest)
                for key, (_, owner, *rest) in self.model.instances.items()
                if owner == rs
            )
            found = self.topology.replicaset_instances(rs)
            assert found == [Instance(key, rs, *rest) for key, *rest in expected]


TestExplainAgainstModel = ExplainMachine.TestCase
TestExplainAgainstModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def topology_with_map() -> Topology:
    topology = Topology()
    topology.apply_tiers({"a": 100})
    topology.apply(ReplicasetEvent("replace", rs_uuid(0), tier="a"))
    topology.apply(ReplicasetEvent("replace", rs_uuid(1), tier="a"))
    topology.apply_bucket_snapshot("a", rows("a", [(1, 50, rs_uuid(0)), (51, 100, rs_uuid(1))]))
    return topology


def test_a_range_says_where_it_came_from() -> None:
    topology = topology_with_map()
    before = time.time()
    topology.apply(BucketEvent("a", 1, 50, rs_uuid(0), op="delete"))
    topology.apply(BucketEvent("a", 1, 50, rs_uuid(1)))
    after = time.time()
    found = topology.bucket_range("a", 7)
    assert found is not None
    assert (found.start, found.end, found.replicaset_uuid) == (1, 50, rs_uuid(1))
    assert (found.epoch, found.set_by) == (topology.epoch("a"), "event")
    assert before - CLOCK_SLACK <= found.set_at <= after + CLOCK_SLACK
    assert isinstance(found, BucketRange)
    assert found == topology.bucket_range("a", 50)
    assert repr(found).startswith("BucketRange(start=1, end=50, replicaset_uuid='")
    other = topology.bucket_range("a", 51)
    assert other is not None
    assert (other.epoch, other.set_by) == (1, "snapshot")


def test_an_identical_snapshot_or_unchanged_poll_text_keeps_every_stamp() -> None:
    topology = topology_with_map()
    stamped = [topology.bucket_range("a", bucket) for bucket in (1, 100)]
    ranges = [(51, 100, rs_uuid(1)), (1, 50, rs_uuid(0))]
    for form in sorted(SET_BY):
        assert not topology.apply_bucket_snapshot("a", as_poll("a", ranges, form))
    text = json.dumps(rows("a", ranges))
    assert not topology.apply_bucket_snapshot("a", text)
    assert not topology.apply_bucket_snapshot("a", text)  # the unread fast path
    assert [topology.bucket_range("a", bucket) for bucket in (1, 100)] == stamped


def test_a_changed_owner_is_stamped_anew_and_its_neighbour_is_not() -> None:
    topology = topology_with_map()
    kept = topology.bucket_range("a", 1)
    assert topology.apply_bucket_snapshot(
        "a", json.dumps(rows("a", [(1, 50, rs_uuid(0)), (51, 100, rs_uuid(0))]))
    )
    moved = topology.bucket_range("a", 51)
    assert moved is not None
    assert (moved.replicaset_uuid, moved.epoch, moved.set_by) == (rs_uuid(0), 2, "poll")
    assert topology.bucket_range("a", 1) == kept


def test_bucket_range_refuses_what_owner_refuses() -> None:
    topology = topology_with_map()
    assert topology.bucket_range("a", 0) is None
    with pytest.raises(UnknownTier, match="'zz'"):
        topology.bucket_range("zz", 1)
    with pytest.raises(InvalidArgument):
        topology.bucket_range("a", -1)
    with pytest.raises(InvalidArgument):
        topology.bucket_range("a", True)


def test_membership_version_moves_on_membership_only() -> None:
    topology = Topology()
    versions = [topology.membership_version]

    def moved(event: Any) -> bool:
        topology.apply(event)
        versions.append(topology.membership_version)
        return versions[-1] != versions[-2]

    rs, inst = rs_uuid(0), inst_uuid(0)
    assert moved(ReplicasetEvent("replace", rs, tier="a"))
    assert not moved(ReplicasetEvent("replace", rs, tier="a"))
    assert moved(ReplicasetEvent("replace", rs, current_master_uuid=inst))
    assert moved(InstanceEvent("replace", inst, replicaset_uuid=rs, current_state="Offline"))
    assert not moved(InstanceEvent("replace", inst, current_state="Offline"))
    assert moved(InstanceEvent("replace", inst, current_state="Online"))
    assert moved(InstanceEvent("replace", inst, name="i1"))
    assert not moved(InstanceEvent("replace", inst, name="i1"))
    assert moved(ReplicasetEvent("replace", rs, name="r1"))
    assert not moved(ReplicasetEvent("replace", rs, tier="a", name="r1"))
    assert not moved(BucketEvent("a", 1, 10, rs))
    assert not moved(BucketEvent("a", 5, 20, rs))
    assert topology.apply_bucket_snapshot("a", [BucketEvent("a", 1, 3, rs)])
    assert topology.membership_version == versions[-1]
    assert not moved(InstanceEvent("delete", inst_uuid(5)))
    assert moved(InstanceEvent("delete", inst))
    assert moved(ReplicasetEvent("delete", rs))
    assert topology.apply_bucket_snapshot("a", [BucketEvent("a", 1, 3, rs)])
    assert topology.clear()  # only a bucket map to forget
    assert topology.membership_version == versions[-1]
    assert moved(ReplicasetEvent("replace", rs, tier="a"))
    assert topology.clear()
    assert topology.membership_version != versions[-1]
    assert versions == sorted(versions)


def test_replicaset_instances_copies_the_members_in_every_state() -> None:
    topology = Topology()
    rs, other = rs_uuid(0), rs_uuid(1)
    states = ["Online", "Offline", "Expelled"]
    members = [inst_uuid(n) for n in range(3)]
    for member, state in zip(reversed(members), states, strict=True):
        topology.apply(InstanceEvent("replace", member, replicaset_uuid=rs, current_state=state))
    topology.apply(InstanceEvent("replace", inst_uuid(4), replicaset_uuid=other))
    found = topology.replicaset_instances(rs.upper())
    assert [instance.uuid for instance in found] == members
    assert [instance.current_state for instance in found] == list(reversed(states))
    assert topology.replicaset_instances(rs.replace("-", "")) == found
    topology.apply(InstanceEvent("replace", members[0], replicaset_uuid=other))
    assert [i.uuid for i in topology.replicaset_instances(rs)] == members[1:]
    assert [i.uuid for i in topology.replicaset_instances(other)] == [members[0], inst_uuid(4)]
    topology.apply(InstanceEvent("delete", members[1]))
    assert [i.uuid for i in topology.replicaset_instances(rs)] == members[2:]
    assert topology.replicaset_instances(rs_uuid(3)) == []
    topology.clear()
    assert topology.replicaset_instances(rs) == []


@pytest.mark.parametrize("bad", ["", "not-a-uuid", "\ud800", rs_uuid(0)[:-1]])
def test_replicaset_instances_names_a_bad_uuid(bad: str) -> None:
    with pytest.raises(InvalidArgument, match="replicaset_uuid must be a UUID, got "):
        Topology().replicaset_instances(bad)


def test_members_are_indexed_in_any_event_order() -> None:
    """The index against a scan of `instances`, over shuffled histories of one universe."""
    shuffler = random.Random(11)
    events = [
        InstanceEvent(op, inst, replicaset_uuid=rs)  # type: ignore[arg-type]
        for op in ("replace", "delete")
        for inst in (inst_uuid(n) for n in range(4))
        for rs in (None, rs_uuid(0), rs_uuid(1))
    ]
    for _ in range(200):
        topology = Topology()
        for event in shuffler.sample(events, k=12):
            topology.apply(event)
            for rs in (rs_uuid(0), rs_uuid(1)):
                scanned = sorted(
                    (i for i in topology.instances.values() if i.replicaset_uuid == rs),
                    key=lambda instance: instance.uuid,
                )
                assert topology.replicaset_instances(rs) == scanned


# Readers run the reentry suite's finalizer cases (tests/topology/test_topology_reentry.py).
READER_CASES: dict[str, tuple[str, str]] = {
    "bucket_range": ("", "t.bucket_range('a', 5)"),
    "membership_version": ("", "t.membership_version"),
    "replicaset_instances": ("", "t.replicaset_instances(RS)"),
    "replicaset_instances_bad_uuid": (
        "bad = ''.join(['n', 'o'])",
        "try:\n    t.replicaset_instances(bad)\nexcept ShardlineError:\n    pass",
    ),
}


@pytest.mark.parametrize(("reentry", "where"), REENTRIES)
@pytest.mark.parametrize("case", sorted(READER_CASES))
@pytest.mark.integration  # a child interpreter
def test_a_gc_pass_inside_a_reader_may_re_enter(case: str, reentry: str, where: str) -> None:
    setup, call = READER_CASES[case]
    run_child(child_code(setup, call, reentry, where, gc_pass=True))
