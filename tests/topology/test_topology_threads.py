"""Reads from many threads while events are applied: readers only ever see whole maps."""

from __future__ import annotations

import threading

from shardline import Topology
from support.replicasets import add_replicaset, rs_uuid

LAYOUTS = [
    [(1, 1000, 1), (1001, 2000, 2), (2001, 3000, 3)],
    [(1, 750, 1), (751, 1500, 2), (1501, 3000, 3)],
    [(1, 1500, 1), (1501, 3000, 3)],
]
VALID = {tuple((start, end, rs_uuid(n)) for start, end, n in layout) for layout in LAYOUTS}


def rows(layout: list[tuple[int, int, int]]) -> list[dict[str, object]]:
    return [
        {
            "bucket_id_start": start,
            "bucket_id_end": end,
            "current_replicaset_uuid": rs_uuid(n),
            "state": "active",
            "tier_name": "default",
        }
        for start, end, n in layout
    ]


def test_readers_never_observe_a_partial_snapshot(topology: Topology) -> None:
    for n in (1, 2, 3):
        add_replicaset(topology, n)
    topology.apply_bucket_snapshot("default", rows(LAYOUTS[0]))
    stop = threading.Event()
    seen: list[tuple[tuple[int, int, str], ...]] = []
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            while not stop.is_set():
                seen.append(tuple(topology.ranges("default")))
                owner = topology.owner("default", 1200)
                assert owner in (rs_uuid(1), rs_uuid(2))
                assert topology.find_bucket_master("default", 1200) is not None
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for thread in threads:
        thread.start()
    for i in range(3000):
        topology.apply_bucket_snapshot("default", rows(LAYOUTS[i % len(LAYOUTS)]))
    stop.set()
    for thread in threads:
        thread.join()
    assert not errors, errors[0]
    assert seen
    assert set(seen) <= VALID
    assert topology.epoch("default") == 3000
