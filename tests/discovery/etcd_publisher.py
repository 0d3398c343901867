"""A worker process for the lease tests: publishes one record through EtcdDiscovery, says so on
stdout, then keeps its lease alive until it is killed.

    python etcd_publisher.py ENDPOINT NAMESPACE UID TTL
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid

from shardline.discovery.etcd import EtcdDiscovery
from shardline.workers import WorkerMetadata


async def main(endpoint: str, namespace: str, uid: str, ttl: int) -> None:
    discovery = EtcdDiscovery([endpoint], namespace, ttl=ttl)
    record = WorkerMetadata(
        uid=uuid.UUID(uid), address="127.0.0.1:1", pid=os.getpid(), version="1.0"
    )
    await discovery.publisher.publish("worker-added", record)
    print("published", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    endpoint, namespace, uid, ttl = sys.argv[1:]
    asyncio.run(main(endpoint, namespace, uid, int(ttl)))
