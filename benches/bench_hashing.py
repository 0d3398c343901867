"""Scenario 2: the bucket id of a key, and ``route`` (bucket id + lookup) of a key.

One group per key kind (a str, an int, a 3-part ``(int, str, int)`` key), side by side:

- ``shardline bucket_id(key, n)`` (module function) and ``shardline Topology.bucket_id``;
- ``shardline route``: bucket id, owner and master instance in one call (3,000 buckets, 256
  ranges);
- ``picopyn calculate_bucket_id``: the peer's bucket-id computation alone, given the key's
  ``dk_meta`` and its parameters already packed in a tuple (as a query's arguments are);
- for str keys, ``ref: mmh3.hash(str)``: one C call hashing the key, no encoding rules, no modulo.

Goal: ``route`` of a str key >= 8x faster than picopyn's ``calculate_bucket_id`` alone.
Before timing, every key is checked: shardline's bucket id must equal picopyn's, and ``route``
must return the master that picopyn's ``find_bucket_master`` gives for that bucket.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("pytest_benchmark")
pytest.importorskip("picopyn")

import mmh3
from picopyn.bucket import calculate_bucket_id

import shardline

from .benchkit import (
    CALLS_PER_ROUND,
    TIER,
    blocks,
    cluster,
    int_keys,
    picopyn_meta,
    picopyn_params,
    picopyn_topology,
    shardline_topology,
    str_keys,
    tuple_keys,
)

BUCKET_COUNT = 3000
N_RANGES = 256
KINDS = ["str", "int", "3-part"]
IMPLS = [
    "shardline bucket_id(key, n)",
    "shardline Topology.bucket_id",
    "shardline route",
    "picopyn calculate_bucket_id",
    "ref: mmh3.hash(str)",
]
KEYS = {"str": str_keys, "int": int_keys, "3-part": tuple_keys}


def round_fn(impl: str, kind: str, keys: list[Any], topology: Any) -> Callable[[], Any]:
    n = BUCKET_COUNT
    if impl == "picopyn calculate_bucket_id":
        meta = picopyn_meta(kind)
        it = blocks([picopyn_params(kind, key) for key in keys])

        def peer_round() -> Any:
            result = None
            for params in next(it):
                result = calculate_bucket_id(meta, params, n)
            return result

        return peer_round

    it = blocks(keys)
    if impl == "ref: mmh3.hash(str)":
        mmh3_hash = mmh3.hash

        def mmh3_round() -> Any:
            result = None
            for key in next(it):
                result = mmh3_hash(key, 13, False)
            return result

        return mmh3_round
    if impl == "shardline bucket_id(key, n)":
        bucket_id = shardline.bucket_id

        def module_round() -> Any:
            result = None
            for key in next(it):
                result = bucket_id(key, n)
            return result

        return module_round
    method = topology.bucket_id if impl == "shardline Topology.bucket_id" else topology.route

    def method_round() -> Any:
        result = None
        for key in next(it):
            result = method(TIER, key)
        return result

    return method_round


CASES = [(k, i) for k in KINDS for i in IMPLS if k == "str" or not i.startswith("ref: mmh3")]


@pytest.mark.parametrize(("kind", "impl"), CASES)
def test_bucket_id(benchmark: Any, per_call: Callable[..., Any], kind: str, impl: str) -> None:
    c = cluster(BUCKET_COUNT, N_RANGES)
    ours = shardline_topology(c)
    peer = picopyn_topology(c)
    keys = KEYS[kind]()
    meta = picopyn_meta(kind)

    for key in keys:  # identical bucket ids and masters for every key, before anything is timed
        expected = calculate_bucket_id(meta, picopyn_params(kind, key), BUCKET_COUNT)
        assert expected is not None
        assert shardline.bucket_id(key, BUCKET_COUNT) == expected, key
        assert ours.bucket_id(TIER, key) == expected, key
        routed = ours.route(TIER, key)
        assert routed is not None
        assert routed.uuid == peer.find_bucket_master(TIER, expected).uuid, key

    benchmark.group = f"bucket_id {kind} key"
    last = per_call(
        round_fn(impl, kind, keys, ours), CALLS_PER_ROUND, impl=impl, scenario="hashing"
    )
    assert last is not None
