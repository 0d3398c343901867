"""BucketLoadBalancer: a keyed task goes to the master of the replicaset owning its bucket; a
read-only one falls back to that replicaset's other instances; a miss names the bucket and asks
for a refresh. Driven directly, as the proxy drives it, and through a WorkerProxy."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardline import (
    BucketEvent,
    InstanceEvent,
    LoadBalancerLike,
    NoWorkersAvailable,
    ReplicasetEvent,
    RpcError,
    Topology,
    TransientRpcError,
    UnhashableKey,
    UnknownTier,
    WorkerMetadata,
    WorkerProxy,
    bucket_id,
)
from shardline.balancers.bucket import BucketLoadBalancer
from shardline.discovery.topology import TopologyDiscovery
from support.balancer_driving import all_failing, fail, first, served_by, start, succeed
from support.fakes import drain
from support.replicasets import add_replica, add_replicaset, inst_uuid, replica_uuid, rs_uuid

pytestmark = pytest.mark.usefixtures("balancer_protocol")  # each test through both protocols

TIER = "default"


@dataclass(frozen=True)
class Keyed:
    key: Any
    read_only: bool = False


class NoPool:
    """A context the balancer must not read: routing comes from the topology alone."""

    @property
    def workers(self) -> Any:
        raise AssertionError("the balancer read the pool")


def uid(text: str) -> uuid.UUID:
    return uuid.UUID(text)


@pytest.fixture
def cluster(topology: Topology) -> Topology:
    """R1 (buckets 1-1000, replicas 1, 2 online and 3 offline), R2 (1001-2000), R3 (2001-3000)."""
    for n in (1, 2, 3):
        add_replicaset(topology, n)
    add_replica(topology, 1, 1)
    add_replica(topology, 1, 2)
    add_replica(topology, 1, 3, state="Offline")
    for n, (low, high) in zip((1, 2, 3), [(1, 1000), (1001, 2000), (2001, 3000)], strict=True):
        topology.apply(BucketEvent(TIER, low, high, rs_uuid(n)))
    return topology


def key_in(topology: Topology, n: int, tier: str = TIER) -> int:
    """An int key whose bucket replicaset Rn owns."""
    for key in range(100_000):
        if topology.owner(tier, topology.bucket_id(tier, key)) == rs_uuid(n):
            return key
    raise AssertionError(f"no key of R{n}")


def test_it_follows_the_balancer_protocol(cluster: Topology) -> None:
    assert isinstance(BucketLoadBalancer(cluster, TIER), LoadBalancerLike)


async def test_the_first_candidate_is_the_master_and_a_success_ends_the_call(
    cluster: Topology,
) -> None:
    balancer = BucketLoadBalancer(cluster, TIER)
    for n in (1, 2, 3):
        task = Keyed(key_in(cluster, n))
        assert await served_by(balancer, NoPool(), task) == uid(inst_uuid(n))


async def test_a_write_is_offered_the_master_only_and_the_failure_is_named(
    cluster: Topology,
) -> None:
    balancer = BucketLoadBalancer(cluster, TIER)
    key = key_in(cluster, 1)

    gen = start(balancer, Keyed(key), NoPool())
    assert await first(gen) == uid(inst_uuid(1))
    with pytest.raises(NoWorkersAvailable) as raised:
        await gen.athrow(RpcError("connection refused"))
    message = str(raised.value)
    assert f"bucket {cluster.bucket_id(TIER, key)} of tier 'default'" in message
    assert rs_uuid(1) in message
    assert inst_uuid(1) in message
    assert "connection refused" in message
    assert isinstance(raised.value.__cause__, RpcError)


async def test_a_read_only_task_falls_back_to_the_online_replicas_in_uid_order(
    cluster: Topology,
) -> None:
    balancer = BucketLoadBalancer(cluster, TIER)
    task = Keyed(key_in(cluster, 1), read_only=True)
    expected = [uid(inst_uuid(1)), uid(replica_uuid(1, 1)), uid(replica_uuid(1, 2))]

    async def scenario() -> None:
        with pytest.raises(NoWorkersAvailable, match=r"offered 3 instances") as raised:
            await all_failing(balancer, NoPool(), task)
        assert raised.value.__cause__ is not None
        # the replica that serves ends the call
        gen = start(balancer, task, NoPool())
        assert await first(gen) == expected[0]
        assert await fail(gen) == expected[1]
        assert await succeed(gen, expected[1])

    await scenario()
    offered: list[uuid.UUID] = []

    gen = start(balancer, task, NoPool())
    candidate = await first(gen)
    while candidate is not None:
        offered.append(candidate)
        try:
            candidate = await gen.athrow(TransientRpcError("busy"))
        except (StopAsyncIteration, NoWorkersAvailable):
            candidate = None
    assert offered == expected


async def test_a_master_not_in_the_pool_is_skipped_to_the_replicas(cluster: Topology) -> None:
    """The proxy asks for the next candidate (``anext``) when a uid is not pooled."""
    balancer = BucketLoadBalancer(cluster, TIER)

    gen = start(balancer, Keyed(key_in(cluster, 1), read_only=True), NoPool())
    assert await first(gen) == uid(inst_uuid(1))
    assert await anext(gen) == uid(replica_uuid(1, 1))
    assert await anext(gen) == uid(replica_uuid(1, 2))
    with pytest.raises(NoWorkersAvailable, match="none was pooled"):
        await anext(gen)
    write = start(balancer, Keyed(key_in(cluster, 1)), NoPool())
    assert await first(write) == uid(inst_uuid(1))
    with pytest.raises(NoWorkersAvailable, match=r"offered its master .* none was pooled"):
        await anext(write)


async def test_replicas_can_come_from_a_provider(cluster: Topology) -> None:
    asked: list[str] = []

    def replicas(replicaset: str) -> list[uuid.UUID]:
        asked.append(replicaset)
        return [uid(replica_uuid(1, 2)), uid(inst_uuid(1))]  # the master is never offered twice

    balancer = BucketLoadBalancer(cluster, TIER, replicas=replicas)

    async def order() -> list[uuid.UUID]:
        gen = start(balancer, Keyed(key_in(cluster, 1), read_only=True), NoPool())
        seen = [await first(gen)]
        seen.append(await fail(gen))
        with pytest.raises(NoWorkersAvailable):
            await fail(gen)
        return [candidate for candidate in seen if candidate is not None]

    assert await order() == [uid(inst_uuid(1)), uid(replica_uuid(1, 2))]
    assert asked == [rs_uuid(1)] * 2  # asked for each candidate after the master


async def test_the_replicas_of_a_topology_discovery(cluster: Topology) -> None:
    async def scenario() -> list[uuid.UUID]:
        discovery = TopologyDiscovery(cluster, interval=None)
        try:
            await drain(discovery)
            balancer = BucketLoadBalancer(cluster, TIER, replicas=discovery.replicas)
            gen = start(balancer, Keyed(key_in(cluster, 1), read_only=True), NoPool())
            seen = [await first(gen), await fail(gen), await fail(gen)]
            await gen.aclose()
            return [candidate for candidate in seen if candidate is not None]
        finally:
            await discovery.aclose()

    assert await scenario() == [uid(inst_uuid(1)), uid(replica_uuid(1, 1)), uid(replica_uuid(1, 2))]


async def test_read_only_and_key_are_callables(cluster: Topology) -> None:
    balancer = BucketLoadBalancer(
        cluster,
        TIER,
        key=lambda task: task["user"],
        read_only=lambda task: task["op"] == "get",
    )
    key = key_in(cluster, 1)

    async def offers(task: Any) -> list[uuid.UUID | None]:
        gen = start(balancer, task, NoPool())
        seen = [await first(gen)]
        with contextlib.suppress(NoWorkersAvailable):
            seen.append(await fail(gen))
        await gen.aclose()
        return seen

    assert await offers({"user": key, "op": "get"}) == [
        uid(inst_uuid(1)),
        uid(replica_uuid(1, 1)),
    ]
    assert await offers({"user": key, "op": "put"}) == [uid(inst_uuid(1))]
    # by default, a read_only attribute that is exactly True makes a task read-only
    balancer = BucketLoadBalancer(cluster, TIER)
    assert len(await offers(Keyed(key, read_only=True))) == 2
    assert await offers(Keyed(key, read_only="yes")) == [uid(inst_uuid(1))]  # type: ignore[arg-type]


async def test_a_composite_key_routes_like_the_topology(cluster: Topology) -> None:
    balancer = BucketLoadBalancer(cluster, TIER)
    for key in [("eu", 42), "user:42", 7, ("a", 1, "b")]:
        master = cluster.route(TIER, key)
        assert master is not None
        assert await served_by(balancer, NoPool(), Keyed(key)) == uid(master.uuid)


@pytest.mark.parametrize(
    ("event", "why"),
    [
        (ReplicasetEvent("replace", rs_uuid(4), tier=TIER), "no replicaset owns it"),
        (InstanceEvent("delete", inst_uuid(2)), f"master of its replicaset {rs_uuid(2)}"),
    ],
)
async def test_a_miss_asks_for_a_refresh_and_names_the_bucket(
    cluster: Topology, event: Any, why: str
) -> None:
    refreshes: list[None] = []
    balancer = BucketLoadBalancer(cluster, TIER, on_miss=lambda: refreshes.append(None))
    key = key_in(cluster, 2)
    cluster.apply(event)
    with pytest.raises(NoWorkersAvailable) as raised:
        await first(start(balancer, Keyed(key), NoPool()))
    bucket = cluster.bucket_id(TIER, key)
    assert str(raised.value).startswith(f"no route for bucket {bucket} of tier 'default': ")
    assert why in str(raised.value)
    assert refreshes == [None]


async def test_an_async_on_miss_is_scheduled_and_a_failing_one_is_logged(
    cluster: Topology, caplog: pytest.LogCaptureFixture
) -> None:
    cluster.apply(ReplicasetEvent("delete", rs_uuid(3)))  # clears the map
    triggered = asyncio.Event()

    async def trigger() -> None:
        triggered.set()

    def broken() -> None:
        raise RuntimeError("the source is closed")

    balancer = BucketLoadBalancer(cluster, TIER, on_miss=trigger)
    with pytest.raises(NoWorkersAvailable, match="no route"):
        await first(start(balancer, Keyed(1), NoPool()))
    await asyncio.wait_for(triggered.wait(), 5)
    balancer = BucketLoadBalancer(cluster, TIER, on_miss=broken)
    with caplog.at_level(logging.ERROR), pytest.raises(NoWorkersAvailable, match="no route"):
        await first(start(balancer, Keyed(1), NoPool()))
    assert "the source is closed" in caplog.text


async def test_an_unknown_tier_and_an_unhashable_key_propagate(cluster: Topology) -> None:
    with pytest.raises(UnknownTier):
        await first(start(BucketLoadBalancer(cluster, "nope"), Keyed(1), NoPool()))
    with pytest.raises(UnhashableKey):
        await first(start(BucketLoadBalancer(cluster, TIER), Keyed(object()), NoPool()))
    with pytest.raises(AttributeError):
        await first(start(BucketLoadBalancer(cluster, TIER), "no key", NoPool()))


async def test_routing_follows_a_master_switch(cluster: Topology) -> None:
    balancer = BucketLoadBalancer(cluster, TIER)
    task = Keyed(key_in(cluster, 1))
    cluster.apply(ReplicasetEvent("replace", rs_uuid(1), current_master_uuid=replica_uuid(1, 1)))
    assert await served_by(balancer, NoPool(), task) == uid(replica_uuid(1, 1))


async def test_a_master_that_changes_mid_call_is_offered_next(cluster: Topology) -> None:
    """Each candidate reads the topology afresh (issue 12: select keeps no per-call state), so
    after the old master failed a write goes to the new one rather than giving up."""
    balancer = BucketLoadBalancer(cluster, TIER)

    async def scenario() -> list[uuid.UUID | None]:
        gen = start(balancer, Keyed(key_in(cluster, 1)), NoPool())
        offered = [await first(gen)]
        cluster.apply(
            ReplicasetEvent("replace", rs_uuid(1), current_master_uuid=replica_uuid(1, 1))
        )
        offered.append(await fail(gen))
        with pytest.raises(NoWorkersAvailable, match=r"offered 2 instances"):
            await fail(gen)
        return offered

    assert await scenario() == [uid(inst_uuid(1)), uid(replica_uuid(1, 1))]


# Through a WorkerProxy fed by TopologyDiscovery.


class Node:
    """A connection to one instance: answers with the instance's uuid, fails on demand."""

    failing: ClassVar[set[str]] = set()

    def __init__(self, metadata: WorkerMetadata) -> None:
        self.uid = str(metadata.uid)

    async def dispatch(self, task: Any, *, timeout: float | None = None) -> str:
        if self.uid in self.failing:
            raise TransientRpcError(f"{self.uid} is unavailable")
        return self.uid


async def test_the_proxy_reports_the_balancers_reason(cluster: Topology) -> None:

    discovery = TopologyDiscovery(cluster, interval=None)
    balancer = BucketLoadBalancer(cluster, TIER, replicas=discovery.replicas)
    Node.failing = set()
    try:
        async with WorkerProxy(
            discovery=discovery, loadbalancer=balancer, connect=Node, quorum=5
        ) as proxy:
            for n in (1, 2, 3):
                assert await proxy.dispatch(Keyed(key_in(cluster, n))) == inst_uuid(n)
            # the master fails: a read falls back to a replica, a write is refused
            Node.failing = {inst_uuid(1)}
            read = Keyed(key_in(cluster, 1), read_only=True)
            assert await proxy.dispatch(read) == replica_uuid(1, 1)
            with pytest.raises(NoWorkersAvailable, match=r"offered its master .* unavailable"):
                await proxy.dispatch(Keyed(key_in(cluster, 1)))
            # a new replicaset clears the map: a miss, named, until buckets arrive
            add_replicaset(cluster, 4)
            key = 12345
            with pytest.raises(NoWorkersAvailable) as raised:
                await proxy.dispatch(Keyed(key))
            bucket = bucket_id(key, 3000)
            assert str(raised.value) == (
                f"no route for bucket {bucket} of tier 'default': "
                "no replicaset owns it in the current bucket map"
            )
    finally:
        Node.failing = set()
        await discovery.aclose()


# Properties.

N_RS = 4


@st.composite
def bucket_maps(draw: st.DrawFn) -> list[tuple[int, int, int]]:
    """A full map of 1..60 cut into ranges, each owned by one of N_RS replicasets."""
    cuts = sorted(draw(st.sets(st.integers(2, 60), max_size=8)))
    starts = [1, *cuts]
    ends = [*(cut - 1 for cut in cuts), 60]
    return [
        (start, end, draw(st.integers(1, N_RS))) for start, end in zip(starts, ends, strict=True)
    ]


keys = st.one_of(
    st.integers(-(2**63), 2**64 - 1),
    st.text(max_size=20),
    st.tuples(st.text(max_size=5), st.integers(0, 1000)),
)


@settings(max_examples=100, deadline=None)
@given(bucket_maps(), st.lists(keys, min_size=1, max_size=20), st.data())
def test_the_first_candidate_is_the_catalogs_master_of_the_keys_bucket(
    ranges: list[tuple[int, int, int]], probe_keys: list[Any], data: st.DataObject
) -> None:
    topology = Topology()
    topology.apply_tiers({TIER: 60})
    masters: dict[int, str] = {}
    for n in range(1, N_RS + 1):
        add_replicaset(topology, n)
        masters[n] = inst_uuid(n)
        if data.draw(st.booleans(), label=f"R{n} switches its master"):
            add_replica(topology, n, 1)
            topology.apply(
                ReplicasetEvent("replace", rs_uuid(n), current_master_uuid=replica_uuid(n, 1))
            )
            masters[n] = replica_uuid(n, 1)
    topology.apply_bucket_snapshot(
        TIER, [BucketEvent(TIER, start, end, rs_uuid(n)) for start, end, n in ranges]
    )
    owner_of = {b: n for start, end, n in ranges for b in range(start, end + 1)}
    balancer = BucketLoadBalancer(topology, TIER)
    for key in probe_keys:
        expected = uuid.UUID(masters[owner_of[bucket_id(key, 60)]])
        assert first_without_a_loop(balancer, Keyed(key)) == expected


def first_without_a_loop(balancer: BucketLoadBalancer, task: Any) -> uuid.UUID:
    """The first candidate, then success, driven without an event loop: the balancer never
    awaits anything, so each step of its generator completes at once."""
    gen = start(balancer, task, NoPool())
    try:
        gen.__anext__().send(None)
    except StopIteration as yielded:
        candidate: uuid.UUID = yielded.value
    else:
        raise AssertionError("the balancer awaited something")
    with pytest.raises(StopAsyncIteration):
        gen.asend(candidate).send(None)
    return candidate
