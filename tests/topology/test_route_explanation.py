"""`Topology.explain(tier, key)`: why `route` answers what it answers.

Each reason spelled out, each kind of map clear naming its cause, the errors `route` raises,
the one-line `str` and the `repr`, and, over random histories (Hypothesis), agreement with
`route` and with a reference for the reasons and the last clear of each tier.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from shardline import (
    BucketEvent,
    BucketRange,
    InstanceEvent,
    ReplicasetEvent,
    RouteExplanation,
    TierWithoutBuckets,
    Topology,
    UnhashableKey,
    UnknownTier,
)
from support.reentry import REENTRIES, child_code, run_child
from support.replicasets import inst_uuid, rs_uuid
from support.strategies import TIERS, snapshots, valid_events
from support.topology_model import Model, canonical

# time.time() and the Rust clock read the same clock, but may round the last bit differently.
CLOCK_SLACK = 1e-6
UTC = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
RS0, RS1, RS2 = rs_uuid(0), rs_uuid(1), rs_uuid(2)
I0 = inst_uuid(0)
KEY = 7


def topology() -> Topology:
    """Tier "a" (100 buckets) mapped by a snapshot: [1, 50] → R0, [51, 100] → R1; R0's master
    I0 is online at 127.0.0.1:3301; R1 has no master. Tier "arbiter" has no buckets."""
    t = Topology()
    t.apply_tiers({"a": 100, "b": 100, "arbiter": 0})
    t.apply(ReplicasetEvent("replace", RS0, tier="a", current_master_uuid=I0, name="r0"))
    t.apply(ReplicasetEvent("replace", RS1, tier="a"))
    t.apply(
        InstanceEvent(
            "replace",
            I0,
            replicaset_uuid=RS0,
            current_state="Online",
            address="127.0.0.1:3301",
            name="i0",
        )
    )
    t.apply_bucket_snapshot("a", [BucketEvent("a", 1, 50, RS0), BucketEvent("a", 51, 100, RS1)])
    return t


def key_in(t: Topology, tier: str, low: int, high: int) -> int:
    """An int key whose bucket in `tier` is in [low, high]."""
    return next(k for k in range(10_000) if low <= t.bucket_id(tier, k) <= high)


def test_a_routed_key_names_the_whole_chain() -> None:
    t = topology()
    key = key_in(t, "a", 1, 50)
    e = t.explain("a", key)
    assert isinstance(e, RouteExplanation)
    assert e.routed is not None
    assert e.routed == t.route("a", key)
    assert (e.tier, e.key_repr, e.bucket) == ("a", repr(key), t.bucket_id("a", key))
    assert e.range == t.bucket_range("a", e.bucket)
    assert isinstance(e.range, BucketRange)
    assert (e.range.start, e.range.end, e.range.set_by) == (1, 50, "snapshot")
    assert (e.replicaset_uuid, e.master_uuid) == (RS0, I0)
    assert e.replicaset == t.replicasets[RS0]
    assert e.master == t.instances[I0] == e.routed
    assert (e.master_address, e.master_state) == ("127.0.0.1:3301", "Online")
    assert (e.epoch, e.reason) == (t.epoch("a"), None)
    assert (e.cleared_by, e.cleared_at, e.cleared_epoch) == (None, None, None)
    assert re.fullmatch(
        rf"bucket {e.bucket} is in \[1, 50\] \(set by snapshot at {UTC}, epoch 1\) of replicaset "
        rf"'r0' \({RS0}\), whose master 'i0' \({I0}\) is at '127.0.0.1:3301'",
        e.detail,
    ), e.detail


def test_a_master_not_online_is_still_routed_and_said() -> None:
    """`route` returns the master whatever its state, so `explain` does, and says so."""
    t = topology()
    t.apply(InstanceEvent("replace", I0, current_state="Offline"))
    key = key_in(t, "a", 1, 50)
    e = t.explain("a", key)
    assert e.routed is not None
    assert e.routed == t.route("a", key)
    assert (e.reason, e.master_state) == (None, "Offline")
    assert e.detail.endswith(", in state 'Offline' (not Online: route still returns it)")


def test_a_replicaset_without_master_is_master_unknown() -> None:
    t = topology()
    e = t.explain("a", key_in(t, "a", 51, 100))
    assert (e.routed, e.reason, e.replicaset_uuid, e.master_uuid, e.master) == (
        None,
        "master-unknown",
        RS1,
        None,
        None,
    )
    assert e.detail.endswith(f"of replicaset {RS1}, which has no current master")


def test_a_master_that_is_no_known_instance_is_master_unknown() -> None:
    t = topology()
    t.apply(InstanceEvent("delete", I0))
    e = t.explain("a", key_in(t, "a", 1, 50))
    assert (e.routed, e.reason, e.master_uuid, e.master) == (None, "master-unknown", I0, None)
    assert (e.master_address, e.master_state) == (None, None)
    assert e.detail.endswith(f"whose master {I0} is not a known instance")


def test_an_owner_that_is_no_known_replicaset_is_replicaset_unknown() -> None:
    t = topology()
    t.apply_bucket_snapshot("a", [BucketEvent("a", 1, 100, RS2)])
    e = t.explain("a", KEY)
    assert (e.routed, e.reason, e.replicaset_uuid, e.replicaset) == (
        None,
        "replicaset-unknown",
        RS2,
        None,
    )
    assert e.detail.endswith(f"of replicaset {RS2}, which is not a known replicaset")


def test_a_bucket_never_mapped_is_no_range() -> None:
    t = topology()
    t.apply_bucket_snapshot("a", [BucketEvent("a", 1, 50, RS0)])
    e = t.explain("a", key_in(t, "a", 51, 100))
    assert (e.routed, e.reason, e.range, e.replicaset_uuid) == (None, "no-range", None, None)
    assert e.detail == (
        f"no range of tier 'a' covers bucket {e.bucket} (1 range at epoch 2; never cleared)"
    )


def test_a_cleared_map_says_by_what_and_when() -> None:
    t = topology()
    before = time.time()
    t.apply(ReplicasetEvent("replace", RS2, tier="a"))
    after = time.time()
    e = t.explain("a", KEY)
    assert (e.routed, e.reason, e.range) == (None, "map-cleared", None)
    assert e.cleared_by == f"replicaset {RS2} joined tier 'a'"
    assert e.cleared_at is not None
    assert before - CLOCK_SLACK <= e.cleared_at <= after + CLOCK_SLACK
    assert e.cleared_epoch == e.epoch == t.epoch("a") == 2
    assert re.fullmatch(
        rf"no range of tier 'a' covers bucket {e.bucket}: the map was cleared at {UTC} \(epoch 2\) "
        rf"because replicaset {RS2} joined tier 'a', and no range holding it has come since "
        r"\(0 ranges now\)",
        e.detail,
    ), e.detail
    # ranges elsewhere arrive: this bucket is still uncovered since the clear
    other = 1 if e.bucket > 1 else 2
    t.apply(BucketEvent("a", other, other, RS0))
    assert t.explain("a", KEY).reason == "map-cleared"


def test_a_hole_left_after_a_clear_by_a_delete_or_a_snapshot_is_no_range() -> None:
    t = topology()
    t.apply(ReplicasetEvent("replace", RS2, tier="a"))
    bucket = t.bucket_id("a", KEY)
    t.apply(BucketEvent("a", bucket, bucket, RS0))
    assert t.explain("a", KEY).reason is None
    t.apply(BucketEvent("a", bucket, bucket, RS0, op="delete"))
    e = t.explain("a", KEY)
    assert e.reason == "no-range"
    assert e.cleared_by == f"replicaset {RS2} joined tier 'a'"
    assert "and the map was refilled since" in e.detail
    t.apply(ReplicasetEvent("replace", rs_uuid(3), tier="a"))
    assert t.explain("a", KEY).reason == "no-range", "an empty map is not cleared again"
    t.apply(BucketEvent("a", 1, 1, RS0))
    t.apply(BucketEvent("a", 1, 2, RS0))  # an overlap: cleared again
    assert t.explain("a", key_in(t, "a", 3, 100)).reason == "map-cleared"
    t.apply_bucket_snapshot("a", [BucketEvent("a", 1, 1, RS0)])
    assert t.explain("a", key_in(t, "a", 3, 100)).reason == "no-range"


@dataclass(frozen=True)
class ClearCase:
    apply: Any
    cleared: dict[str, str]  # tier → cleared_by


CLEARS = {
    "replicaset-deleted": ClearCase(
        lambda t: t.apply(ReplicasetEvent("delete", RS1)),
        {"a": f"replicaset {RS1} deleted"},
    ),
    "replicaset-joined": ClearCase(
        lambda t: t.apply(ReplicasetEvent("replace", RS2, tier="a")),
        {"a": f"replicaset {RS2} joined tier 'a'"},
    ),
    "replicaset-moved": ClearCase(
        lambda t: t.apply(ReplicasetEvent("replace", RS1, tier="b")),
        {
            "a": f"replicaset {RS1} moved from tier 'a' to tier 'b'",
            "b": f"replicaset {RS1} moved from tier 'a' to tier 'b'",
        },
    ),
    "bucket-replace-overlap": ClearCase(
        lambda t: t.apply(BucketEvent("a", 40, 60, RS0)),
        {"a": "bucket replace event [40, 60] overlapped [1, 50]"},
    ),
    "bucket-replace-other-owner": ClearCase(
        lambda t: t.apply(BucketEvent("a", 51, 100, RS0)),
        {"a": "bucket replace event [51, 100] overlapped [51, 100]"},
    ),
    "bucket-delete-overlap": ClearCase(
        lambda t: t.apply(BucketEvent("a", 45, 55, RS0, op="delete")),
        {"a": "bucket delete event [45, 55] overlapped [1, 50]"},
    ),
    "topology-clear": ClearCase(
        lambda t: t.clear(),
        {"a": "Topology.clear()", "b": "Topology.clear()"},
    ),
}


@pytest.mark.parametrize("case", sorted(CLEARS))
def test_each_kind_of_clear_records_its_cause(case: str) -> None:
    t = topology()
    t.apply_bucket_snapshot("b", [BucketEvent("b", 1, 100, RS0)])
    untouched = t.explain("b", KEY)
    before = time.time()
    CLEARS[case].apply(t)
    after = time.time()
    for tier in ("a", "b"):
        e = t.explain(tier, KEY)
        if tier not in CLEARS[case].cleared:
            assert (e.cleared_by, e.epoch) == (None, untouched.epoch)
            continue
        assert e.cleared_by == CLEARS[case].cleared[tier]
        assert e.cleared_at is not None
        assert before - CLOCK_SLACK <= e.cleared_at <= after + CLOCK_SLACK
        assert e.cleared_epoch == t.epoch(tier)
        if e.range is None:
            assert e.reason == "map-cleared"
            assert e.cleared_by in e.detail


def test_explain_raises_what_route_raises() -> None:
    t = topology()
    for call in (t.route, t.explain):
        with pytest.raises(UnknownTier, match="'zz'"):
            call("zz", KEY)
        with pytest.raises(UnknownTier, match="not valid text"):
            call("\ud800", KEY)
        with pytest.raises(TierWithoutBuckets, match="'arbiter'"):
            call("arbiter", KEY)
        with pytest.raises(UnhashableKey):
            call("a", object())
    with pytest.raises(UnknownTier):
        Topology().explain("a", KEY)


def test_str_is_one_line_for_a_ticket_and_repr_names_the_fields() -> None:
    t = topology()
    routed = t.explain("a", key_in(t, "a", 1, 50))
    line = str(routed)
    assert "\n" not in line
    assert line.startswith(f"tier 'a', key {routed.key_repr}: routed: bucket {routed.bucket} is in")
    assert line.endswith(f" [tier epoch {routed.epoch}]")
    t.apply(ReplicasetEvent("delete", RS1))
    missed = t.explain("a", ("user", 42))
    assert str(missed).startswith(
        "tier 'a', key ('user', 42): no route (map-cleared): no range of tier 'a' covers bucket "
    )
    assert re.fullmatch(
        r"RouteExplanation\(tier='a', key=\('user', 42\), bucket=\d+, range=None, "
        r"replicaset_uuid=None, master_uuid=None, master_state=None, epoch=2, "
        r"reason='map-cleared', detail='no range .*'\)",
        repr(missed),
    ), repr(missed)
    assert re.search(
        r"range=\[1, 50\], replicaset_uuid=\"[-0-9a-f]+\", master_uuid=\"[-0-9a-f]+\", "
        r"master_state=\"Online\", epoch=1, reason=None",
        repr(routed),
    ), repr(routed)


def test_a_long_key_is_cut_in_the_explanation() -> None:
    e = topology().explain("a", "k" * 1000)
    assert len(e.key_repr) == 80
    assert e.key_repr.endswith("...")


class Reference(Model):
    """The model, plus the last clear of each tier that removed ranges: (cause, epoch,
    filling), where `filling` holds while every change since only added ranges."""

    def __init__(self) -> None:
        super().__init__()
        self.clears: dict[str, tuple[str, int, bool]] = {}

    def apply_tracked(self, event: Any) -> None:
        before = {tier: list(ranges) for tier, ranges in self.maps.items()}
        self.apply(event)
        for tier, old in before.items():
            new = self.maps[tier]
            if old == new:
                continue
            cause = self.clear_cause(event, old)
            if cause is not None:
                self.clears[tier] = (cause, self.epochs[tier], True)
            elif not set(old) <= set(new):
                self.holed(tier)

    @staticmethod
    def clear_cause(event: Any, old: list[tuple[int, int, str]]) -> str | None:
        """What cleared the map on a bucket `event`, or None if it did not clear it (replicaset
        events that clear go through `apply_replicaset_tracked`)."""
        if not isinstance(event, BucketEvent):
            return None
        hits = [r for r in old if r[0] <= event.end and event.start <= r[1]]
        owner = canonical(event.current_replicaset_uuid)
        if not hits or hits == [(event.start, event.end, owner)]:
            return None
        return (
            f"bucket {event.op} event [{event.start}, {event.end}] overlapped "
            f"[{hits[0][0]}, {hits[0][1]}]"
        )

    def apply_replicaset_tracked(self, event: ReplicasetEvent) -> None:
        rs = canonical(event.replicaset_uuid)
        known = self.replicasets.get(rs)
        before = {tier: list(ranges) for tier, ranges in self.maps.items()}
        self.apply(event)
        if event.op == "delete" or known is None:
            cause = (
                f"replicaset {rs} deleted"
                if event.op == "delete"
                else f"replicaset {rs} joined tier '{event.tier}'"
            )
        else:
            cause = f"replicaset {rs} moved from tier '{known[1]}' to tier '{event.tier}'"
        for tier, old in before.items():
            if old and not self.maps[tier]:
                self.clears[tier] = (cause, self.epochs[tier], True)

    def apply_snapshot_tracked(self, tier: str, events: list[BucketEvent]) -> None:
        old = list(self.maps[tier])
        self.apply_snapshot(tier, events)
        if self.maps[tier] != old:
            self.holed(tier)

    def clear_all(self) -> None:
        self.instances.clear()
        self.replicasets.clear()
        for tier, ranges in self.maps.items():
            if ranges:
                self.clear(tier)
                self.clears[tier] = ("Topology.clear()", self.epochs[tier], True)

    def holed(self, tier: str) -> None:
        if tier in self.clears:
            cause, epoch, _ = self.clears[tier]
            self.clears[tier] = (cause, epoch, False)

    def reason(self, tier: str, bucket: int) -> str | None:
        owner = self.owner(tier, bucket)
        if owner is None:
            clear = self.clears.get(tier)
            return "map-cleared" if clear is not None and clear[2] else "no-range"
        rs = self.replicasets.get(owner)
        if rs is None:
            return "replicaset-unknown"
        if rs[2] is None or rs[2] not in self.instances:
            return "master-unknown"
        return None


KEYS = [*range(40), "a", "ü", ("user", 1), 1.5, None, True]


class AgreementMachine(RuleBasedStateMachine):
    """`explain` against `route` and against the reference, over random histories."""

    def __init__(self) -> None:
        super().__init__()
        self.topology = Topology()
        self.topology.apply_tiers(TIERS)
        self.model = Reference()
        self.model.apply_tiers(TIERS)

    @rule(event=valid_events)
    def apply(self, event: Any) -> None:
        self.topology.apply(event)
        if isinstance(event, ReplicasetEvent) and (
            event.op == "delete"
            or canonical(event.replicaset_uuid) not in self.model.replicasets
            or self.model.replicasets[canonical(event.replicaset_uuid)][1] != event.tier
        ):
            self.model.apply_replicaset_tracked(event)
        else:
            self.model.apply_tracked(event)

    @rule(snapshot=snapshots())
    def apply_snapshot(self, snapshot: tuple[str, list[BucketEvent]]) -> None:
        tier, events = snapshot
        self.topology.apply_bucket_snapshot(tier, events)
        self.model.apply_snapshot_tracked(tier, events)

    @rule()
    def clear(self) -> None:
        self.topology.clear()
        self.model.clear_all()

    @invariant()
    def explain_agrees_with_route_and_the_reference(self) -> None:
        for tier in TIERS:
            clear = self.model.clears.get(tier)
            for key in KEYS:
                e = self.topology.explain(tier, key)
                routed = self.topology.route(tier, key)
                assert e.routed is routed
                assert (e.reason is None) == (routed is not None)
                assert e.reason == self.model.reason(tier, e.bucket), (key, e)
                assert e.epoch == self.model.epochs[tier]
                owner = self.model.owner(tier, e.bucket)
                assert e.replicaset_uuid == owner
                assert (e.range is None) == (owner is None)
                if routed is not None:
                    assert e.master is routed
                    assert (e.master_address, e.master_state) == (
                        routed.address,
                        routed.current_state,
                    )
                if clear is None:
                    assert (e.cleared_by, e.cleared_epoch) == (None, None)
                else:
                    assert (e.cleared_by, e.cleared_epoch) == clear[:2]


TestExplainAgreesWithRoute = AgreementMachine.TestCase
TestExplainAgreesWithRoute.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)


@pytest.mark.parametrize(("reentry", "where"), REENTRIES)
@pytest.mark.parametrize("call", ["t.explain('a', 7)", "t.explain('a', 99)"])
@pytest.mark.integration  # a child interpreter
def test_a_gc_pass_inside_explain_may_re_enter(call: str, reentry: str, where: str) -> None:
    run_child(child_code("", call, reentry, where, gc_pass=True))


def test_the_machine_keys_reach_many_buckets() -> None:
    """The keys the machine explains reach both mapped and unmapped buckets of each tier."""
    t = Topology()
    t.apply_tiers(TIERS)
    for tier in TIERS:
        assert len({t.bucket_id(tier, key) for key in KEYS}) > 15
