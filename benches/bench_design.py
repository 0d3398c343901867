"""Design measurements, in Python terms only (nothing here changes or mirrors the Rust code).

- ``design: call cost``: where the time of one ``owner`` call goes. ``epoch(tier)`` is a
  ``Topology`` method that does everything ``owner`` does (the call, the tier argument, the read
  lock, the tier's map) except the range search and returning the owner, so
  ``owner - epoch`` ~ the search and ``epoch - dict.get`` ~ the call machinery.
- ``design: bulk lookup kernel``: sorted ranges searched by bisection vs a dense bucket -> owner
  table, for 100,000 bucket ids at once, as vectorised numpy kernels (``np.searchsorted`` on the
  range ends vs ``dense[ids]``), then a dense table of owner objects that also builds the
  100,000-element result list (``dense_objects[ids].tolist()``), next to shardline's ``owners``
  on the same ids (sorted ranges searched in Rust, and the result list).
- ``design: route_many decomposition``: ``route_many`` per key, taken apart from outside: the
  lookup and result list alone (``owners``), then with hashing of one short key repeated
  (``route_many`` of zeros), then with random keys but no master to resolve (the instances were
  never announced, so every answer is None), then the real thing.
- ``design: route_many by int64 key width``: the same, for int64 arrays whose keys all encode
  to one msgpack width (1, 3, 5 or 9 bytes hashed).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("pytest_benchmark")
np = pytest.importorskip("numpy")

from shardline import ReplicasetEvent, Topology, bucket_id  # noqa: E402

from .benchkit import (  # noqa: E402
    CALLS_PER_ROUND,
    SEED,
    TIER,
    blocks,
    cluster,
    int_keys,
    probe_buckets,
    shardline_topology,
    str_keys,
)

CALL_IMPLS = ["floor: dict.get", "shardline epoch(tier)", "shardline owner"]


@pytest.mark.parametrize("impl", CALL_IMPLS)
@pytest.mark.parametrize(("bucket_count", "n_ranges"), [(3000, 2), (3000, 256), (30_000, 1024)])
def test_call_cost(
    benchmark: Any, per_call: Callable[..., Any], bucket_count: int, n_ranges: int, impl: str
) -> None:
    c = cluster(bucket_count, n_ranges)
    ours = shardline_topology(c)
    probes = probe_buckets(bucket_count)
    assert [ours.owner(TIER, b) for b in probes] == [c.owner_of[b] for b in probes]
    it = blocks(probes)
    get, owner, epoch = c.owner_of.get, ours.owner, ours.epoch

    def dict_round() -> Any:
        result = None
        for b in next(it):
            result = get(b)
        return result

    def owner_round() -> Any:
        result = None
        for b in next(it):
            result = owner(TIER, b)
        return result

    def epoch_round() -> Any:
        result = None
        for _ in next(it):
            result = epoch(TIER)
        return result

    run = {
        "floor: dict.get": dict_round,
        "shardline epoch(tier)": epoch_round,
        "shardline owner": owner_round,
    }[impl]
    benchmark.group = f"design: call cost {c.label}"
    assert per_call(run, CALLS_PER_ROUND, impl=impl, scenario="design") is not None


N_IDS = 100_000
KERNEL_IMPLS = [
    "numpy searchsorted(ends, ids) -> owner index",
    "numpy dense[ids] -> owner index",
    "numpy dense_objects[ids].tolist() -> owner list",
    "ref: list(map(dense_list.__getitem__, ids))",
    "shardline owners(np.int64 ids)",
]


@pytest.mark.parametrize("impl", KERNEL_IMPLS)
@pytest.mark.parametrize(("bucket_count", "n_ranges"), [(3000, 256), (30_000, 1024)])
def test_bulk_lookup_kernel(
    benchmark: Any, per_call: Callable[..., Any], bucket_count: int, n_ranges: int, impl: str
) -> None:
    c = cluster(bucket_count, n_ranges)
    ours = shardline_topology(c)
    ranges = sorted(ours.ranges(TIER))
    owners = [owner for _, _, owner in ranges]
    ends = np.array([end for _, end, _ in ranges], dtype=np.int64)
    index_of = {owner: i for i, owner in enumerate(dict.fromkeys(owners))}
    by_range = np.array([index_of[o] for o in owners], dtype=np.int32)
    dense = np.zeros(bucket_count + 1, dtype=np.int32)
    for start, end, owner in ranges:
        dense[start : end + 1] = index_of[owner]
    dense_list = [None] + [c.owner_of[b] for b in range(1, bucket_count + 1)]
    dense_objects = np.array(dense_list, dtype=object)
    rng = random.Random(f"{SEED}/kernel/{bucket_count}")
    id_list = [rng.randint(1, bucket_count) for _ in range(N_IDS)]
    ids = np.array(id_list, dtype=np.int64)

    run: Callable[[], Any] = {
        KERNEL_IMPLS[0]: lambda: by_range[np.searchsorted(ends, ids)],
        KERNEL_IMPLS[1]: lambda: dense[ids],
        KERNEL_IMPLS[2]: lambda: dense_objects[ids].tolist(),
        KERNEL_IMPLS[3]: lambda: list(map(dense_list.__getitem__, id_list)),
        KERNEL_IMPLS[4]: lambda: ours.owners(TIER, ids),
    }[impl]
    expected = [c.owner_of[b] for b in id_list]
    result = run()
    if isinstance(result, list):
        assert result == expected
    else:
        names = list(index_of)
        assert [names[i] for i in result.tolist()] == expected

    benchmark.group = f"design: bulk lookup kernel {N_IDS:,} ids {c.label}"
    per_call(run, N_IDS, rounds=100, warmup=3, impl=impl, scenario="design")


DECOMPOSITION = [
    "owners(bucket ids): lookup + result list",
    "route_many(int64 zeros): + hash of one short key + master",
    "route_many(int64 keys), no instances known: + hash, no master",
    "route_many(int64 keys)",
    "route_many(str keys)",
]


@pytest.mark.parametrize("impl", DECOMPOSITION)
def test_route_many_decomposition(benchmark: Any, per_call: Callable[..., Any], impl: str) -> None:
    """Where ``route_many``'s time per key goes (3,000 buckets, 256 ranges, 100,000 keys)."""
    c = cluster(3000, 256)
    ours = shardline_topology(c)
    masterless = Topology()  # the same map, but the masters' instances were never announced
    masterless.apply_tiers({TIER: c.bucket_count})
    for rs, master in c.masters.items():
        masterless.apply(ReplicasetEvent("replace", rs, tier=TIER, current_master_uuid=master))
    assert masterless.apply_bucket_snapshot(TIER, c.rows)
    keys = np.array(int_keys(N_IDS, seed=SEED + 2), dtype=np.int64)
    strs = str_keys(N_IDS, seed=SEED + 2)
    zeros = np.zeros(N_IDS, dtype=np.int64)
    buckets = np.array([bucket_id(int(k), c.bucket_count) for k in keys], dtype=np.int64)

    run: Callable[[], Any] = {
        DECOMPOSITION[0]: lambda: ours.owners(TIER, buckets),
        DECOMPOSITION[1]: lambda: ours.route_many(TIER, zeros),
        DECOMPOSITION[2]: lambda: masterless.route_many(TIER, keys),
        DECOMPOSITION[3]: lambda: ours.route_many(TIER, keys),
        DECOMPOSITION[4]: lambda: ours.route_many(TIER, strs),
    }[impl]
    result = run()
    assert len(result) == N_IDS
    if impl == DECOMPOSITION[2]:
        assert result == [None] * N_IDS
    elif impl == DECOMPOSITION[3]:
        assert [i.replicaset_uuid for i in result] == ours.owners(TIER, buckets)

    benchmark.group = f"design: route_many decomposition {N_IDS:,} keys {c.label}"
    per_call(run, N_IDS, rounds=60, warmup=2, impl=impl, scenario="design")


WIDTHS = {  # msgpack encoding of the key, and so the bytes hashed: 1, 3, 5 and 9
    "fixint 0..127": (0, 128),
    "uint16 256..65535": (256, 1 << 16),
    "uint32 2^16..2^32": (1 << 16, 1 << 32),
    "uint64 2^32..2^62": (1 << 32, 1 << 62),
}


@pytest.mark.parametrize("width", list(WIDTHS))
def test_route_many_by_key_width(benchmark: Any, per_call: Callable[..., Any], width: str) -> None:
    """``route_many`` of an int64 array whose keys all have one msgpack width."""
    c = cluster(3000, 256)
    ours = shardline_topology(c)
    low, high = WIDTHS[width]
    rng = random.Random(f"{SEED}/width/{width}")
    keys = [rng.randrange(low, high) for _ in range(N_IDS)]
    array = np.array(keys, dtype=np.int64)
    result = ours.route_many(TIER, array)
    assert [i.replicaset_uuid for i in result[:2000]] == [
        c.owner_of[bucket_id(k, c.bucket_count)] for k in keys[:2000]
    ]
    benchmark.group = f"design: route_many by int64 key width {N_IDS:,} keys {c.label}"
    per_call(
        lambda: ours.route_many(TIER, array),
        N_IDS,
        rounds=60,
        warmup=2,
        impl=width,
        scenario="design",
    )
