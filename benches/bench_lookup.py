"""Scenario 1: the owner of a bucket, one call at a time.

For 3,000 and 30,000 buckets in 2, 16, 256 and 1,024 ranges, one group per map, side by side:

- ``floor: dict.get``: a Python dict bucket -> owner uuid, its bound ``get`` called on an int;
- ``ref: list[bucket]``: a dense Python list bucket -> owner (``list.__getitem__``), for scale;
- ``shardline owner`` and ``shardline find_bucket_master``;
- ``picopyn find_bucket_master``: the peer's only bucket lookup, on the same map.

Goal: at 256 ranges ``owner`` is within 1.5x of ``dict.get`` and >= 5x faster than picopyn.
Before timing, every probe is checked: all of them must name the same owner and master.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("pytest_benchmark")
pytest.importorskip("picopyn")

from .benchkit import (
    CALLS_PER_ROUND,
    TIER,
    blocks,
    cluster,
    one_arg_rounds,
    picopyn_topology,
    probe_buckets,
    shardline_topology,
    two_arg_rounds,
)

BUCKET_COUNTS = [3000, 30_000]
RANGE_COUNTS = [2, 16, 256, 1024]
IMPLS = [
    "floor: dict.get",
    "ref: list[bucket]",
    "shardline owner",
    "shardline find_bucket_master",
    "picopyn find_bucket_master",
]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("n_ranges", RANGE_COUNTS)
@pytest.mark.parametrize("bucket_count", BUCKET_COUNTS)
def test_lookup(
    benchmark: Any, per_call: Callable[..., Any], bucket_count: int, n_ranges: int, impl: str
) -> None:
    c = cluster(bucket_count, n_ranges)
    ours = shardline_topology(c)
    peer = picopyn_topology(c)
    dense = [None] + [c.owner_of[b] for b in range(1, bucket_count + 1)]
    probes = probe_buckets(bucket_count)

    for b in probes:  # all agree on every probe, before anything is timed
        owner = c.owner_of[b]
        master = c.masters[owner]
        assert ours.owner(TIER, b) == owner
        assert dense[b] == owner
        instance = ours.find_bucket_master(TIER, b)
        assert instance is not None
        assert instance.uuid == master
        assert instance.address == c.addresses[master]
        assert peer.find_bucket_master(TIER, b).uuid == master
    assert ours.owner(TIER, bucket_count + 1) is None
    assert peer.find_bucket_master(TIER, bucket_count + 1) is None

    benchmark.group = f"lookup {c.label}"
    it = blocks(probes)
    round_fn = {
        "floor: dict.get": lambda: one_arg_rounds(c.owner_of.get, it),
        "ref: list[bucket]": lambda: one_arg_rounds(dense.__getitem__, it),
        "shardline owner": lambda: two_arg_rounds(ours.owner, it),
        "shardline find_bucket_master": lambda: two_arg_rounds(ours.find_bucket_master, it),
        "picopyn find_bucket_master": lambda: two_arg_rounds(peer.find_bucket_master, it),
    }[impl]()
    last = per_call(round_fn, CALLS_PER_ROUND, impl=impl, scenario="lookup", map=c.label)
    assert last is not None
