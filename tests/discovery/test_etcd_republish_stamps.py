"""An etcd publisher whose lease expired puts its records again with a new publish time: a
re-put is a publish, so the discovery lag it shows starts from it, not from the first one."""

from __future__ import annotations

import asyncio
import time
import uuid

from aetcd import rpc

from shardline import WorkerMetadata
from shardline.discovery import DiscoveryEvent
from shardline.discovery.etcd import EtcdDiscovery
from support.etcd_server import EtcdServer


def worker(n: int) -> WorkerMetadata:
    return WorkerMetadata(
        uid=uuid.UUID(int=n), address=f"127.0.0.1:{6000 + n}", pid=200 + n, version="1.0"
    )


async def next_event(subscription: object) -> DiscoveryEvent:
    event = await asyncio.wait_for(anext(subscription), 30)  # type: ignore[call-overload]
    assert isinstance(event, DiscoveryEvent)
    return event


async def test_records_put_again_after_the_lease_expired_carry_a_new_publish_time(
    etcd: EtcdServer,
) -> None:
    namespace = f"republish-{uuid.uuid4().hex[:8]}"
    key = f"/shardline/{namespace}/workers/{worker(1).uid}".encode()

    async def scenario() -> tuple[float, float, float]:
        publisher = EtcdDiscovery([etcd.endpoint], namespace, ttl=5)
        subscriber = EtcdDiscovery([etcd.endpoint], namespace)
        try:
            subscription = subscriber.subscribe()
            await publisher.publisher.publish("worker-added", worker(1))
            added = await next_event(subscription)
            assert added.type == "worker-added"
            assert added.metadata.published is not None
            # the lease ends as an expiry ends it: etcd deletes its keys
            (stored,) = etcd._call("KVStub", "Range", rpc.RangeRequest(key=key)).kvs
            expired_at = time.time()
            etcd._call("LeaseStub", "LeaseRevoke", rpc.LeaseRevokeRequest(ID=stored.lease))
            assert (await next_event(subscription)).type == "worker-dropped"
            # the next publish finds the lease gone, takes a new one and puts worker 1 again
            await publisher.publisher.publish("worker-added", worker(2))
            again = {}
            while len(again) < 2:
                event = await next_event(subscription)
                again[event.metadata.uid] = event
            republished = again[worker(1).uid]
            assert republished.type == "worker-added"
            assert republished.metadata == worker(1)
            assert republished.metadata.published is not None
            return added.metadata.published, expired_at, republished.metadata.published
        finally:
            await publisher.aclose()
            await subscriber.aclose()

    first, expired_at, republished = await scenario()
    assert first <= expired_at <= republished
