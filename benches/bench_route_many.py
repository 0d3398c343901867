"""Scenario 3: ``route_many`` of 100,000 keys in one call (3,000 buckets, 256 ranges).

One group, timed per call and reported per key:

- ``shardline route_many(list[str])`` and ``shardline route_many(np.int64)``: the goal, <= 10 ns
  per key;
- ``shardline route_many(list[int])``: the same ints as the array, as Python ints;
- ``ref: shardline owners(np.int64 bucket ids)``: the lookup and the result list alone, no hashing;
- ``floor: list(map(dict.get, buckets))``: a Python dict lookup per bucket id, in a C loop;
- ``ref: list(map(len, str keys))`` and ``ref: list(map(mmh3.hash, str keys))``: what any C loop
  over the 100,000 str keys that builds a result list costs, doing nothing or hashing each key;
- ``picopyn: calculate_bucket_id + find_bucket_master``: what the peer does per key, in a Python
  loop over the same str keys (a handful of rounds only: it is slow).

Every result list is checked in full against picopyn's bucket ids and masters before timing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("pytest_benchmark")
pytest.importorskip("picopyn")
np = pytest.importorskip("numpy")

import mmh3  # noqa: E402
from picopyn.bucket import calculate_bucket_id  # noqa: E402

from .benchkit import (  # noqa: E402
    SEED,
    TIER,
    cluster,
    int_keys,
    needs_hashing,
    picopyn_meta,
    picopyn_topology,
    shardline_topology,
    str_keys,
)

BUCKET_COUNT = 3000
N_RANGES = 256
N_KEYS = 100_000
IMPLS = [
    "shardline route_many(list[str])",
    "shardline route_many(np.int64)",
    "shardline route_many(list[int])",
    "ref: shardline owners(np.int64 bucket ids)",
    "floor: list(map(dict.get, buckets))",
    "ref: list(map(len, str keys))",
    "ref: list(map(mmh3.hash, str keys))",
    "picopyn: calculate_bucket_id + find_bucket_master",
]
ROUNDS = {"picopyn: calculate_bucket_id + find_bucket_master": 5}


def expected_masters(peer: Any, kind: str, keys: list[Any]) -> tuple[list[int], list[str]]:
    meta = picopyn_meta(kind)
    buckets = [calculate_bucket_id(meta, (key,), BUCKET_COUNT) for key in keys]
    return buckets, [peer.find_bucket_master(TIER, b).uuid for b in buckets]


@needs_hashing
@pytest.mark.parametrize("impl", IMPLS)
def test_route_many(benchmark: Any, per_call: Callable[..., Any], impl: str) -> None:
    c = cluster(BUCKET_COUNT, N_RANGES)
    ours = shardline_topology(c)
    peer = picopyn_topology(c)
    strs = str_keys(N_KEYS, seed=SEED + 1)
    ints = int_keys(N_KEYS, seed=SEED + 1)
    array = np.array(ints, dtype=np.int64)

    if "list[str]" in impl or "str keys" in impl or impl.startswith("picopyn"):
        kind, keys = "str", strs
    else:
        kind, keys = "int", ints
    buckets, masters = expected_masters(peer, kind, keys)
    bucket_array = np.array(buckets, dtype=np.int64)

    def peer_route_many() -> list[Any]:
        meta = picopyn_meta("str")
        find = peer.find_bucket_master
        return [find(TIER, calculate_bucket_id(meta, (key,), BUCKET_COUNT)) for key in strs]

    run: Callable[[], list[Any]] = {
        "shardline route_many(list[str])": lambda: ours.route_many(TIER, strs),
        "shardline route_many(np.int64)": lambda: ours.route_many(TIER, array),
        "shardline route_many(list[int])": lambda: ours.route_many(TIER, ints),
        "ref: shardline owners(np.int64 bucket ids)": lambda: ours.owners(TIER, bucket_array),
        "floor: list(map(dict.get, buckets))": lambda: list(map(c.owner_of.get, buckets)),
        "ref: list(map(len, str keys))": lambda: list(map(len, strs)),
        "ref: list(map(mmh3.hash, str keys))": lambda: list(map(mmh3.hash, strs)),
        "picopyn: calculate_bucket_id + find_bucket_master": peer_route_many,
    }[impl]

    result = run()  # the full answer is right, before anything is timed
    assert len(result) == N_KEYS
    if impl.startswith("ref: list(map("):
        pass  # a cost reference: nothing to agree with
    elif "owners" in impl or "dict.get" in impl:
        assert result == [c.owner_of[b] for b in buckets]
    else:
        assert [instance.uuid for instance in result] == masters

    benchmark.group = f"route_many {N_KEYS:,} keys ({c.label})"
    rounds = ROUNDS.get(impl, 60)
    last = per_call(run, N_KEYS, rounds=rounds, warmup=1, impl=impl, scenario="route_many")
    assert len(last) == N_KEYS
