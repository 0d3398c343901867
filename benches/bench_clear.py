"""Rule 6: clearing a tier costs O(ranges in that tier), never O(all tiers).

One group, two maps side by side: a tier ``small`` holding one range is cleared and refilled
(a bucket event overlapping its range clears the map, then upserts) while another tier holds 1
range, or 100,000. The two medians should match: clearing never walks another tier.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from shardline import BucketEvent, Topology

pytest.importorskip("pytest_benchmark")

OTHER_RANGES = [1, 100_000]
EVENTS_PER_ROUND = 2


def topology_with_other_tier(other_ranges: int) -> Topology:
    owner = str(uuid.UUID(int=1))
    topology = Topology()
    topology.apply_tiers({"small": 3000, "big": other_ranges})
    topology.apply_bucket_snapshot(
        "big", [BucketEvent("big", b, b, owner) for b in range(1, other_ranges + 1)]
    )
    topology.apply_bucket(BucketEvent("small", 1, 10, owner))
    return topology


@pytest.mark.parametrize("other_ranges", OTHER_RANGES)
def test_clear_one_tier(benchmark: Any, per_call: Callable[..., Any], other_ranges: int) -> None:
    benchmark.group = "clear one tier (1 range) beside another tier"
    topology = topology_with_other_tier(other_ranges)
    owner = str(uuid.UUID(int=1))
    overlapping = [BucketEvent("small", 5, 20, owner), BucketEvent("small", 1, 10, owner)]
    epoch, big = topology.epoch("small"), topology.epoch("big")

    def round_() -> None:
        for event in overlapping:
            topology.apply_bucket(event)

    round_()
    assert topology.epoch("small") == epoch + 2, "each event must clear and refill the map"
    assert topology.ranges("small") == [(1, 10, owner)]
    per_call(
        round_,
        EVENTS_PER_ROUND,
        impl=f"other tier holds {other_ranges:,} ranges",
        scenario="clear",
    )
    assert topology.epoch("big") == big
    assert len(topology.ranges("big")) == other_ranges
