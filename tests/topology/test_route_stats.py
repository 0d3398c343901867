"""`Topology.route_stats`: lookups and misses by reason, counted where the lookups run.

The reference is `Topology.explain`, which says for one key on the same view what `route`
answers and why: over random histories of events interleaved with lookups (Hypothesis), every
lookup must add what explain's reasons add up to. The cases after it spell out each reason and
the calls that count nothing.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardline import (
    BucketEvent,
    InstanceEvent,
    ReplicasetEvent,
    RouteStats,
    TierWithoutBuckets,
    Topology,
    UnknownTier,
)
from support.strategies import TIER, TIERS, valid_events

R1, I1, R2 = (str(uuid.UUID(int=n)) for n in (0xA001, 0xB001, 0xA002))
REASONS = ("map-cleared", "no-range", "replicaset-unknown", "master-unknown")
KEYS = st.integers(0, 300)

lookups = st.tuples(
    st.sampled_from(["owner", "owners", "find_bucket_master", "route", "route_many", "out"]),
    TIER,
    st.lists(KEYS, min_size=1, max_size=12),
)


class Expected:
    """What route_stats should say, added up from explain's answers before each lookup."""

    def __init__(self) -> None:
        self.routes: Counter[str] = Counter()
        self.misses: dict[str, Counter[str]] = {tier: Counter() for tier in TIERS}

    def look_up(self, topology: Topology, call: str, tier: str, keys: list[int]) -> None:
        explained = [topology.explain(tier, key) for key in keys]
        if call in ("owner", "owners", "find_bucket_master", "route"):
            keys = keys[:1] if call != "owners" else keys
            explained = explained[: len(keys)]
        self.routes[tier] += len(keys)
        for explanation in explained:
            # owner and owners answer the replicaset: they miss only for want of a range
            if call in ("owner", "owners"):
                if explanation.range is None:
                    self.misses[tier][explanation.reason] += 1
            elif explanation.reason is not None:
                self.misses[tier][explanation.reason] += 1
        buckets = [topology.bucket_id(tier, key) for key in keys]
        match call:
            case "owner":
                topology.owner(tier, buckets[0])
            case "owners":
                topology.owners(tier, buckets)
            case "find_bucket_master":
                topology.find_bucket_master(tier, buckets[0])
            case "route":
                topology.route(tier, keys[0])
            case "route_many":
                topology.route_many(tier, keys)
            case "out":
                topology.route_many(tier, np.array(keys), out=np.empty(len(keys), np.intp))

    def check(self, topology: Topology) -> None:
        for tier in TIERS:
            stats = topology.route_stats(tier)
            assert stats.tier == tier
            assert stats.routes == self.routes[tier]
            assert stats.misses == {reason: self.misses[tier][reason] for reason in REASONS}


@given(st.lists(valid_events | lookups | st.just("clear"), max_size=40))
def test_every_lookup_counts_as_explain_explains_it(steps: list[Any]) -> None:
    topology = Topology()
    topology.apply_tiers(TIERS)
    expected = Expected()
    for step in steps:
        if step == "clear":
            topology.clear()
        elif isinstance(step, tuple):
            expected.look_up(topology, *step)
        else:
            topology.apply(step)
        expected.check(topology)


def test_a_fresh_tier_counts_nothing_and_names_every_reason(topology: Topology) -> None:
    stats = topology.route_stats("default")
    assert isinstance(stats, RouteStats)
    assert (stats.routes, stats.misses) == (0, dict.fromkeys(REASONS, 0))
    assert repr(stats) == (
        "RouteStats(tier='default', routes=0, misses={'map-cleared': 0, 'no-range': 0, "
        "'replicaset-unknown': 0, 'master-unknown': 0})"
    )


def test_route_many_counts_one_route_per_key_and_no_miss_on_a_whole_map(
    topology: Topology,
) -> None:
    topology.apply(ReplicasetEvent("replace", R1, tier="default", current_master_uuid=I1))
    topology.apply(InstanceEvent("replace", I1, replicaset_uuid=R1, address="h:1"))
    topology.apply(BucketEvent("default", 1, 3000, R1))
    topology.route_many("default", np.arange(100_000))
    topology.route_many("default", list(range(10)), out=np.empty(10, np.intp))
    stats = topology.route_stats("default")
    assert (stats.routes, sum(stats.misses.values())) == (100_010, 0)
    assert topology.route_stats("other").routes == 0


def test_each_reason(topology: Topology) -> None:
    def misses(tier: str = "default") -> dict[str, int]:
        return {k: v for k, v in topology.route_stats(tier).misses.items() if v}

    topology.route("default", 1)
    assert misses() == {"no-range": 1}
    topology.apply(ReplicasetEvent("replace", R1, tier="default", current_master_uuid=I1))
    topology.apply(BucketEvent("default", 1, 3000, R1))
    topology.route_many("default", [1, 2, 3])
    assert misses() == {"no-range": 1, "master-unknown": 3}
    # the owner is known: owner answers it, whatever the master
    topology.owner("default", 5)
    assert misses() == {"no-range": 1, "master-unknown": 3}
    topology.apply(ReplicasetEvent("delete", R1, tier="default"))  # clears the map
    topology.owner("default", 5)
    topology.owners("default", [5, 6])
    assert misses() == {"no-range": 1, "master-unknown": 3, "map-cleared": 3}
    assert topology.route_stats("default").routes == 1 + 3 + 1 + 1 + 2
    # refilled, then a range deleted: the hole is not the clear's any more
    topology.apply(ReplicasetEvent("replace", R1, tier="default", current_master_uuid=I1))
    topology.apply(BucketEvent("default", 1, 10, R1))
    topology.apply(BucketEvent("default", 1, 10, R1, op="delete"))
    topology.owner("default", 5)
    assert misses() == {"no-range": 2, "master-unknown": 3, "map-cleared": 3}
    topology.apply(BucketEvent("other", 1, 3000, R2))  # an owner never announced
    topology.find_bucket_master("other", 7)
    assert misses("other") == {"replicaset-unknown": 1}


def test_a_call_that_raises_counts_nothing_and_explain_is_not_counted() -> None:
    topology = Topology()
    topology.apply_tiers({"default": 30, "arbiter": 0})
    with pytest.raises(UnknownTier):
        topology.route("nowhere", 1)
    with pytest.raises(TierWithoutBuckets):
        topology.route("arbiter", 1)
    with pytest.raises(TypeError):
        topology.route_many("default", [1, object()])
    topology.explain("default", 1)
    assert topology.route_stats("default").routes == 0
    assert topology.route_stats("arbiter").routes == 0
    with pytest.raises(UnknownTier, match="nowhere"):
        topology.route_stats("nowhere")


def test_a_registry_scraped_after_lookups_shows_the_routes_and_misses(
    topology: Topology,
) -> None:
    prometheus = pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families

    from shardline.metrics import register

    registry = prometheus.CollectorRegistry()
    register(registry, topology=topology)
    topology.apply(ReplicasetEvent("replace", R1, tier="default", current_master_uuid=I1))
    topology.apply(InstanceEvent("replace", I1, replicaset_uuid=R1, address="h:1"))
    topology.apply(BucketEvent("default", 1, 1500, R1))
    topology.route_many("default", np.arange(1000))
    topology.owner("default", 2000)
    topology.route("other", "key")
    text = prometheus.generate_latest(registry).decode()
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    misses = sum(
        topology.bucket_id("default", key) > 1500 for key in range(1000)
    )  # buckets the one range does not cover
    assert samples[("shardline_routes_total", (("tier", "default"),))] == 1001
    assert samples[("shardline_routes_total", (("tier", "other"),))] == 1
    expected = {("default", "no-range"): misses + 1, ("other", "no-range"): 1}
    for tier in ("default", "other"):
        for reason in REASONS:
            labels = (("reason", reason), ("tier", tier))
            assert samples[("shardline_route_misses_total", labels)] == expected.get(
                (tier, reason), 0
            )
