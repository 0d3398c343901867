"""Tier lookup: an ``owner`` call costs the same with 1 tier and with 20,000.

One group, ``owner by tier name``: ``owner`` on a map of 16 ranges in a topology of 1 or 20,000
tiers, with the tier named by the literal the topology interned (the usual call) and by a name
built at run time (equal text, another object, so it is encoded and hashed).

Goal: 20,000 tiers cost no more than 1 tier plus cache misses (well under 2x), for both names.
Before timing, every probe is checked against the owner the map was built with.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("pytest_benchmark")

from shardline import BucketEvent, Topology

from .benchkit import CALLS_PER_ROUND, TIER, blocks, make_uuid, probe_buckets

BUCKET_COUNT = 3000
RANGES = 16
TIER_COUNTS = [1, 20_000]
NAMES = ["literal", "built at run time"]


def topology_with(tiers: int) -> tuple[Topology, dict[int, str]]:
    rng = random.Random(tiers)
    topology = Topology()
    topology.apply_tiers(
        {TIER: BUCKET_COUNT} | {f"tier-{i}": BUCKET_COUNT for i in range(1, tiers)}
    )
    owner_of: dict[int, str] = {}
    width = BUCKET_COUNT // RANGES
    for start in range(1, BUCKET_COUNT + 1, width):
        end = min(start + width - 1, BUCKET_COUNT)
        owner = make_uuid(rng)
        topology.apply(BucketEvent(TIER, start, end, owner))
        owner_of |= dict.fromkeys(range(start, end + 1), owner)
    return topology, owner_of


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("tiers", TIER_COUNTS)
def test_owner_by_tier_name(
    benchmark: Any, per_call: Callable[..., Any], tiers: int, name: str
) -> None:
    topology, owner_of = topology_with(tiers)
    tier = TIER if name == "literal" else "".join(list(TIER))
    assert (tier is TIER) == (name == "literal")
    probes = probe_buckets(BUCKET_COUNT)
    for b in probes:
        assert topology.owner(tier, b) == owner_of[b]

    benchmark.group = "owner by tier name"
    it = blocks(probes)
    owner = topology.owner

    def round_() -> Any:
        result = None
        for probe in next(it):
            result = owner(tier, probe)
        return result

    impl = f"owner, {tiers:,} tier{'s' if tiers > 1 else ''}, name {name}"
    assert per_call(round_, CALLS_PER_ROUND, impl=impl, scenario="tiers") is not None
