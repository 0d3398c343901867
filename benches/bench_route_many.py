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
  loop over the same str keys (a handful of rounds only: it is slow);
- ``... out=``: the same keys with ``out=`` (issue 12): indices into the list of distinct routes
  written to a preallocated ``np.intp`` array; the goal is <= 7 ns per key for the int64 array.

Every result list is checked in full against picopyn's bucket ids and masters before timing.

And ``route_many vs today``: the same call against the extension as it was before issue 12, timed
back to back in every round (ratio per round), when ``SHARDLINE_BASELINE_CORE`` names that build's
``_core*.so`` (say, unpacked from a wheel of the commit before); skipped otherwise. Both results
are released outside the timed region, as ``per_call`` does for every other row.
"""

from __future__ import annotations

import glob
import importlib.util
import itertools
import os
import time
from collections.abc import Callable
from types import ModuleType
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
    interleaved_summary,
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
    "shardline route_many(np.int64, out=)",
    "shardline route_many(list[str], out=)",
    "shardline route_many(list[int], out=)",
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

    out = np.empty(N_KEYS, dtype=np.intp)

    def with_out(keys: Any) -> Callable[[], list[Any]]:
        def run() -> list[Any]:
            routes = ours.route_many(TIER, keys, out=out)
            return [routes[j] for j in out]  # only for the check below: not timed

        return run

    run: Callable[[], list[Any]] = {
        "shardline route_many(list[str])": lambda: ours.route_many(TIER, strs),
        "shardline route_many(np.int64)": lambda: ours.route_many(TIER, array),
        "shardline route_many(list[int])": lambda: ours.route_many(TIER, ints),
        "ref: shardline owners(np.int64 bucket ids)": lambda: ours.owners(TIER, bucket_array),
        "floor: list(map(dict.get, buckets))": lambda: list(map(c.owner_of.get, buckets)),
        "ref: list(map(len, str keys))": lambda: list(map(len, strs)),
        "ref: list(map(mmh3.hash, str keys))": lambda: list(map(mmh3.hash, strs)),
        "picopyn: calculate_bucket_id + find_bucket_master": peer_route_many,
        "shardline route_many(np.int64, out=)": with_out(array),
        "shardline route_many(list[str], out=)": with_out(strs),
        "shardline route_many(list[int], out=)": with_out(ints),
    }[impl]

    result = run()  # the full answer is right, before anything is timed
    assert len(result) == N_KEYS
    if impl.startswith("ref: list(map("):
        pass  # a cost reference: nothing to agree with
    elif "owners" in impl or "dict.get" in impl:
        assert result == [c.owner_of[b] for b in buckets]
    else:
        assert [instance.uuid for instance in result] == masters

    if impl.endswith("out=)"):
        keys_in = {"np.int64": array, "list[str]": strs, "list[int]": ints}[
            impl.split("(")[1].split(",")[0]
        ]
        timed: Callable[[], Any] = lambda: ours.route_many(TIER, keys_in, out=out)  # noqa: E731
    else:
        timed = run
    benchmark.group = f"route_many {N_KEYS:,} keys ({c.label})"
    rounds = ROUNDS.get(impl, 60)
    last = per_call(timed, N_KEYS, rounds=rounds, warmup=1, impl=impl, scenario="route_many")
    assert len(last) == N_KEYS or impl.endswith("out=)")


def baseline_core() -> ModuleType | None:
    """The extension as it was before issue 12, from ``SHARDLINE_BASELINE_CORE`` (a path or a
    glob of its ``_core*.so``), loaded beside the current one as a module of its own."""
    pattern = os.environ.get("SHARDLINE_BASELINE_CORE")
    if not pattern:
        return None
    path = sorted(glob.glob(pattern))[0]
    spec = importlib.util.spec_from_file_location("_core", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def baseline_topology(core: ModuleType, c: Any) -> Any:
    """``benchkit.shardline_topology`` built with the baseline extension's ``Topology``."""
    return shardline_topology(c, core.Topology)


def interleaved(
    benchmark: Any,
    per_call: Callable[..., Any],
    ours: Callable[[], Any],
    theirs: Callable[[], Any],
    calls: int,
    rounds: int,
    **info: Any,
) -> None:
    """Times ``ours`` and ``theirs`` back to back in every round, alternating which goes first;
    both results are released after the round (outside the timed region, as ``per_call``)."""
    warmup = 3
    ours_ns: list[int] = []
    theirs_ns: list[int] = []
    flip = itertools.cycle([False, True])
    clock = time.perf_counter_ns

    def round_() -> Any:
        theirs_first = next(flip)
        first, second = (theirs, ours) if theirs_first else (ours, theirs)
        t0 = clock()
        a = first()
        t1 = clock()
        b = second()
        t2 = clock()
        (theirs_ns if theirs_first else ours_ns).append(t1 - t0)
        (ours_ns if theirs_first else theirs_ns).append(t2 - t1)
        return a, b

    per_call(round_, 2 * calls, rounds=rounds, warmup=warmup, **info)
    benchmark.extra_info.update(interleaved_summary(ours_ns[warmup:], theirs_ns[warmup:], calls))


VS_TODAY = ["np.int64", "list[int]", "list[str]", "np.int64, out= (vs today's list)"]


@pytest.mark.parametrize("kind", VS_TODAY)
def test_route_many_vs_today(benchmark: Any, per_call: Callable[..., Any], kind: str) -> None:
    core = baseline_core()
    if core is None:
        pytest.skip("SHARDLINE_BASELINE_CORE names no baseline build")
    c = cluster(BUCKET_COUNT, N_RANGES)
    ours, today = shardline_topology(c), baseline_topology(core, c)
    keys: Any = {
        "list[str]": str_keys(N_KEYS, seed=SEED + 1),
        "list[int]": int_keys(N_KEYS, seed=SEED + 1),
    }.get(kind) or np.array(int_keys(N_KEYS, seed=SEED + 1), dtype=np.int64)
    want = [instance.uuid for instance in today.route_many(TIER, keys)]
    if "out=" in kind:
        out = np.empty(N_KEYS, dtype=np.intp)
        routes = ours.route_many(TIER, keys, out=out)
        assert [routes[j].uuid for j in out] == want
        run_ours: Callable[[], Any] = lambda: ours.route_many(TIER, keys, out=out)  # noqa: E731
    else:
        assert [instance.uuid for instance in ours.route_many(TIER, keys)] == want
        run_ours = lambda: ours.route_many(TIER, keys)  # noqa: E731
    benchmark.group = f"route_many {N_KEYS:,} keys vs today, interleaved"
    interleaved(
        benchmark,
        per_call,
        run_ours,
        lambda: today.route_many(TIER, keys),
        N_KEYS,
        rounds=100,
        impl=f"shardline vs today route_many({kind})",
    )
