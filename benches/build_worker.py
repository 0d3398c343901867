"""One build's side of ``bench_builds.py``: times blocks of hot-path calls when asked, over stdio.

    python -m benches.build_worker        (from the repository root, in a venv holding one build)

Each request is one line on stdin, each answer one line of JSON on stdout:

- ``check``: the extension's file name and what every probe gives, for the driver to compare
  between the two builds before anything is timed;
- ``time PATH`` (``owner``, ``route``, ``route_many``, ``dispatch``): the nanoseconds one block
  of that path took, timed here, so the pipe is never in a measurement. A block is
  ``CALLS_PER_ROUND`` calls, or for ``route_many`` one call on ``ROUTE_MANY_KEYS`` keys.

The workload is ``bench_lookup.py``'s and ``bench_hashing.py``'s (3,000 buckets in 256 ranges,
the seeded probes and str keys of ``benchkit``), ``bench_route_many.py``'s int64 array of
100,000 int keys, and ``bench_pool.py``'s proxy dispatch overhead (8 workers, a connection that
returns at once). It uses only what both builds have, so any two commits compare.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import shardline
from shardline import WorkerProxy

from .benchkit import (
    CALLS_PER_ROUND,
    TIER,
    blocks,
    cluster,
    int_keys,
    probe_buckets,
    shardline_topology,
    str_keys,
)
from .instant_workers import Immediate, announced

WORKERS = 8
ROUTE_MANY_KEYS = 100_000
# What one timed block of each path does: calls, or for route_many keys of its one call.
BLOCK = {
    "owner": CALLS_PER_ROUND,
    "route": CALLS_PER_ROUND,
    "route_many": ROUTE_MANY_KEYS,
    "dispatch": CALLS_PER_ROUND,
}


class Paths:
    """The hot paths over one build, each walking its own cycle of probe blocks."""

    def __init__(self) -> None:
        c = cluster(3000, 256)
        self.topology = shardline_topology(c)
        self.buckets = probe_buckets(c.bucket_count)
        self.keys = str_keys()
        self.array = np.array(int_keys(ROUTE_MANY_KEYS), dtype=np.int64)
        self.loop = asyncio.new_event_loop()
        self.proxy = WorkerProxy(
            discovery=announced(WORKERS), connect=lambda _: Immediate(), quorum=WORKERS
        )
        self.loop.run_until_complete(self.proxy.start())
        owner, route, route_many = (
            self.topology.owner,
            self.topology.route,
            self.topology.route_many,
        )
        bucket_blocks, key_blocks = blocks(self.buckets), blocks(self.keys)
        dispatch = self.proxy.dispatch
        array = self.array

        def owners() -> None:
            for bucket in next(bucket_blocks):
                owner(TIER, bucket)

        def routes() -> None:
            for key in next(key_blocks):
                route(TIER, key)

        async def dispatches() -> None:
            for task in range(CALLS_PER_ROUND):
                await dispatch(task)

        self.timed: dict[str, Callable[[], Any]] = {
            "owner": owners,
            "route": routes,
            # the list of 100,000 routes is returned and so released outside the timed region
            "route_many": lambda: route_many(TIER, array),
            "dispatch": lambda: self.loop.run_until_complete(dispatches()),
        }

    def check(self) -> dict[str, Any]:
        routed = [self.topology.route(TIER, key) for key in self.keys]
        many = self.topology.route_many(TIER, self.array)
        digest = hashlib.sha256("\n".join(str(i and i.uuid) for i in many).encode()).hexdigest()

        async def concurrently() -> list[Any]:
            return await asyncio.gather(*(self.proxy.dispatch(task) for task in range(WORKERS * 4)))

        dispatched = self.loop.run_until_complete(concurrently())
        return {
            "extension": Path(shardline._core.__file__).name,
            "owner": [self.topology.owner(TIER, bucket) for bucket in self.buckets],
            "route": [None if i is None else i.uuid for i in routed],
            "route_many": digest,
            "dispatch": dispatched,
        }

    def close(self) -> None:
        self.loop.run_until_complete(self.proxy.stop())
        self.loop.close()

    def time(self, path: str) -> int:
        run = self.timed[path]
        start = time.perf_counter_ns()
        result = run()
        elapsed = time.perf_counter_ns() - start
        del result
        return elapsed


def main() -> None:
    paths = Paths()
    for line in sys.stdin:
        request = line.split()
        answer = paths.check() if request == ["check"] else paths.time(request[1])
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
    paths.close()


if __name__ == "__main__":
    main()
