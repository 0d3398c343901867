"""Scenario 4: applying an unchanged ``_pico_bucket`` poll (the same rows again).

This is what every topology refresh does while the cluster is quiet. Per map (3,000 buckets in
256 ranges, the goal's case, and 30,000 in 1,024), side by side:

- ``shardline apply_bucket_snapshot``: the whole poll in one call; it must answer False
  (unchanged) and leave the epoch alone;
- ``picopyn apply_bucket_rows``: the peer's code path for a polled ``_pico_bucket`` payload
  (``picopyn.utils.topology.apply_bucket_rows``: parse the rows into events, then
  ``Topology.apply_bucket`` each); its map must be left as it was.
- both again from the poll's JSON text, which is what the query returns over pgwire and what
  both accept: picopyn decodes it every time; shardline recognises a text equal to the last
  one it applied (with the map unchanged since) without decoding it.

Each round is handed the next of 8 separately decoded copies of the poll (equal rows, distinct
objects, as successive polls are), the same copy to both sides. For scale, three references:

- ``ref: python tuple compare``: a plain Python "is this the poll I have?" (a sorted list of
  ``(start, end, owner)`` per row, compared with the previous one);
- ``ref: json.loads(payload)``: decoding the poll's JSON text, which a driver does before either
  library sees the rows;
- ``ref: payload == previous payload``: comparing the raw JSON text with the last poll's.

Goal: shardline >= 50x faster than picopyn at 256 ranges.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("pytest_benchmark")
pytest.importorskip("picopyn")

from picopyn.utils.topology import apply_bucket_rows

from .benchkit import TIER, cluster, picopyn_topology, shardline_topology

MAPS = [(3000, 256), (30_000, 1024)]
IMPLS = [
    "shardline apply_bucket_snapshot",
    "picopyn apply_bucket_rows",
    "shardline apply_bucket_snapshot(JSON text)",
    "picopyn apply_bucket_rows(JSON text)",
    "ref: python tuple compare",
    "ref: json.loads(payload)",
    "ref: payload == previous payload",
]
COPIES = 8


def python_compare(rows: list[dict[str, Any]], known: list[tuple[int, int, str]]) -> bool:
    polled = sorted(
        (row["bucket_id_start"], row["bucket_id_end"], row["current_replicaset_uuid"])
        for row in rows
    )
    return polled != known


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("bucket_count", "n_ranges"), MAPS)
def test_unchanged_poll(
    benchmark: Any, per_call: Callable[..., Any], bucket_count: int, n_ranges: int, impl: str
) -> None:
    c = cluster(bucket_count, n_ranges)
    ours = shardline_topology(c)
    peer = picopyn_topology(c)
    polls = itertools.cycle(c.decoded_polls(COPIES))
    payloads = itertools.cycle([(c.payload + " ")[:-1] for _ in range(COPIES)])  # distinct str
    previous = c.payload
    epoch = ours.epoch(TIER)
    peer_before = dict(peer.buckets)
    known = sorted(ours.ranges(TIER))
    assert not python_compare(c.rows, known)

    run: Callable[[], Any] = {
        "shardline apply_bucket_snapshot": lambda: ours.apply_bucket_snapshot(TIER, next(polls)),
        "picopyn apply_bucket_rows": lambda: apply_bucket_rows(peer, TIER, next(polls)),
        "shardline apply_bucket_snapshot(JSON text)": lambda: ours.apply_bucket_snapshot(
            TIER, next(payloads)
        ),
        "picopyn apply_bucket_rows(JSON text)": lambda: apply_bucket_rows(
            peer, TIER, next(payloads)
        ),
        "ref: python tuple compare": lambda: python_compare(next(polls), known),
        "ref: json.loads(payload)": lambda: json.loads(next(payloads)),
        "ref: payload == previous payload": lambda: next(payloads) != previous,
    }[impl]

    benchmark.group = f"unchanged poll {c.label}"
    last = per_call(run, 1, rounds=300, warmup=20, impl=impl, scenario="snapshot", map=c.label)

    # nothing moved, on either side, and both still route every bucket as the poll says
    if impl.startswith(("shardline", "ref: p")):
        assert last is False
    elif impl.startswith("ref: json"):
        assert last == c.rows
    assert ours.epoch(TIER) == epoch
    assert peer.buckets == peer_before
    for b in range(1, bucket_count + 1, 7):
        owner = c.owner_of[b]
        assert ours.owner(TIER, b) == owner
        assert peer.find_bucket_master(TIER, b).uuid == c.masters[owner]
