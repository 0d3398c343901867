"""NotificationSource against a real PostgreSQL standing in for a cluster that pushes Picodata's
topology notifications in the ADR's format (``LISTEN``/``NOTIFY``; the design is in
tests/support/notify_cluster.py, the documents in tests/support/notify_documents.py).

The seed's three cases as notification streams with ``find_bucket_master`` checked after each
step; redelivered, out-of-order and malformed documents; the snapshot/stream boundary; a killed
connection and a restarted server; any delivery order against in-order application
(Hypothesis); the document format on its own.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardline import BucketEvent, InstanceEvent, ReplicasetEvent, TierWithoutBuckets, Topology
from shardline.topology.sources.changes import TopologySnapshot, apply_change
from shardline.topology.sources.notification import NotificationSource
from shardline.topology.sources.notification_documents import (
    DocumentError,
    RaftPosition,
    parse_event_document,
    parse_snapshot,
)
from shardline.topology.sources.notification_transport import TransportError
from shardline.topology.sources.pg_notify import PgNotifySession, PgNotifyTransport
from shardline.topology.sources.state import FailureReason
from support.fakes import Session, Transport
from support.notify_cluster import (
    NotifyCluster,
    caught_up,
    expected_masters,
    install,
    masters,
    running,
    view,
)
from support.notify_documents import Event, event_document, raw, snapshot_documents
from support.pg_server import PgServer
from support.replicasets import I, R, add, buckets
from support.strategies import TIERS, valid_events
from support.waiting import until

DSN = "postgresql://u:secret@x:5432/db"


@pytest.fixture(scope="module")
def notify_dsn(pg: PgServer) -> str:
    """One database for the module; each test publishes on a channel of its own."""
    dsn = pg.create_database()
    install(dsn)
    return dsn


@pytest.fixture
def cluster(notify_dsn: str) -> Iterator[NotifyCluster]:
    with NotifyCluster(notify_dsn) as cluster:
        yield cluster


def served(*ranges: tuple[int, int, int]) -> list[str | None]:
    """What find_bucket_master should answer for every bucket: In for start..end, else None."""
    return expected_masters(3000, [(start, end, I[n]) for start, end, n in ranges])


# the seed's three cases


SEED_CASES = {
    "expel R2": (
        [*add(1), *add(2), *add(3), *buckets((1, 1000, 1), (1001, 2000, 2), (2001, 3000, 3))],
        [
            # replicaset event: R2 deleted -> the tier's map is cleared
            ([ReplicasetEvent("delete", R[2])], []),
            ([InstanceEvent("delete", I[2])], []),
            (buckets((1, 1500, 1)), [(1, 1500, 1)]),
            (buckets((1501, 3000, 3)), [(1, 1500, 1), (1501, 3000, 3)]),
        ],
    ),
    "add R3": (
        [*add(1), *add(2), *buckets((1, 1500, 1), (1501, 3000, 2))],
        [
            # replicaset event: R3 new in the tier -> cleared until its bucket events
            (add(3)[:1], []),
            (add(3)[1:], []),
            (buckets((1, 1000, 1)), [(1, 1000, 1)]),
            (buckets((1001, 2000, 2)), [(1, 1000, 1), (1001, 2000, 2)]),
            (buckets((2001, 3000, 3)), [(1, 1000, 1), (1001, 2000, 2), (2001, 3000, 3)]),
        ],
    ),
    "change weights": (
        [*add(1), *add(2), *add(3), *buckets((1, 1000, 1), (1001, 2000, 2), (2001, 3000, 3))],
        [
            # no replicaset event; R1 1-750 overlaps R1 1-1000 -> cleared, then applied
            (buckets((1, 750, 1)), [(1, 750, 1)]),
            (buckets((751, 1500, 2)), [(1, 750, 1), (751, 1500, 2)]),
            (buckets((1501, 3000, 3)), [(1, 750, 1), (751, 1500, 2), (1501, 3000, 3)]),
        ],
    ),
}


@pytest.mark.parametrize("case", SEED_CASES, ids=list(SEED_CASES))
async def test_seed_cases_as_notification_streams(cluster: NotifyCluster, case: str) -> None:
    initial, steps = SEED_CASES[case]
    cluster.publish(*initial)

    topology = Topology()
    source = cluster.source()
    async with running(source, topology):
        await caught_up(source, cluster.position)
        assert view(topology) == view(cluster.reference)
        before = [(s, e, int(o[-1])) for s, e, o in cluster.reference.ranges("default")]
        assert masters(topology) == served(*before)
        for events, answers in steps:
            cluster.publish(*events)
            await caught_up(source, cluster.position)
            assert masters(topology) == served(*answers), events
            assert view(topology) == view(cluster.reference)
        deliveries = source.deliveries
        assert deliveries.handed_out == sum(len(events) for events, _ in steps)
        assert (deliveries.duplicates, deliveries.stale, deliveries.skipped) == (0, 0, 0)
        state = source.state
        assert state.connects == state.refreshes == 1
        assert not state.failures


# ordering by raft position


async def test_redelivered_documents_are_ignored(cluster: NotifyCluster) -> None:
    cluster.publish(*add(1), *buckets((1, 3000, 1)))

    topology = Topology()
    source = cluster.source()
    async with running(source, topology):
        await caught_up(source, cluster.position)
        covered = cluster.publish(*add(2), notify=False)  # before the next snapshot
        assert await source.refresh()
        documents = cluster.publish(*buckets((1, 1500, 1), (1501, 3000, 2)))
        await caught_up(source, cluster.position)
        epoch = topology.epoch("default")
        applied = source.state.events_applied
        # each copy in a transaction of its own, so PostgreSQL delivers every one
        cluster.notify(*documents, documents[0], *covered, documents[1])
        cluster.publish(InstanceEvent("replace", I[1], current_state="Offline"))
        await caught_up(source, cluster.position)
        assert topology.epoch("default") == epoch
        assert source.state.events_applied == applied + 1
        assert source.deliveries.duplicates == 6
        assert source.deliveries.handed_out == 3
        assert view(topology) == view(cluster.reference)


async def test_an_older_document_is_ignored_and_the_snapshot_read_again(
    cluster: NotifyCluster,
) -> None:
    cluster.publish(*add(1), *add(2), *buckets((1, 3000, 1)))

    topology = Topology()
    # no automatic re-read for a minute: the late document's effect is visibly missing
    source = cluster.source(min_resync_interval=60.0)
    async with running(source, topology):
        await caught_up(source, cluster.position)
        readdressed, moved = cluster.publish(
            InstanceEvent("replace", I[2], address="h2:2"),
            *buckets((1, 1500, 1)),
            notify=False,
        )
        cluster.notify(moved, readdressed)  # raft order: readdressed, then moved
        await until(lambda: source.deliveries.stale == 1, what="the late document")
        assert topology.instances[I[2]].address == "h2:1"  # the older event was not applied
        assert topology.ranges("default") == [(1, 1500, R[1])]
        assert source.deliveries.snapshots == 1
        assert await source.refresh()
        assert view(topology) == view(cluster.reference)
        assert topology.instances[I[2]].address == "h2:2"

    # with the default behaviour the re-read follows at once
    topology = Topology()
    source = cluster.source()
    async with running(source, topology):
        await caught_up(source, cluster.position)
        first, second = cluster.publish(*buckets((1, 1000, 1), (1001, 3000, 2)), notify=False)
        cluster.notify(second, first)
        await until(lambda: source.deliveries.snapshots == 2, what="the re-read")
        await until(lambda: view(topology) == view(cluster.reference), what="convergence")
        assert source.deliveries.stale == 1


async def test_several_documents_of_one_raft_entry_and_a_new_term(cluster: NotifyCluster) -> None:

    topology = Topology()
    source = cluster.source()
    async with running(source, topology):
        # an empty cluster: its burst is empty, at no position
        await until(lambda: source.deliveries.snapshots == 1, what="the snapshot")
        one_entry = cluster.publish(
            *add(1), *add(2), *buckets((1, 1500, 1), (1501, 3000, 2)), same_entry=True
        )
        await caught_up(source, cluster.position)
        assert source.deliveries.handed_out == 6
        assert view(topology) == view(cluster.reference)
        cluster.new_term()
        cluster.publish(ReplicasetEvent("replace", R[1], current_master_uuid=I[2]))
        cluster.notify(*one_entry)  # an older term: all redeliveries
        cluster.publish(ReplicasetEvent("replace", R[1], current_master_uuid=I[1]))
        await caught_up(source, cluster.position)
        assert source.position == RaftPosition(2, 3)
        assert source.deliveries.duplicates == 6
        assert source.deliveries.stale == 0
        assert view(topology) == view(cluster.reference)


@pytest.mark.parametrize(
    ("function", "in_snapshot"),
    [("shardline_topology_snapshot_after", True), ("shardline_topology_snapshot_then", False)],
)
async def test_nothing_is_lost_or_doubled_between_listen_and_snapshot(
    cluster: NotifyCluster, function: str, in_snapshot: bool
) -> None:
    """Changes committed while the snapshot is being read: if the snapshot holds them their
    notifications are dropped, if not they are applied — either way each counts once.

    When the snapshot holds them, the source reaches their position with the snapshot alone, so
    that says nothing about their notifications: the test holds those back until then (the
    worst order) and waits for all four to be received before counting them."""
    cluster.publish(*add(1), *buckets((1, 3000, 1)))
    name = f"boundary-{cluster.channel}"

    topology = Topology()
    delivered = asyncio.Event()
    if not in_snapshot:
        delivered.set()  # reaching the position takes the notifications themselves
    source = NotificationSource(
        transport=_HeldBack(
            PgNotifyTransport(
                cluster.dsn,
                channel=cluster.channel,
                snapshot_query=f"SELECT {function}('{cluster.channel}', {cluster.lock})",
                tiers_query=cluster.tiers_query,
                connect_kwargs={"server_settings": {"application_name": name}},
            ),
            delivered,
        ),
        retry=0.02,
        max_retry=0.2,
        min_resync_interval=0.0,
    )
    with cluster.holding():
        async with running(source, topology):
            # LISTEN is in force: the snapshot query waits for the lock
            await until(lambda: cluster.waiting_sessions(name) == 1, what="the snapshot")
            cluster.publish(*add(2), *buckets((1, 1500, 1), (1501, 3000, 2)))
            cluster.release()
            await caught_up(source, cluster.position)
            assert view(topology) == view(cluster.reference)
            if in_snapshot:
                assert source.deliveries.received == 0
                delivered.set()
            await until(lambda: source.deliveries.received == 4, what="the notifications")
            assert view(topology) == view(cluster.reference)
            deliveries = source.deliveries
            if in_snapshot:
                assert (deliveries.duplicates, deliveries.handed_out) == (4, 0)
            else:
                assert (deliveries.duplicates, deliveries.handed_out) == (0, 4)
            assert deliveries.snapshots == 1


class _HeldBack:
    """A transport whose sessions pass their documents on only once ``delivered`` is set."""

    def __init__(self, transport: PgNotifyTransport, delivered: asyncio.Event) -> None:
        self._transport = transport
        self._delivered = delivered
        self.name = transport.name

    async def connect(self) -> _HeldBackSession:
        return _HeldBackSession(await self._transport.connect(), self._delivered)


class _HeldBackSession:
    def __init__(self, session: PgNotifySession, delivered: asyncio.Event) -> None:
        self._session = session
        self._delivered = delivered
        self.server = session.server
        self.tiers = session.tiers
        self.snapshot = session.snapshot

    async def documents(self) -> AsyncIterator[str | bytes]:
        await self._delivered.wait()
        async for document in self._session.documents():
            yield document

    async def aclose(self) -> None:
        await self._session.aclose()


# malformed documents


def _bucket(start: Any, end: Any, tier: str = "default", **fields: Any) -> dict[str, Any]:
    """The fields of an ADR bucket document (its "map" included)."""
    return {
        "map": "bucket",
        "tier": tier,
        "bucket_id": {"start": start, "end": end},
        "current_replicaset_uuid": R[1],
        **fields,
    }


async def test_malformed_documents_are_skipped_counted_and_the_stream_goes_on(
    cluster: NotifyCluster,
) -> None:
    cluster.publish(*add(1), *buckets((1, 3000, 1)))
    t, i = cluster.position
    good = {"map": "replicaset", "replicaset_uuid": R[1]}
    bad = {
        "not JSON": "{oops",
        "not an object": "[1, 2]",
        "no raft": json.dumps({"op": "replace", **good}),
        "negative index": raw(t, -1, op="replace", **good),
        "bool term": json.dumps({"op": "replace", **good, "raft": {"term": True, "index": 1}}),
        "unknown op": raw(t, i + 1, op="upsert", **good),
        "no map": raw(t, i + 1, op="replace", replicaset_uuid=R[1]),
        "map an object (shardline's old format)": raw(
            t, i + 1, op="replace", map={"replicaset_uuid": R[1]}
        ),
        "bad uuid": raw(t, i + 1, op="replace", map="replicaset", replicaset_uuid="r1"),
        "start > end": raw(t, i + 1, op="replace", **_bucket(9, 3)),
        "bad timestamp": raw(t, i + 1, op="replace", **good, timestamp=[1]),
        "empty state": raw(
            t, i + 1, op="replace", map="instance", instance_uuid=I[1], current_state=""
        ),
    }
    beyond = raw(t, i + 1, op="replace", **_bucket(1, 3001))
    unknown_tier = raw(t, i + 1, op="replace", **_bucket(1, 10, tier="elsewhere"))
    oversized = raw(t, i + 1, op="replace", **good, padding="x" * 1500)
    # a map shardline does not follow: the ADR lets event types be added
    other_map = raw(t, i + 1, op="replace", map="plugin", name="p")

    topology = Topology()
    source = cluster.source(max_document=1200)
    async with running(source, topology):
        await caught_up(source, cluster.position)
        cluster.notify(*bad.values(), beyond, unknown_tier, oversized, other_map)
        cluster.publish(*buckets((1, 2000, 1)))
        await caught_up(source, cluster.position)
        assert topology.ranges("default") == [(1, 2000, R[1])]
        state = source.state
        assert dict(state.failures) == {
            "malformed-row": len(bad),
            "malformed-buckets": 1,
            "unknown-tier": 1,
            "too-large": 1,
        }
        assert state.connects == 1  # the stream never stopped
        assert source.deliveries.skipped == len(bad) + 3
        assert source.deliveries.ignored == 1
        assert source.deliveries.handed_out == 1


async def test_a_document_the_topology_refuses_is_rejected_and_the_snapshot_read_again(
    cluster: NotifyCluster,
) -> None:
    cluster.publish(*add(1), *buckets((1, 3000, 1)))

    topology = Topology()
    source = cluster.source()
    async with running(source, topology):
        await caught_up(source, cluster.position)
        t, i = cluster.position
        # well formed, but a replicaset the topology does not know needs its tier
        cluster.notify(raw(t, i + 1, op="replace", map="replicaset", replicaset_uuid=R[7]))
        await until(lambda: source.deliveries.snapshots == 2, what="the re-read")
        assert source.state.failures == {"rejected": 1}
        assert view(topology) == view(cluster.reference)


async def test_an_unusable_snapshot_is_counted_and_retried(cluster: NotifyCluster) -> None:
    cluster.publish(*add(1), *buckets((1, 3000, 1)))
    good = cluster.snapshot()
    t, i = cluster.position
    overlapping = [*good, event_document(BucketEvent("default", 10, 20, R[1]), t, i)]

    def store(documents: list[str]) -> None:
        cluster.connection.execute(
            "UPDATE shardline_topology_state SET documents = %s WHERE channel = %s",
            (documents, cluster.channel),
        )

    topology = Topology()
    store([*good[:1], "{not json", *good[1:]])
    source = cluster.source()
    async with running(source, topology):
        await until(lambda: source.state.failures.get("malformed-row", 0) >= 2)
        store(overlapping)
        await until(lambda: source.state.failures.get("malformed-buckets", 0) >= 2)
        assert source.deliveries.snapshots == 0
        assert not topology.replicasets
        store(good)
        await caught_up(source, cluster.position)
        assert view(topology) == view(cluster.reference)

    # a snapshot query of the wrong shape, or one that fails, is a query error
    for query in ("SELECT 1, 2", "SELECT no_such_function()"):
        wrong = cluster.source(snapshot_query=query)
        async with running(wrong, Topology()):
            await until(lambda s=wrong: s.state.failures.get("query-error", 0) >= 2)
    # so is a tiers query that fails; one of the wrong shape is a malformed row
    source = cluster.source(tiers_query="SELECT * FROM _pico_tier")
    async with running(source, Topology()):
        await until(lambda: source.state.failures.get("query-error", 0) >= 2)
    source = cluster.source(tiers_query="SELECT 'default', 'many'")
    async with running(source, Topology()):
        await until(lambda: source.state.failures.get("malformed-row", 0) >= 2)


# connections


async def test_a_killed_connection_rebuilds_from_the_new_snapshot(
    pg: PgServer, cluster: NotifyCluster
) -> None:
    cluster.publish(*add(1), *add(2), *buckets((1, 1500, 1), (1501, 3000, 2)))
    cluster.publish(InstanceEvent("replace", I[9], replicaset_uuid=R[2], current_state="Online"))
    name = f"killed-{cluster.channel}"
    database = cluster.connection.info.dbname

    topology = Topology()
    # something the cluster never said: gone after the first snapshot
    topology.apply_tiers({"default": 3000})
    topology.apply(ReplicasetEvent("replace", R[8], tier="default"))
    source = cluster.source(connect_kwargs={"server_settings": {"application_name": name}})
    async with running(source, topology):
        await caught_up(source, cluster.position)
        assert view(topology) == view(cluster.reference)
        epoch = topology.epoch("default")
        # changes whose notifications are lost: R2 expelled with its instances; R1
        # re-registered without a known master and given every bucket
        cluster.publish(
            ReplicasetEvent("delete", R[2]),
            InstanceEvent("delete", I[2]),
            InstanceEvent("delete", I[9]),
            ReplicasetEvent("delete", R[1]),
            ReplicasetEvent("replace", R[1], tier="default"),
            *buckets((1, 3000, 1)),
            notify=False,
        )
        assert await asyncio.to_thread(pg.terminate_backends, database, application_name=name)
        await caught_up(source, cluster.position)
        assert view(topology) == view(cluster.reference)
        # nothing stale survives: not R2, not I9, and not R1's old master
        assert set(topology.replicasets) == {R[1]}
        assert set(topology.instances) == {I[1]}
        assert topology.replicasets[R[1]].current_master_uuid is None
        assert masters(topology) == served()
        assert topology.epoch("default") > epoch
        state = source.state
        assert state.failures == {"connection-lost": 1}
        assert (state.connects, state.refreshes, state.connected) == (2, 2, True)


async def test_a_connection_killed_while_the_snapshot_is_read_is_connection_lost(
    pg: PgServer, cluster: NotifyCluster
) -> None:
    cluster.publish(*add(1), *buckets((1, 3000, 1)))
    name = f"killed-early-{cluster.channel}"
    database = cluster.connection.info.dbname

    topology = Topology()
    source = cluster.source(
        snapshot_query=f"SELECT shardline_topology_snapshot_after('{cluster.channel}',"
        f" {cluster.lock})",
        connect_kwargs={"server_settings": {"application_name": name}},
    )
    with cluster.holding():
        async with running(source, topology):
            await until(lambda: cluster.waiting_sessions(name) == 1, what="the snapshot")
            assert await asyncio.to_thread(pg.terminate_backends, database, application_name=name)
            await until(lambda: bool(source.state.failures), what="the failure")
            assert dict(source.state.failures) == {"connection-lost": 1}
            cluster.release()
            await caught_up(source, cluster.position)
            assert view(topology) == view(cluster.reference)


@pytest.mark.integration  # a server of its own
async def test_a_restarted_server_is_reconnected_and_the_view_rebuilt() -> None:
    server = PgServer()
    try:
        server.start()
        dsn = server.create_database()
        install(dsn)
        with NotifyCluster(dsn) as cluster:
            cluster.publish(*add(1), *add(2), *buckets((1, 1500, 1), (1501, 3000, 2)))

            async def scenario() -> None:
                topology = Topology()
                source = cluster.source()
                async with running(source, topology):
                    await caught_up(source, cluster.position)
                    cluster.publish(
                        ReplicasetEvent("delete", R[2]), *buckets((1, 3000, 1)), notify=False
                    )
                    expected = view(cluster.reference)
                    cluster.close()
                    await asyncio.to_thread(server.restart)
                    await until(lambda: source.deliveries.snapshots == 2, what="the reconnect")
                    assert view(topology) == expected
                    assert R[2] not in topology.replicasets
                    state = source.state
                    assert state.failures["connection-lost"] == 1
                    assert state.connected
                    assert state.connects == 2

            await scenario()
    finally:
        server.close()


async def test_refresh_trigger_and_close(cluster: NotifyCluster) -> None:
    cluster.publish(*add(1))

    source = cluster.source(min_resync_interval=0.3)
    with pytest.raises(RuntimeError, match="nothing runs"):
        await source.refresh()
    topology = Topology()
    async with running(source, topology):
        await caught_up(source, cluster.position)
        with pytest.raises(RuntimeError, match="already being iterated"):
            source.__aiter__()
        assert await source.refresh()
        assert source.deliveries.snapshots == 2
        loop = asyncio.get_running_loop()
        asked = loop.time()
        source.trigger()
        source.trigger()
        await until(lambda: source.deliveries.snapshots == 3, what="the triggered re-read")
        reread = loop.time()
        assert reread - asked >= 0.25  # not sooner than min_resync_interval
        # two triggers, one re-read: a second one, had the second trigger asked for it, would
        # be due min_resync_interval (0.3 s) after the first started, before reread + 0.3; the
        # sleep is the rate limit's window itself, and a little past it
        await asyncio.sleep(reread + 0.3 + 0.1 - loop.time())
        assert source.deliveries.snapshots == 3
    with pytest.raises(RuntimeError, match="closed"):
        source.__aiter__()

    # refresh() right after starting run(): the first connection answers it
    eager = cluster.source()
    async with running(eager, Topology()):
        assert await eager.refresh()
        assert eager.deliveries.snapshots == 1

    # closing while the snapshot is being read ends run() at once
    slow = cluster.source(
        snapshot_query=f"SELECT shardline_topology_snapshot_after('{cluster.channel}',"
        f" {cluster.lock})",
        connect_kwargs={"server_settings": {"application_name": f"slow-{cluster.channel}"}},
    )
    with cluster.holding():
        task = asyncio.create_task(slow.run(Topology()))
        await until(lambda: cluster.waiting_sessions(f"slow-{cluster.channel}") == 1)
        await slow.aclose()
        await asyncio.wait_for(task, 2)
    assert not slow.state.connected
    assert slow.state.attempts == 1
    assert not slow.state.failures


async def test_the_transport_bounds_its_queue(cluster: NotifyCluster) -> None:
    """More notifications waiting than max_queue end the session (too-large) rather than grow
    without bound (the source then reconnects and reads a new snapshot: nothing is lost). The
    snapshot is the burst of ADR documents, the tiers come from the tiers query."""
    cluster.publish(*add(1), *buckets((1, 3000, 1)))

    transport = PgNotifyTransport(
        cluster.dsn,
        channel=cluster.channel,
        snapshot_query=cluster.snapshot_query,
        tiers_query=cluster.tiers_query,
        max_queue=3,
    )
    session = await transport.connect()
    try:
        assert session.tiers == {"default": 3000}
        assert [parse_event_document(d).event for d in session.snapshot] == [
            *add(1),
            *buckets((1, 3000, 1)),
        ]
        documents = cluster.publish(
            *[InstanceEvent("replace", I[1], address=f"h:{n}") for n in range(6)]
        )
        waiting = session._queue  # what asyncpg has handed over, unread
        await until(lambda: waiting.qsize() == 4, what="the notifications")
        read = []

        async def drain() -> None:
            async for document in session.documents():
                read.append(document)

        with pytest.raises(TransportError, match="over 3 notifications waiting") as raised:
            await drain()
        assert raised.value.reason == FailureReason.TOO_LARGE
        assert read == documents[:3]
    finally:
        await session.aclose()


async def test_a_tier_without_buckets_is_followed_for_membership_only(notify_dsn: str) -> None:
    """An arbiter tier (bucket_count 0, Picodata 26.1): its replicasets and instances are
    followed, routing in it raises a clear error, and a bucket document about it is skipped."""
    with NotifyCluster(notify_dsn, tiers={"default": 3000, "arbiter": 0}) as cluster:
        cluster.publish(*add(1), *add(2, tier="arbiter"), *buckets((1, 3000, 1)))

        async def scenario() -> None:
            topology = Topology()
            source = cluster.source()
            async with running(source, topology):
                await caught_up(source, cluster.position)
                assert topology.tiers == {"default": 3000, "arbiter": 0}
                with pytest.raises(TierWithoutBuckets, match="'arbiter' has no buckets"):
                    topology.route("arbiter", 7)
                assert topology.replicasets[R[2]].tier == "arbiter"
                assert view(topology) == view(cluster.reference)
                t, i = cluster.position
                cluster.notify(raw(t, i + 1, op="replace", **_bucket(1, 10, tier="arbiter")))
                cluster.publish(InstanceEvent("replace", I[2], current_state="Offline"))
                await caught_up(source, cluster.position)
                assert dict(source.state.failures) == {"malformed-buckets": 1}
                assert view(topology) == view(cluster.reference)

        await scenario()


async def test_a_server_that_is_not_there_is_a_connect_failure(pg: PgServer) -> None:

    source = NotificationSource(
        pg.dsn_for("no_such_database"), retry=0.01, max_retry=0.02, timeout=2.0
    )
    async with running(source, Topology()):
        await until(lambda: source.state.failures.get("connect", 0) >= 3)
        assert source.position is None


# any delivery order converges to in-order application


@st.composite
def deliveries(draw: st.DrawFn) -> tuple[list[Event], list[int]]:
    """Events, and an order to deliver their documents in: each at least once, some twice,
    mostly in raft order with a few neighbours swapped."""
    events = draw(st.lists(valid_events, min_size=1, max_size=10))
    n = len(events)
    order = sorted([*range(n), *draw(st.lists(st.integers(0, n - 1), max_size=n))])
    for swap in draw(st.lists(st.integers(0, max(0, len(order) - 2)), max_size=3)):
        if swap + 1 < len(order):
            order[swap], order[swap + 1] = order[swap + 1], order[swap]
    return events, order


def _in_order(order: list[int]) -> bool:
    """True if no document is first delivered after a later one."""
    highest = -1
    seen: set[int] = set()
    for index in order:
        if index not in seen and index < highest:
            return False
        seen.add(index)
        highest = max(highest, index)
    return True


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(drawn=deliveries())
def test_any_delivery_order_converges_to_in_order_application(
    notify_dsn: str, drawn: tuple[list[Event], list[int]]
) -> None:
    events, order = drawn
    barrier = InstanceEvent("replace", I[9], current_state="Online")

    async def scenario(cluster: NotifyCluster) -> None:
        topology = Topology()
        source = cluster.source()
        async with running(source, topology):
            await until(lambda: source.deliveries.snapshots == 1, what="the snapshot")
            documents = cluster.publish(*events, notify=False)
            cluster.notify(*(documents[i] for i in order))
            cluster.publish(barrier)
            await caught_up(source, cluster.position)
            await until(lambda: view(topology) == view(cluster.reference), what="convergence")
            found = source.deliveries
            if _in_order(order):
                assert found.snapshots == 1
                assert found.handed_out == len(events) + 1
                assert found.duplicates == len(order) - len(events)
                assert found.stale == 0
            else:
                assert found.stale >= 1
                assert found.snapshots >= 2

    with NotifyCluster(notify_dsn, tiers=TIERS) as cluster:
        asyncio.run(scenario(cluster))


# the format, without a server


@settings(max_examples=50)
@given(event=valid_events, term=st.integers(0, 2**40), index=st.integers(0, 2**40))
def test_documents_decode_to_the_event_they_describe(event: Event, term: int, index: int) -> None:
    decoded = parse_event_document(event_document(event, term, index))
    assert decoded.position == RaftPosition(term, index)
    expected: Event = event
    # a delete names only its subject; the decoder drops the other fields
    if event.op == "delete" and isinstance(event, InstanceEvent):
        expected = InstanceEvent("delete", event.instance_uuid)
    elif event.op == "delete" and isinstance(event, ReplicasetEvent):
        expected = ReplicasetEvent("delete", event.replicaset_uuid)
    assert decoded.event == expected


def test_a_snapshot_burst_decodes_to_the_topology_it_describes() -> None:
    reference = Topology()
    reference.apply_tiers({"default": 3000, "empty": 10})
    for event in [*add(1), *add(2), *buckets((1001, 3000, 2), (1, 1000, 1))]:
        reference.apply(event)
    decoded = parse_snapshot(snapshot_documents(reference, 4, 2))
    assert decoded.position == RaftPosition(4, 2)
    assert [e.start for e in decoded.buckets["default"]] == [1, 1001]
    assert "empty" not in decoded.buckets
    rebuilt = Topology()
    rebuilt.apply_tiers(reference.tiers)
    for event in (*decoded.replicasets, *decoded.instances):
        rebuilt.apply(event)
    for tier, ranges in decoded.buckets.items():
        rebuilt.apply_bucket_snapshot(tier, ranges)
    assert view(rebuilt) == view(reference)


def test_a_burst_merges_documents_about_one_member_and_takes_its_highest_position() -> None:
    burst = [
        raw(3, 7, op="replace", map="replicaset", replicaset_uuid=R[1], tier="default"),
        raw(3, 9, op="replace", map="instance", instance_uuid=I[1], current_state="Online"),
        # the address from _pico_peer_address, in a document of its own
        raw(3, 8, op="replace", map="instance", instance_uuid=I[1], address="h1:1"),
        raw(3, 5, op="replace", map="replicaset", replicaset_uuid=R[1], current_master_uuid=I[1]),
        raw(3, 4, op="replace", **_bucket(1, 10)),
        raw(3, 4, op="replace", **_bucket(1, 10)),  # the same range twice is one
        raw(3, 4, op="replace", map="tier", name="default", bucket_count=3000),  # ignored
    ]
    decoded = parse_snapshot(burst)
    assert decoded.position == RaftPosition(3, 9)
    assert decoded.replicasets == (ReplicasetEvent("replace", R[1], "default", I[1]),)
    assert decoded.instances == (InstanceEvent("replace", I[1], None, "Online", "h1:1"),)
    assert decoded.buckets == {"default": (BucketEvent("default", 1, 10, R[1]),)}
    assert decoded.ignored == 1
    empty = parse_snapshot([])
    assert (empty.position, empty.replicasets, empty.buckets) == (RaftPosition(0, 0), (), {})


def test_uuids_come_out_canonical_and_unknown_fields_are_ignored() -> None:
    document = raw(
        1,
        2,
        op="replace",
        map="instance",
        instance_uuid=I[1].upper(),
        replicaset_uuid="{" + R[1] + "}",
        current_state="Online",
        address=None,
        future_field=[1, 2],
    )
    decoded = parse_event_document(document)
    assert decoded.event == InstanceEvent("replace", I[1], R[1], "Online", None)
    assert decoded.map == "instance"


def _rs(**fields: Any) -> str:
    return raw(1, 1, op="replace", map="replicaset", replicaset_uuid=R[1], **fields)


@pytest.mark.parametrize(
    ("document", "reason", "message"),
    [
        ('{"raft": {"term": 1, "index": 1}', "malformed-row", "not JSON"),
        ('{"raft": {"term": 1, "index": 1},, }', "malformed-row", "not JSON"),
        (_rs(tier="x" * 1025), "malformed-row", "over the limit"),
        (raw(1, 1, op="replace", **_bucket(0, 3)), "malformed-row", "bucket_id.start"),
        (raw(1, 1, op="replace", **_bucket(1, 3, current_replicaset_uuid=None)),
         "malformed-row", "current_replicaset_uuid"),
        (raw(1, 1, op="replace", **{**_bucket(1, 3), "bucket_id": [1, 3]}),
         "malformed-row", "'bucket_id' must be an object"),
        (raw(1, 1, op="replace", map="instance", instance_uuid="268a62a-8af6-4a3d-9f24-23e6c5f4"),
         "malformed-row", "'instance_uuid' must be a UUID string, got '268a62a-"),
        (raw(1, 1, op="replace", map={"replicaset_uuid": R[1]}), "malformed-row",
         "'map' must be a table name"),
        (raw(1, 1, op="replace", map=""), "malformed-row", "'map' must be a table name"),
        (raw(2**64, 1, op="replace", map="replicaset", replicaset_uuid=R[1]),
         "malformed-row", "raft.term"),
        ("[" * 5000 + "]" * 5000, "too-large", "over the limit"),
        (b"\xff\xfe", "malformed-row", "not JSON"),
        # a lone surrogate, escaped (any transport) or as it is (a str transport)
        (raw(1, 1, op="replace", map="instance", instance_uuid=I[1], address="\ud800"),
         "malformed-row", "'address' holds a lone surrogate"),
        (json.dumps({"op": "replace", "raft": {"term": 1, "index": 1}, "map": "replicaset",
                     "replicaset_uuid": R[1], "tier": "t\ud800"}, ensure_ascii=False),
         "malformed-row", "'tier' holds a lone surrogate"),
    ],
)  # fmt: skip
def test_malformed_event_documents_name_what_is_wrong(
    document: str | bytes, reason: str, message: str
) -> None:
    with pytest.raises(DocumentError, match=message) as raised:
        parse_event_document(document)
    assert raised.value.reason == FailureReason(reason)


@pytest.mark.parametrize(
    ("burst", "reason", "message"),
    [
        ([_rs(tier="default"), raw(1, 2, op="delete", map="replicaset", replicaset_uuid=R[2])],
         "malformed-row", "snapshot document 2 is a 'delete'"),
        ([_rs(tier="default"), "{"], "malformed-row", "snapshot document 2: document is not JSON"),
        ([raw(1, 1, op="replace", **_bucket(1, 10)), raw(1, 1, op="replace", **_bucket(5, 20))],
         "malformed-buckets", r"\[1, 10\] and \[5, 20\] of tier 'default' overlap"),
        ([_rs(tier="default")] * 40, "too-large", "over the limit of 1000 bytes at document"),
        ([_rs(tier="d" * 750)], "too-large", "snapshot document 1: document of"),
    ],
)  # fmt: skip
def test_malformed_snapshots_name_what_is_wrong(
    burst: list[str], reason: str, message: str
) -> None:
    with pytest.raises(DocumentError, match=message) as raised:
        parse_snapshot(burst, max_document=800, max_size=1000)
    assert raised.value.reason == FailureReason(reason)


def test_a_complete_snapshot_leaves_nothing_it_does_not_hold() -> None:
    topology = Topology()
    topology.apply(BucketEvent("loose", 1, 10, R[5]))  # mapped before the tiers were known
    topology.apply_tiers({"default": 3000})
    for event in [*add(1), *buckets((1, 3000, 1))]:
        topology.apply(event)
    topology.apply(BucketEvent("default", 1, 10, R[5]))  # ranges of a replicaset never known
    empty = TopologySnapshot(tiers={"default": 3000}, complete=True)
    assert apply_change(topology, empty) == 1  # one clear
    assert view(topology) == ({"default": 3000}, {}, {}, {})
    assert apply_change(topology, empty) == 0


# the transport is an adapter: any object with connect() will do


async def test_a_transport_of_ones_own_and_how_its_failures_count() -> None:
    reference = Topology()
    reference.apply_tiers({"default": 3000})
    for event in add(1):
        reference.apply(event)
    first = snapshot_documents(reference, 1, 2)
    moved = BucketEvent("default", 1, 3000, R[1])
    reference.apply(moved)
    second = snapshot_documents(reference, 1, 3)
    transport = Transport(
        [
            TransportError(FailureReason.CONNECT, "refused"),
            Session(first, [event_document(moved, 1, 3), "{"]),  # then the stream ends
            Session(second, [RuntimeError("a bug in the transport")]),
            Session(second, [], hold=True),
        ]
    )

    topology = Topology()
    source = NotificationSource(transport=transport, retry=0.01, max_retry=0.01)
    async with running(source, topology):
        await until(lambda: source.deliveries.snapshots == 3)
        assert view(topology) == view(reference)
        assert dict(source.state.failures) == {
            "connect": 1,
            "malformed-row": 1,
            "connection-lost": 2,  # the end of a stream, and the transport's bug
        }
        assert [session.closed for session in transport.opened] == [True, True, False]
    assert transport.opened[-1].closed


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "give a dsn or a transport"),
        ({"dsn": 5}, "dsn must be a str"),
        ({"dsn": "host=x port=5432"}, "must be a postgresql:// or postgres:// URI"),
        ({"dsn": "postgresql://x:port/db"}, "port that is not a number"),
        ({"dsn": "postgresql://x/db?a"}, "malformed query string"),
        ({"dsn": DSN, "channel": ""}, "channel"),
        ({"dsn": DSN, "channel": "é" * 40}, "channel"),
        ({"dsn": DSN, "snapshot_query": " "}, "snapshot_query"),
        ({"dsn": DSN, "tiers_query": ""}, "tiers_query"),
        ({"dsn": DSN, "ping_interval": 0}, "ping_interval"),
        ({"dsn": DSN, "connect_kwargs": {"timeout": 1}}, "must not set timeout"),
        ({"dsn": DSN, "connect_kwargs": {"application_name": "x"}}, "server_settings"),
        ({"dsn": DSN, "connect_kwargs": {"server_settings": {"a": 1}}}, "map str to str"),
        ({"dsn": DSN, "timeout": -1}, "timeout"),
        ({"dsn": DSN, "retry": float("nan")}, "retry"),
        ({"dsn": DSN, "retry": 1.0, "max_retry": 0.5}, "max_retry"),
        ({"dsn": DSN, "min_resync_interval": -0.1}, "min_resync_interval"),
        ({"dsn": DSN, "max_document": 0}, "max_document"),
        ({"dsn": DSN, "max_snapshot": True}, "max_snapshot"),
        ({"dsn": DSN, "max_queue": 1.5}, "max_queue"),
        ({"transport": Transport([]), "channel": "c"}, "channel configure"),
        ({"transport": Transport([]), "tiers_query": "q"}, "tiers_query configure"),
        ({"transport": Transport([]), "dsn": DSN}, "dsn configure"),
        ({"transport": object()}, "connect"),
    ],
)
def test_arguments_are_validated(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        NotificationSource(**kwargs)


async def test_read_durations_sum_the_time_the_attempts_took(cluster: NotifyCluster) -> None:
    cluster.publish(*add(1))

    loop = asyncio.get_running_loop()
    started = loop.time()
    source = cluster.source()
    async with running(source, Topology()):
        await caught_up(source, cluster.position)
        assert await source.refresh()
        state = source.state
        assert state.attempts == 2
        # two connects and snapshots, within the time the test waited for them
        assert 0 < state.read_durations.sum <= loop.time() - started
        assert state.read_durations.count == 2
