"""One poisoned document or record between good ones, on every background stream: the stream
goes on, the good ones after the poison are applied, and the poison is counted with its reason
and logged (issue 10, section 2). Each stream runs against the real server its own tests use:
SQLite files for LocalDiscovery, etcd for EtcdDiscovery and EtcdRecordStore, PostgreSQL for
PollingSource and NotificationSource.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from pathlib import Path
from types import MappingProxyType
from typing import Any

import asyncpg
import pytest

from shardline import InstanceEvent, ReplicasetEvent, Topology
from shardline.discovery.etcd import EtcdDiscovery
from shardline.discovery.local import LocalDiscovery
from shardline.registration import Record
from shardline.registration.etcd_store import EtcdRecordStore
from shardline.topology.sources import PollingSource, TopologySnapshot
from shardline.topology.sources.notification import NotificationSource
from shardline.workers import WorkerMetadata
from support.discovery_contract import kinds, take
from support.etcd_helpers import with_store
from support.etcd_server import EtcdServer
from support.fakes import Session, Transport
from support.local_discovery import write_by_hand
from support.notify_cluster import NotifyCluster, install, running, view
from support.notify_documents import event_document, raw, snapshot_documents
from support.pg_server import PgServer
from support.picodata_catalog import Catalog, topology_state
from support.polling import run_polled, seed_tier, started
from support.queued_source import QueuedSource
from support.registration_contract import take as take_changes
from support.replicasets import I, R, add, buckets
from support.waiting import until
from support.workers import worker

DEEP = b"[" * 20_000 + b"]" * 20_000
"""Nested far past any decoder's recursion, yet well inside every size limit."""

LONE_SURROGATE = "\ud800"


def in_zone(metadata: WorkerMetadata) -> bool:
    """A filter that raises (KeyError) on a record without a zone."""
    return bool(metadata.extra["zone"] == "eu")


EU = MappingProxyType({"zone": "eu"})


def warnings_about(caplog: pytest.LogCaptureFixture, text: str) -> int:
    return sum(
        text in record.getMessage()
        for record in caplog.records
        if record.levelno >= logging.WARNING
    )


# discovery


async def test_local_discovery_skips_poisoned_records_and_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:

    discovery = LocalDiscovery("poisoned", directory=tmp_path)
    try:
        live = discovery.subscribe()
        zoned = discovery.subscribe(in_zone)
        await discovery.publisher.publish("worker-added", worker(1, extra=EU))
        for stream in (live, zoned):
            assert kinds(await take(stream, 1)) == [
                ("worker-added", worker(1).uid, worker(1).address)
            ]
        write_by_hand(
            discovery.path,
            [
                (worker(2).uid, DEEP),
                (
                    worker(3).uid,
                    json.dumps({"schema": True, "uid": str(worker(3).uid)}).encode(),
                ),
            ],
        )
        await discovery.publisher.publish("worker-added", worker(4))  # no zone: the filter raises
        await discovery.publisher.publish("worker-added", worker(5, extra=EU))
        assert kinds(await take(live, 2)) == [
            ("worker-added", worker(4).uid, worker(4).address),
            ("worker-added", worker(5).uid, worker(5).address),
        ]
        assert kinds(await take(zoned, 1)) == [("worker-added", worker(5).uid, worker(5).address)]
        assert live.skipped == {"malformed": 1, "unknown-schema": 1}
        assert zoned.skipped == {"malformed": 1, "unknown-schema": 1, "filter-error": 1}

        # a subscriber's first snapshot holds the poison too: the namespace is not dead
        late = discovery.subscribe()
        assert {event.metadata.uid for event in await take(late, 3)} == {
            worker(n).uid for n in (1, 4, 5)
        }
        assert late.skipped == {"malformed": 1, "unknown-schema": 1}
    finally:
        await discovery.aclose()
    # logged once per subscriber that met it, with the reason
    assert warnings_about(caplog, "nests deeper than") == 3
    assert warnings_about(caplog, "schema True") == 3
    assert warnings_about(caplog, "filter raised") == 1


async def test_etcd_discovery_skips_poisoned_records_and_goes_on(etcd: EtcdServer) -> None:
    namespace = f"poisoned-{uuid.uuid4().hex[:8]}"

    def key(n: int) -> bytes:
        return f"/shardline/{namespace}/workers/{worker(n).uid}".encode()

    discovery = EtcdDiscovery([etcd.endpoint], namespace)
    try:
        subscription = discovery.subscribe(in_zone)
        await discovery.publisher.publish("worker-added", worker(1, extra=EU))
        assert kinds(await take(subscription, 1)) == [
            ("worker-added", worker(1).uid, worker(1).address)
        ]
        etcd.put(key(2), DEEP)
        await discovery.publisher.publish("worker-added", worker(3))  # the filter raises
        await discovery.publisher.publish("worker-added", worker(4, extra=EU))
        assert kinds(await take(subscription, 1)) == [
            ("worker-added", worker(4).uid, worker(4).address)
        ]
        assert subscription.skipped == {"malformed": 1, "filter-error": 1}
    finally:
        await discovery.aclose()


async def test_an_etcd_record_store_watch_reports_a_poisoned_value_as_absent_and_goes_on(
    etcd: EtcdServer, caplog: pytest.LogCaptureFixture
) -> None:
    deep = DEEP[:2000] + DEEP[-2000:]  # inside the store's 4,096 bytes

    async def scenario(store: EtcdRecordStore) -> None:
        await store.report("app", True, "a", "h:1")
        watch = store.watch(["app"])
        assert await take_changes(watch, 1) == [("app", Record("a", True, "h:1"))]
        etcd.put(store.key("app"), deep)
        assert await take_changes(watch, 1) == [("app", None)]
        etcd.put(store.key("app"), b'{"schema": 1.0, "service": "app", "registered": false}')
        await store.report("app", True, "b", "h:2")
        # the second unreadable value leaves the service absent, as it already was: no change
        assert await take_changes(watch, 1) == [("app", Record("b", True, "h:2"))]
        assert store.skipped == {"malformed": 1, "unknown-schema": 1}

    await with_store(etcd, scenario)
    assert warnings_about(caplog, "nests deeper than") == 1


# topology sources


async def test_a_polling_source_counts_a_poisoned_row_or_map_and_goes_on(pg: PgServer) -> None:
    with Catalog(pg.create_schema()) as catalog:
        seed_tier(catalog, 2)

        async def scenario(topology: Topology, source: PollingSource) -> None:
            await started(source)
            assert await source.refresh()

            # a state whose JSON escape decodes to a lone surrogate: the topology refuses it
            catalog.set_raw("_pico_instance", "current_state", '["\\ud800", 1]', "name", "r1_1")
            assert not await source.refresh()
            assert dict(source.state.failures) == {"rejected": 1}
            catalog.set_state("r1_1", "Offline")
            assert await source.refresh()
            assert topology_state(topology) == catalog.expected()

            # a state nested as deep as its length allows
            catalog.set_raw("_pico_instance", "current_state", "[" * 1024, "name", "r2_1")
            assert not await source.refresh()
            assert source.state.failures["malformed-row"] == 1
            catalog.set_state("r2_1", "Offline")
            assert await source.refresh()
            assert topology_state(topology) == catalog.expected()

            # a bucket map whose tier name decodes to a lone surrogate: the map is kept
            rows = [
                {
                    "bucket_id_start": start,
                    "bucket_id_end": end,
                    "current_replicaset_uuid": owner,
                    "target_replicaset_uuid": owner,
                    "tier_name": LONE_SURROGATE,
                    "state": "active",
                }
                for start, end, owner in catalog.expected().maps["default"]
            ]
            catalog.serve_raw_buckets("default", json.dumps(rows))
            assert not await source.refresh()
            assert source.state.failures["malformed-buckets"] == 1
            assert topology_state(topology) == catalog.expected()
            catalog.heal_buckets("default")
            with catalog.transaction():
                catalog.set_weight("r1", 3)
                catalog.rebalance("default")
            assert await source.refresh()
            assert topology_state(topology) == catalog.expected()

            assert dict(source.state.failures) == {
                "rejected": 1,
                "malformed-row": 1,
                "malformed-buckets": 1,
            }
            assert source.state.connects == 1

        await run_polled(catalog.dsn, scenario)


class _Picky(asyncpg.Connection):  # type: ignore[misc]
    """A connection class of one's own (say, with a bug) that raises on one value it reads."""

    async def fetch(self, query: str, *args: object, **options: object) -> list[Any]:
        rows: list[Any] = await super().fetch(query, *args, **options)
        if any("poison" in tuple(row) for row in rows):
            raise RuntimeError("the connection cannot read 'poison'")
        return rows


async def test_a_polling_source_survives_a_value_that_raises_while_it_is_read(pg: PgServer) -> None:
    with Catalog(pg.create_schema()) as catalog:
        seed_tier(catalog, 2)

        async def scenario(topology: Topology, source: PollingSource) -> None:
            await started(source)
            assert await source.refresh()
            catalog.set_address("r1_1", "poison")
            assert not await source.refresh()
            assert dict(source.state.failures) == {"unexpected-error": 1}
            assert "the connection cannot read 'poison'" in (source.state.last_failure or "")
            catalog.set_address("r1_1", "127.0.0.1:7001")
            assert await source.refresh()
            assert topology_state(topology) == catalog.expected()
            assert source.state.connects == 2  # the poll that raised left its connection

        await run_polled(catalog.dsn, scenario, connect_kwargs={"connection_class": _Picky})


@pytest.fixture(scope="module")
def notify_dsn(pg: PgServer) -> str:
    dsn = pg.create_database()
    install(dsn)
    return dsn


async def test_a_notification_source_skips_a_poisoned_document_and_goes_on(notify_dsn: str) -> None:
    with NotifyCluster(notify_dsn) as cluster:
        cluster.publish(*add(1), *buckets((1, 3000, 1)))

        async def scenario() -> None:
            topology = Topology()
            source = cluster.source()
            async with running(source, topology):
                await until(lambda: view(topology) == view(cluster.reference), what="the snapshot")
                t, i = cluster.position
                cluster.notify(
                    raw(
                        t,
                        i + 1,
                        op="replace",
                        map="instance",
                        instance_uuid=I[1],
                        current_state=LONE_SURROGATE,
                    )
                )
                cluster.publish(InstanceEvent("replace", I[1], current_state="Offline"))
                await until(
                    lambda: view(topology) == view(cluster.reference), what="the good document"
                )
                assert dict(source.state.failures) == {"malformed-row": 1}
                deliveries = source.deliveries
                assert (deliveries.skipped, deliveries.handed_out) == (1, 1)
                assert source.state.connects == 1

        await scenario()


async def test_a_transport_that_raises_or_hands_over_a_lone_surrogate_never_ends_the_stream():
    reference = Topology()
    reference.apply_tiers({"default": 3000})
    for event in add(1):
        reference.apply(event)
    snapshot = snapshot_documents(reference, 1, 2)
    moved = buckets((1, 3000, 1))[0]
    reference.apply(moved)
    # a str transport may hand over what no UTF-8 payload can carry: a lone surrogate itself
    surrogate = raw(1, 3, op="replace", map="replicaset", replicaset_uuid=R[1], tier=LONE_SURROGATE)
    transport = Transport(
        [
            ValueError("a bug in the transport's connect()"),
            Session(
                snapshot,
                [
                    json.dumps(json.loads(surrogate), ensure_ascii=False),
                    event_document(moved, 1, 3),
                ],
                hold=True,
            ),
        ]
    )

    topology = Topology()
    source = NotificationSource(transport=transport, retry=0.01, max_retry=0.01)
    async with running(source, topology):
        await until(lambda: view(topology) == view(reference), what="the good document")
        assert dict(source.state.failures) == {"connect": 1, "malformed-row": 1}


async def test_run_counts_any_exception_a_change_raises_as_rejected_and_goes_on() -> None:
    first = ReplicasetEvent("replace", R[1], tier="default")
    # wrong types: a uuid that is an int makes applying the snapshot raise AttributeError
    broken = TopologySnapshot({"default": 3000}, (ReplicasetEvent("replace", 5, tier="default"),))
    last = ReplicasetEvent("replace", R[2], tier="default")
    source = QueuedSource(TopologySnapshot({"default": 3000}, (first,)), broken, last)

    async def scenario() -> Topology:
        topology = Topology()
        async with source:
            task = asyncio.create_task(source.run(topology))
            await until(lambda: R[2] in topology.replicasets, what="the change after the poison")
        await asyncio.wait_for(task, 5)
        return topology

    topology = await scenario()
    assert set(topology.replicasets) == {R[1], R[2]}
    assert dict(source.state.failures) == {"rejected": 1}
    assert source.resyncs == 1
    assert "AttributeError" in (source.state.last_failure or "")
