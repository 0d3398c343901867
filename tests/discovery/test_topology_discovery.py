"""TopologyDiscovery: a topology's online instances as discovery events, re-read on request, at
an interval, or after a source's events; membership against a small model (Hypothesis)."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardline import (
    BucketEvent,
    DiscoveryEvent,
    InstanceEvent,
    ReplicasetEvent,
    Topology,
    UnknownTier,
    WorkerMetadata,
    WorkerProxy,
)
from shardline.discovery.topology import TopologyDiscovery, instance_record
from shardline.topology.sources import (
    BucketSnapshot,
    PollingSource,
    TopologySnapshot,
)
from support.fakes import Source, drain
from support.queued_source import QueuedSource
from support.replicasets import (
    add_replica,
    add_replicaset,
    inst_uuid,
    replica_uuid,
    replicaset_events,
    rs_uuid,
)
from support.waiting import until

T = TypeVar("T")
WAIT = 10.0

pytestmark = pytest.mark.async_timeout(WAIT)  # each async test, start to finish


def changes(events: list[DiscoveryEvent]) -> list[tuple[str, str]]:
    return [(event.type, str(event.metadata.uid)) for event in events]


async def test_a_topology_is_read_at_once_and_its_online_instances_become_records(
    topology: Topology,
) -> None:
    add_replicaset(topology, 1)
    add_replicaset(topology, 2, tier="other")
    add_replica(topology, 1, 1)
    add_replica(topology, 1, 2, state="Offline")

    discovery = TopologyDiscovery(topology, interval=None)
    try:
        events = await drain(discovery)
        assert sorted(changes(events)) == sorted(
            [
                ("worker-added", inst_uuid(1)),
                ("worker-added", inst_uuid(2)),
                ("worker-added", replica_uuid(1, 1)),
            ]
        )
        record = discovery.records[uuid.UUID(inst_uuid(2))]
        assert record == WorkerMetadata(
            uid=uuid.UUID(inst_uuid(2)),
            address="127.0.0.1:3302",
            pid=0,
            version="",
            extra={"replicaset_uuid": rs_uuid(2), "tier": "other"},
        )
        assert discovery.replicas(rs_uuid(1)) == tuple(
            sorted([uuid.UUID(inst_uuid(1)), uuid.UUID(replica_uuid(1, 1))])
        )
        assert discovery.replicas(rs_uuid(9)) == ()
        assert discovery.topology is topology
    finally:
        await discovery.aclose()


async def test_membership_follows_the_online_state_the_address_and_deletion(
    topology: Topology,
) -> None:
    add_replicaset(topology, 1)
    i1 = inst_uuid(1)

    discovery = TopologyDiscovery(topology, interval=None)
    try:
        assert changes(await drain(discovery)) == [("worker-added", i1)]

        async def after(event: Any) -> list[tuple[str, str]]:
            topology.apply(event)
            discovery.refresh()
            return changes(await drain(discovery))

        assert await after(InstanceEvent("replace", i1, current_state="Offline")) == [
            ("worker-dropped", i1)
        ]
        assert await after(InstanceEvent("replace", i1, current_state="Expelled")) == []
        assert await after(InstanceEvent("replace", i1, current_state="Online")) == [
            ("worker-added", i1)
        ]
        moved = await after(InstanceEvent("replace", i1, address="127.0.0.1:9999"))
        assert moved == [("worker-updated", i1)]
        assert discovery.records[uuid.UUID(i1)].address == "127.0.0.1:9999"
        # a master switch, a bucket event and an unchanged re-read change no record
        switch = ReplicasetEvent("replace", rs_uuid(1), current_master_uuid=inst_uuid(7))
        assert await after(switch) == []
        assert await after(BucketEvent("default", 1, 3000, rs_uuid(1))) == []
        discovery.refresh()
        assert await drain(discovery) == []
        # the replicaset moves to another tier: the record says so
        assert await after(ReplicasetEvent("replace", rs_uuid(1), tier="other")) == [
            ("worker-updated", i1)
        ]
        assert discovery.records[uuid.UUID(i1)].extra["tier"] == "other"
        assert await after(InstanceEvent("delete", i1)) == [("worker-dropped", i1)]
        assert discovery.records == {}
        # online without an address is not a member; with one it is
        newcomer = inst_uuid(7)
        assert await after(InstanceEvent("replace", newcomer, current_state="Online")) == []
        assert await after(InstanceEvent("replace", newcomer, address="127.0.0.1:1")) == [
            ("worker-added", newcomer)
        ]
        assert discovery.records[uuid.UUID(newcomer)].extra == {
            "replicaset_uuid": None,
            "tier": None,
        }
    finally:
        await discovery.aclose()


async def test_an_interval_re_reads_without_being_asked(topology: Topology) -> None:
    add_replicaset(topology, 1)

    discovery = TopologyDiscovery(topology, interval=0.02)
    try:
        first = await asyncio.wait_for(anext(discovery), WAIT)
        assert first.type == "worker-added"
        add_replicaset(topology, 2)
        second = await asyncio.wait_for(anext(discovery), WAIT)
        assert (second.type, str(second.metadata.uid)) == ("worker-added", inst_uuid(2))
    finally:
        await discovery.aclose()


async def test_a_topology_followed_directly_is_checked_every_50_ms_by_default(
    topology: Topology,
) -> None:
    # a check is one counter read, so the default is the source path's; it was 1 s
    add_replicaset(topology, 1)
    discovery = TopologyDiscovery(topology)
    loop = asyncio.get_running_loop()
    try:
        await asyncio.wait_for(anext(discovery), WAIT)
        changed = loop.time()
        add_replicaset(topology, 2)
        second = await asyncio.wait_for(anext(discovery), WAIT)
        assert str(second.metadata.uid) == inst_uuid(2)
        assert loop.time() - changed < 0.75  # 0.05 s and the loop's own delays
    finally:
        await discovery.aclose()


@pytest.mark.parametrize("origin", ["topology", "events"])
async def test_the_interval_re_reads_only_once_membership_moved(
    topology: Topology, origin: str
) -> None:
    """Followed directly, or beside a source of events, the topology is changed here by
    something else: each interval checks its membership_version and re-reads nothing until
    an instance or a replicaset changed."""
    add_replicaset(topology, 1)
    discovery = (
        TopologyDiscovery(topology, interval=0.01)
        if origin == "topology"
        else TopologyDiscovery(Source(), topology=topology, interval=0.01)
    )
    rereads = count_rereads(discovery)
    try:
        assert await take(discovery, 1) == [("worker-added", inst_uuid(1))]
        assert rereads() == 1
        with pytest.raises(TimeoutError):  # ten intervals, nothing moved
            await asyncio.wait_for(anext(discovery), 0.1)
        topology.apply(BucketEvent("default", 1, 3000, rs_uuid(1)))  # a map alone
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(anext(discovery), 0.1)
        assert rereads() == 1
        add_replicaset(topology, 2)
        assert await take(discovery, 1) == [("worker-added", inst_uuid(2))]
        assert rereads() == 2
    finally:
        await discovery.aclose()


async def test_a_filter_restricts_the_members_to_a_tier(topology: Topology) -> None:
    add_replicaset(topology, 1)
    add_replicaset(topology, 2, tier="other")

    discovery = TopologyDiscovery(
        topology, interval=None, filter=lambda record: record.extra["tier"] == "other"
    )
    try:
        assert changes(await drain(discovery)) == [("worker-added", inst_uuid(2))]
        topology.apply(ReplicasetEvent("replace", rs_uuid(2), tier="default"))
        discovery.refresh()
        assert changes(await drain(discovery)) == [("worker-dropped", inst_uuid(2))]
    finally:
        await discovery.aclose()


async def test_a_source_is_applied_to_the_topology_and_followed(topology: Topology) -> None:

    source = Source(*replicaset_events(1), BucketEvent("default", 1, 3000, rs_uuid(1)))
    discovery = TopologyDiscovery(source, topology=topology)
    try:
        assert changes(await drain(discovery)) == [("worker-added", inst_uuid(1))]
        assert topology.route("default", "k") is not None
        source.send(*replicaset_events(2))
        assert changes(await drain(discovery)) == [("worker-added", inst_uuid(2))]
        # an event the topology refuses is counted and skipped; the stream goes on
        source.send(ReplicasetEvent("replace", rs_uuid(5)))  # a new replicaset needs a tier
        source.send(InstanceEvent("replace", inst_uuid(1), current_state="Offline"))
        assert changes(await drain(discovery)) == [("worker-dropped", inst_uuid(1))]
        assert discovery.skipped == {"rejected": 1}
        assert source.resyncs == 1
        # the source ends: one last re-read, then the stream ends
        source.send(InstanceEvent("delete", inst_uuid(2)))
        source.end()
        assert changes(await drain(discovery)) == [("worker-dropped", inst_uuid(2))]
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(anext(discovery), WAIT)
    finally:
        await discovery.aclose()


async def test_a_custom_apply_and_an_unknown_tier(topology: Topology) -> None:
    applied: list[Any] = []

    def apply(target: Topology, item: Any) -> None:
        if item == "unmappable":
            raise UnknownTier("tier 'nope' has no bucket count")
        applied.append(item)
        target.apply(item)

    source = Source("unmappable", *replicaset_events(1))
    discovery = TopologyDiscovery(source, topology=topology, apply=apply)
    try:
        assert changes(await drain(discovery)) == [("worker-added", inst_uuid(1))]
        assert applied == replicaset_events(1)
        assert discovery.skipped == {"rejected": 1}
        assert source.resyncs == 1
    finally:
        await discovery.aclose()


async def test_an_item_whose_apply_raises_anything_else_is_skipped_too(topology: Topology) -> None:
    # wrong types: an int uuid makes applying the snapshot raise AttributeError, not InvalidEvent
    broken = TopologySnapshot(
        dict(topology.tiers), (ReplicasetEvent("replace", 5, tier="default"),)
    )

    source = Source(broken, *replicaset_events(1))
    discovery = TopologyDiscovery(source, topology=topology)
    try:
        assert changes(await drain(discovery)) == [("worker-added", inst_uuid(1))]
        assert discovery.skipped == {"rejected": 1}
        assert source.resyncs == 1
    finally:
        await discovery.aclose()


async def test_a_burst_of_source_events_costs_one_re_read(topology: Topology) -> None:

    burst = [event for n in range(1, 9) for event in replicaset_events(n)]
    source = Source(*burst)
    discovery = TopologyDiscovery(source, topology=topology)
    rereads = count_rereads(discovery)
    try:
        events = await drain(discovery)
        assert sorted(changes(events)) == sorted(
            ("worker-added", inst_uuid(n)) for n in range(1, 9)
        )
        assert rereads() <= 2  # the first read may come before the source's first item
    finally:
        await discovery.aclose()


async def test_a_failing_source_fails_the_stream(topology: Topology) -> None:

    source = Source(*replicaset_events(1))
    discovery = TopologyDiscovery(source, topology=topology)
    try:
        assert changes(await drain(discovery)) == [("worker-added", inst_uuid(1))]
        source.fail(ConnectionError("the catalog went away"))
        with pytest.raises(ConnectionError, match="went away"):
            await asyncio.wait_for(anext(discovery), WAIT)
    finally:
        await discovery.aclose()


async def test_closing_stops_iterating_the_source(topology: Topology) -> None:
    closed = asyncio.Event()

    async def endless() -> AsyncIterator[Any]:
        try:
            for event in replicaset_events(1):
                yield event
            await asyncio.Event().wait()
        finally:
            closed.set()

    discovery = TopologyDiscovery(endless(), topology=topology)
    assert changes(await drain(discovery)) == [("worker-added", inst_uuid(1))]
    await discovery.aclose()
    assert closed.is_set()


async def take(discovery: TopologyDiscovery, count: int) -> list[tuple[str, str]]:
    return changes([await asyncio.wait_for(anext(discovery), WAIT) for _ in range(count)])


async def test_a_topology_source_is_run_as_it_runs_itself(topology: Topology) -> None:

    snapshot = TopologySnapshot(
        tiers={"default": 3000, "other": 3000},
        replicasets=(replicaset_events(1)[0],),
        instances=(replicaset_events(1)[1],),
        buckets=(BucketSnapshot("default", [BucketEvent("default", 1, 3000, rs_uuid(1))]),),
    )
    source = QueuedSource(snapshot)
    discovery = TopologyDiscovery(source, topology=topology, interval=0.01)
    try:
        assert await take(discovery, 1) == [("worker-added", inst_uuid(1))]
        assert topology.route("default", "k") is not None
        applied = source.state.events_applied
        assert applied > 0  # counted by the source's own run()
        source.queue.put_nowait(replicaset_events(2)[0])
        source.queue.put_nowait(replicaset_events(2)[1])
        assert await take(discovery, 1) == [("worker-added", inst_uuid(2))]
        # refused by the topology: the source's run counts it and asks itself to resync
        source.queue.put_nowait(ReplicasetEvent("replace", rs_uuid(5)))
        source.queue.put_nowait(InstanceEvent("delete", inst_uuid(1)))
        assert await take(discovery, 1) == [("worker-dropped", inst_uuid(1))]
        assert source.state.failures == {"rejected": 1}
        assert source.resyncs == 1
        assert discovery.skipped == {}
        # nothing applied: the check at the interval re-reads nothing
        rereads = count_rereads(discovery)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(anext(discovery), 0.1)
        assert rereads() == 0
        # the source closed: run() returns, the stream ends after a last re-read
        source.queue.put_nowait(InstanceEvent("delete", inst_uuid(2)))
        await source.aclose()
        assert await take(discovery, 1) == [("worker-dropped", inst_uuid(2))]
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(anext(discovery), WAIT)
    finally:
        await discovery.aclose()


async def test_a_topology_source_with_apply_is_iterated_directly(topology: Topology) -> None:

    source = QueuedSource(*replicaset_events(1))
    discovery = TopologyDiscovery(source, topology=topology, apply=Topology.apply)
    try:
        assert changes(await drain(discovery)) == [("worker-added", inst_uuid(1))]
        assert source.state.events_applied == 0  # run() was not used
    finally:
        await discovery.aclose()


async def test_a_source_without_a_topology_gets_a_new_one() -> None:

    discovery = TopologyDiscovery(Source())
    try:
        assert isinstance(discovery.topology, Topology)
        assert discovery.topology.instances == {}
    finally:
        await discovery.aclose()


def test_refusals(topology: Topology) -> None:
    with pytest.raises(TypeError, match="async iterable"):
        TopologyDiscovery([1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="interval"):
        TopologyDiscovery(topology, interval=0)
    with pytest.raises(ValueError, match="twice"):
        TopologyDiscovery(topology, topology=Topology())
    with pytest.raises(ValueError, match="apply"):
        TopologyDiscovery(topology, apply=Topology.apply)
    with pytest.raises(ValueError, match="interval"):
        TopologyDiscovery(QueuedSource(), interval=None)


def test_instance_record_needs_online_and_an_address() -> None:
    from shardline import Instance, Replicaset

    online = Instance(inst_uuid(1), rs_uuid(1), "Online", "127.0.0.1:1")
    replicaset = Replicaset(rs_uuid(1), "default", inst_uuid(1))
    record = instance_record(online, replicaset)
    assert record is not None
    assert record.extra["tier"] == "default"
    assert instance_record(Instance(inst_uuid(1), rs_uuid(1), "Offline", "h:1"), None) is None
    assert instance_record(Instance(inst_uuid(1), rs_uuid(1), "Online", None), None) is None
    assert instance_record(Instance(inst_uuid(1), rs_uuid(1), None, "h:1"), None) is None


class Connection:
    def __init__(self, metadata: WorkerMetadata) -> None:
        self.address = metadata.address

    async def dispatch(self, task: Any, *, timeout: float | None = None) -> str:
        return self.address


async def test_a_worker_proxy_pools_the_online_instances(topology: Topology) -> None:
    add_replicaset(topology, 1)
    add_replicaset(topology, 2)

    discovery = TopologyDiscovery(topology, interval=None)
    try:
        async with WorkerProxy(discovery=discovery, connect=Connection, quorum=2) as proxy:
            assert {str(record.uid) for record in proxy.workers} == {
                inst_uuid(1),
                inst_uuid(2),
            }
            topology.apply(InstanceEvent("replace", inst_uuid(1), current_state="Offline"))
            discovery.refresh()
            await until(lambda: len(proxy.workers) == 1, "the offline instance dropped")
            assert [str(record.uid) for record in proxy.workers] == [inst_uuid(2)]
            assert await proxy.dispatch("task") == "127.0.0.1:3302"
    finally:
        await discovery.aclose()


# The model: what membership must be after any history of instance and replicaset events.

INSTANCES = [inst_uuid(n) for n in range(4)]
STATES = ["Online", "Offline", "Expelled"]
model_events = st.one_of(
    st.builds(
        InstanceEvent,
        op=st.sampled_from(["replace", "replace", "replace", "delete"]),
        instance_uuid=st.sampled_from(INSTANCES),
        replicaset_uuid=st.none() | st.sampled_from([rs_uuid(0), rs_uuid(1)]),
        current_state=st.none() | st.sampled_from(STATES),
        address=st.none() | st.sampled_from(["127.0.0.1:1", "127.0.0.1:2"]),
    ),
    st.builds(
        ReplicasetEvent,
        op=st.just("replace"),
        replicaset_uuid=st.sampled_from([rs_uuid(0), rs_uuid(1)]),
        tier=st.sampled_from(["default", "other"]),
        current_master_uuid=st.none() | st.sampled_from(INSTANCES),
    ),
)


def expected_members(instances: dict[str, dict[str, Any]], tiers: dict[str, str]) -> dict[str, Any]:
    """uuid -> (address, replicaset, tier) of every instance that is Online with an address."""
    return {
        uuid_text: (fields["address"], fields["rs"], tiers.get(fields["rs"]))
        for uuid_text, fields in instances.items()
        if fields["state"] == "Online" and fields["address"] is not None
    }


def apply_to_model(event: Any, instances: dict[str, dict[str, Any]], tiers: dict[str, str]) -> None:
    """``event`` applied to the model: instance fields by uuid, replicaset tiers by uuid."""
    if isinstance(event, ReplicasetEvent):
        tiers[event.replicaset_uuid] = event.tier or tiers[event.replicaset_uuid]
    elif event.op == "delete":
        instances.pop(event.instance_uuid, None)
    else:
        fields = instances.setdefault(
            event.instance_uuid, {"address": None, "rs": None, "state": None}
        )
        for name, value in (
            ("address", event.address),
            ("rs", event.replicaset_uuid),
            ("state", event.current_state),
        ):
            if value is not None:
                fields[name] = value


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(model_events, min_size=1, max_size=4), min_size=1, max_size=10))
def test_membership_follows_a_model_of_the_instances(batches: list[list[Any]]) -> None:
    async def scenario() -> None:
        topology = Topology()
        topology.apply_tiers({"default": 30, "other": 30})
        discovery = TopologyDiscovery(topology, interval=None)
        instances: dict[str, dict[str, Any]] = {}
        tiers: dict[str, str] = {}
        seen: dict[str, Any] = {}  # what the subscriber was told, from the events alone
        try:
            for batch in batches:
                for event in batch:
                    topology.apply(event)
                    apply_to_model(event, instances, tiers)
                discovery.refresh()
                for event in await drain(discovery):
                    follow(seen, event)
                assert seen == expected_members(instances, tiers)
        finally:
            await discovery.aclose()

    asyncio.run(asyncio.wait_for(scenario(), WAIT))


def count_rereads(discovery: TopologyDiscovery) -> Callable[[], int]:
    """Makes ``discovery`` count its re-reads of the topology; returns the count so far."""
    count = 0
    reread = discovery._reread

    def counted() -> list[DiscoveryEvent]:
        nonlocal count
        count += 1
        return reread()

    discovery._reread = counted  # type: ignore[method-assign]
    return lambda: count


def follow(seen: dict[str, Any], event: DiscoveryEvent) -> None:
    """What a subscriber knows after ``event``, checked against the discovery contract."""
    uid, record = str(event.metadata.uid), event.metadata
    view = (record.address, record.extra["replicaset_uuid"], record.extra["tier"])
    if event.type == "worker-added":
        assert uid not in seen
        seen[uid] = view
    elif event.type == "worker-updated":
        assert seen[uid] != view, "a no-op update"
        seen[uid] = view
    else:
        assert event.type == "worker-dropped"
        del seen[uid]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.lists(model_events, min_size=1, max_size=4), st.integers(0, 3)),
        min_size=1,
        max_size=8,
    )
)
def test_no_change_is_missed_by_the_checks_at_the_interval(
    batches: list[tuple[list[Any], int]],
) -> None:
    """Without refresh(): changes made between two checks, or while the subscriber has taken
    only part of a re-read's events, all reach it (a change the check missed would leave it
    short of the model until the wait times out)."""

    async def scenario() -> None:
        topology = Topology()
        topology.apply_tiers({"default": 30, "other": 30})
        discovery = TopologyDiscovery(topology, interval=0.001)
        instances: dict[str, dict[str, Any]] = {}
        tiers: dict[str, str] = {}
        seen: dict[str, Any] = {}
        try:
            for batch, taken in batches:
                for event in batch:
                    topology.apply(event)
                    apply_to_model(event, instances, tiers)
                for event in await drain(discovery, taken):
                    follow(seen, event)
            while seen != expected_members(instances, tiers):
                follow(seen, await asyncio.wait_for(anext(discovery), WAIT))
        finally:
            await discovery.aclose()

    asyncio.run(asyncio.wait_for(scenario(), 2 * WAIT))


async def test_a_quorum_that_never_comes_says_why_the_source_found_nobody() -> None:
    """WorkerProxy over TopologyDiscovery over a catalog nobody listens at: the TimeoutError
    carries the source's last failure, not only the count of workers that joined."""
    with socket.socket() as probe:  # a loopback port that refuses connections
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    async def scenario() -> tuple[str, str | None]:
        source = PollingSource(f"postgresql://shardline@127.0.0.1:{port}/postgres", interval=0.05)
        discovery = TopologyDiscovery(source)
        proxy = WorkerProxy(
            discovery=discovery, connect=lambda metadata: None, quorum=1, quorum_timeout=1.0
        )
        try:
            with pytest.raises(TimeoutError) as raised:
                await proxy.start()
            return str(raised.value), discovery.last_failure
        finally:
            await discovery.aclose()
            await source.aclose()

    message, last_failure = await scenario()
    assert last_failure is not None
    assert message == (
        "0 of the 1 workers of the quorum joined within 1.0 s;"
        f" discovery's last failure: {last_failure}"
    )
    assert str(port) in last_failure


def test_a_topology_followed_directly_has_no_last_failure(topology: Topology) -> None:
    assert TopologyDiscovery(topology, interval=None).last_failure is None
