"""Memory of a 100,000-worker pool, shardline against wool 0.15.7: the RSS growth of adding the
workers to each pool (the records and connections themselves are made first, shared by both).

Run: ``python benches/pool_memory.py`` in a venv with the ``bench`` extra.
"""

from __future__ import annotations

import gc
import os
import uuid

from wool.runtime.loadbalancer.base import LoadBalancerContext as WoolContext

from shardline import LoadBalancerContext, WorkerMetadata

WORKERS = 100_000


def rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def growth(pool: object, records: list[WorkerMetadata], connections: list[str]) -> int:
    gc.collect()
    before = rss()
    for record, connection in zip(records, connections, strict=True):
        pool.add_worker(record, connection)  # type: ignore[attr-defined]
    gc.collect()
    return rss() - before


def main() -> None:
    records = [
        WorkerMetadata(uid=uuid.uuid4(), address=f"127.0.0.1:{n % 60000}", pid=n, version="1")
        for n in range(WORKERS)
    ]
    connections = [f"conn-{n}" for n in range(WORKERS)]
    for name, pool in (("shardline", LoadBalancerContext()), ("wool", WoolContext())):
        grown = growth(pool, records, connections)
        mib, each = grown / 2**20, grown / WORKERS
        print(f"{name}: {mib:.1f} MiB for {WORKERS:,} workers, {each:.0f} B each")


if __name__ == "__main__":
    main()
