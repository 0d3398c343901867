"""The ratio goals again, measured interleaved: the steadiest numbers this machine can give.

On a shared 2-core machine the speed drifts by up to 2x for seconds at a time, so two
benchmarks run one after the other can see different machines, and a ratio of their medians can
be off by that much. Here each round times one block of shardline calls and one block of the
compared calls back to back (in alternating order), and the ratio is taken per round, then the
median over the rounds. The per-call times are in ``extra_info`` (``ours_ns``, ``theirs_ns``,
``ratio``); the pytest-benchmark time of these tests is that of both blocks together and means
nothing by itself.

Every pair is checked first, as in the scenario files: the same answers on every probe.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("pytest_benchmark")
pytest.importorskip("picopyn")

from picopyn.bucket import calculate_bucket_id
from picopyn.utils.topology import apply_bucket_rows

from .benchkit import (
    CALLS_PER_ROUND,
    TIER,
    blocks,
    cluster,
    interleaved_summary,
    one_arg_rounds,
    picopyn_topology,
    probe_buckets,
    shardline_topology,
    str_keys,
    two_arg_rounds,
)

ROUNDS = 600
WARMUP = 20


def interleave(
    benchmark: Any,
    per_call: Callable[..., Any],
    ours: Callable[[], Any],
    theirs: Callable[[], Any],
    calls: int,
    **info: Any,
) -> None:
    """Times ``ours`` and ``theirs`` (each making ``calls`` calls) back to back in every round."""
    ours_ns: list[int] = []
    theirs_ns: list[int] = []
    flip = itertools.cycle([False, True])
    clock = time.perf_counter_ns

    def round_() -> Any:
        if next(flip):
            t0 = clock()
            theirs()
            t1 = clock()
            result = ours()
            t2 = clock()
            theirs_ns.append(t1 - t0)
            ours_ns.append(t2 - t1)
        else:
            t0 = clock()
            result = ours()
            t1 = clock()
            theirs()
            t2 = clock()
            ours_ns.append(t1 - t0)
            theirs_ns.append(t2 - t1)
        return result

    per_call(round_, 2 * calls, rounds=ROUNDS, warmup=WARMUP, **info)
    benchmark.extra_info.update(interleaved_summary(ours_ns[WARMUP:], theirs_ns[WARMUP:], calls))


@pytest.mark.parametrize("bucket_count", [3000, 30_000])
@pytest.mark.parametrize("theirs", ["floor: dict.get", "picopyn find_bucket_master"])
def test_owner_vs(
    benchmark: Any, per_call: Callable[..., Any], theirs: str, bucket_count: int
) -> None:
    c = cluster(bucket_count, 256)
    ours = shardline_topology(c)
    peer = picopyn_topology(c)
    probes = probe_buckets(bucket_count)
    for b in probes:
        assert ours.owner(TIER, b) == c.owner_of[b]
        assert peer.find_bucket_master(TIER, b).uuid == c.masters[c.owner_of[b]]
    ours_it, theirs_it = blocks(probes), blocks(probes)
    compared = (
        one_arg_rounds(c.owner_of.get, theirs_it)
        if theirs.startswith("floor")
        else two_arg_rounds(peer.find_bucket_master, theirs_it)
    )
    benchmark.group = "goals, interleaved"
    interleave(
        benchmark,
        per_call,
        two_arg_rounds(ours.owner, ours_it),
        compared,
        CALLS_PER_ROUND,
        impl=f"shardline owner vs {theirs}, {c.label}",
        goal_group=f"lookup {c.label}",
        goal_ours="shardline owner",
        goal_theirs=theirs,
    )


def test_route_vs_calculate_bucket_id(benchmark: Any, per_call: Callable[..., Any]) -> None:
    c = cluster(3000, 256)
    ours = shardline_topology(c)
    peer = picopyn_topology(c)
    keys = str_keys()
    meta = [(1, 25)]
    params = [(key,) for key in keys]
    for key, p in zip(keys, params, strict=True):
        bucket = calculate_bucket_id(meta, p, c.bucket_count)
        assert ours.route(TIER, key).uuid == peer.find_bucket_master(TIER, bucket).uuid
    theirs_it = blocks(params)
    n = c.bucket_count

    def peer_block() -> Any:
        result = None
        for p in next(theirs_it):
            result = calculate_bucket_id(meta, p, n)
        return result

    benchmark.group = "goals, interleaved"
    interleave(
        benchmark,
        per_call,
        two_arg_rounds(ours.route, blocks(keys)),
        peer_block,
        CALLS_PER_ROUND,
        impl="shardline route vs picopyn calculate_bucket_id, str keys",
        goal_group="bucket_id str key",
        goal_ours="shardline route",
        goal_theirs="picopyn calculate_bucket_id",
    )


@pytest.mark.parametrize("form", ["rows", "JSON text"])
def test_unchanged_poll_vs_picopyn(benchmark: Any, per_call: Callable[..., Any], form: str) -> None:
    c = cluster(3000, 256)
    ours = shardline_topology(c)
    peer = picopyn_topology(c)
    # Equal polls as distinct objects, as successive polls are: decoded rows, or the text itself.
    copies = c.decoded_polls(8) if form == "rows" else [(c.payload + " ")[:-1] for _ in range(8)]
    polls = itertools.cycle(copies)
    suffix = "" if form == "rows" else "(JSON text)"
    epoch, peer_before = ours.epoch(TIER), dict(peer.buckets)

    benchmark.group = "goals, interleaved"
    interleave(
        benchmark,
        per_call,
        lambda: ours.apply_bucket_snapshot(TIER, next(polls)),
        lambda: apply_bucket_rows(peer, TIER, next(polls)),
        1,
        impl=f"shardline vs picopyn, unchanged poll as {form}, {c.label}",
        goal_group=f"unchanged poll {c.label}",
        goal_ours=f"shardline apply_bucket_snapshot{suffix}",
        goal_theirs=f"picopyn apply_bucket_rows{suffix}",
    )
    assert ours.epoch(TIER) == epoch
    assert peer.buckets == peer_before
