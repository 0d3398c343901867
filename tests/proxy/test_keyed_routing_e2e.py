"""Keyed tasks routed end to end: worker processes (`shardline worker`) stand in for cluster
instances, a topology points at them, and a WorkerProxy routes each key through
TopologyDiscovery + BucketLoadBalancer to the instance that owns it, while a replicaset is added
and buckets move, and while a master dies. First with topology events applied directly, then
with the catalog in a real PostgreSQL (tests/support/picodata_catalog.py) polled by
PollingSource."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, TypeVar

import pytest

from shardline import (
    BucketEvent,
    InstanceEvent,
    NoWorkersAvailable,
    ReplicasetEvent,
    Topology,
    WorkerMetadata,
    WorkerProxy,
    bucket_id,
)
from shardline.balancers.bucket import BucketLoadBalancer
from shardline.discovery.record import decode_record
from shardline.discovery.topology import TopologyDiscovery
from shardline.topology.sources import PollingSource
from shardline.transport import GrpcConnection, Task
from shardline.transport.grpc.wire import grpc_target
from support.fakes import Source
from support.pg_server import PgServer
from support.picodata_catalog import Catalog, Expected, name_uuid
from support.replicasets import inst_uuid, replica_uuid, rs_uuid
from support.transport_servers import new_namespace
from support.waiting import until
from support.worker_processes import WorkerProcess, worker_process

pytestmark = pytest.mark.async_timeout(120)  # four processes start, maybe on a loaded machine

TIER = "default"
BUCKETS = 3000
KEYS = [f"user:{n}" for n in range(150)] + list(range(50))
WAIT = 20.0
READY = 60.0
T = TypeVar("T")


def pooled(proxy: WorkerProxy, instance: str) -> bool:
    return any(str(record.uid) == instance for record in proxy.workers)


class EventCatalog:
    """What the cluster says, kept by the test: ranges → replicaset → master. Every change is
    also sent to the source, as events."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.masters: dict[str, str] = {}  # replicaset -> master instance
        self.ranges: list[tuple[int, int, str]] = []

    def add_replicaset(self, replicaset: str, instances: dict[str, str]) -> None:
        """The replicaset with its instances (uuid → address), the first one its master."""
        master = next(iter(instances))
        self.masters[replicaset] = master
        self.source.send(
            ReplicasetEvent("replace", replicaset, tier=TIER, current_master_uuid=master)
        )
        for instance, address in instances.items():
            self.source.send(
                InstanceEvent(
                    "replace",
                    instance,
                    replicaset_uuid=replicaset,
                    current_state="Online",
                    address=address,
                )
            )

    def move_buckets(self, ranges: list[tuple[int, int, str]]) -> None:
        self.ranges = ranges
        self.source.send(*(BucketEvent(TIER, start, end, rs) for start, end, rs in ranges))

    def owner_master(self, key: Any) -> str:
        bucket = bucket_id(key, BUCKETS)
        for start, end, replicaset in self.ranges:
            if start <= bucket <= end:
                return self.masters[replicaset]
        raise AssertionError(f"bucket {bucket} is not in the catalog")


async def ready(worker: WorkerProcess) -> WorkerMetadata:
    """The record the worker prints once it serves (waited for longer than the CLI tests do:
    four processes start at once here, on what may be a loaded machine)."""
    assert worker.process.stdout is not None
    line = await asyncio.wait_for(worker.process.stdout.readline(), READY)
    assert line, f"the worker exited before it was ready: {worker.stderr.read_text()}"
    return decode_record(line.rstrip(b"\n"))


class Workers:
    """The worker processes standing in for instances: where each serves, which instance a
    pid (what the ``whoami`` handler answers) stands for, and each process."""

    def __init__(self) -> None:
        self.addresses: dict[str, str] = {}
        self.instance_of_pid: dict[int, str] = {}
        self.processes: dict[str, WorkerProcess] = {}


async def start_workers(stack: AsyncExitStack, directory: Path, instances: list[str]) -> Workers:
    """One `shardline worker` process per instance (its uid is the instance's uuid), started
    together, killed when ``stack`` closes."""
    namespace = new_namespace()
    processes = [
        await stack.enter_async_context(
            worker_process(
                directory,
                "--namespace",
                namespace,
                # gRPC: a catalog address is a bare host:port, which GrpcConnection dials
                "--transport",
                "grpc",
                "--address",
                "127.0.0.1:0",
                "--uid",
                instance,
                "--grace",
                "0",
            )
        )
        for instance in instances
    ]
    records = await asyncio.gather(*(ready(process) for process in processes))
    workers = Workers()
    for instance, process, record in zip(instances, processes, records, strict=True):
        assert str(record.uid) == instance
        workers.instance_of_pid[record.pid] = instance
        workers.processes[instance] = process
        workers.addresses[instance] = grpc_target(record.address)
    return workers


def keyed(key: Any, *, read_only: bool = False) -> Task:
    """A task for ``key``'s owner. A read is idempotent: after a master is killed, the read
    sent to it may fail after sending (gRPC's "Stream removed" when the dead socket is found
    only after the request was written), and only an idempotent task goes on to the replica
    then; a write there raises ``OutcomeUnknown`` by design (at most once)."""
    return Task("whoami", {"key": key, "read_only": read_only}, idempotent=read_only)


def keyed_balancer(
    topology: Topology, discovery: TopologyDiscovery, on_miss: Callable[[], object]
) -> BucketLoadBalancer:
    """Routes what :func:`keyed` makes: by its key, to a replica when it is read-only."""
    return BucketLoadBalancer(
        topology,
        TIER,
        key=lambda task: task.payload["key"],
        read_only=lambda task: task.payload["read_only"],
        replicas=discovery.replicas,
        on_miss=on_miss,
    )


def keyed_proxy(discovery: TopologyDiscovery, balancer: BucketLoadBalancer) -> WorkerProxy:
    """The proxy over the worker processes, without passive health: on a loaded machine a
    worker that answers late (a fresh gRPC channel's first calls, a process short of CPU) is
    ejected as stuck or as a latency outlier, and its keys then find no worker ("none was
    pooled") though their route is right. These tests check routing; ejection has its own
    (tests/transport/test_sick_workers.py)."""
    return WorkerProxy(
        discovery=discovery,
        loadbalancer=balancer,
        connect=GrpcConnection,
        quorum=3,
        health=None,
    )


@pytest.fixture
def workers_directory(tmp_path: Path) -> Path:
    directory = tmp_path / "shardline"
    directory.mkdir()
    return directory


@pytest.mark.integration  # a server of its own
async def test_every_key_reaches_the_instance_that_owns_it_as_buckets_move(
    workers_directory: Path,
) -> None:
    r1, r2, r3 = rs_uuid(1), rs_uuid(2), rs_uuid(3)
    m1, m2, m3, replica = inst_uuid(1), inst_uuid(2), inst_uuid(3), replica_uuid(1, 1)

    async with AsyncExitStack() as stack:
        source = Source()
        catalog = EventCatalog(source)
        workers = await start_workers(stack, workers_directory, [m1, replica, m2, m3])
        addresses = workers.addresses
        topology = Topology()
        topology.apply_tiers({TIER: BUCKETS})
        discovery = TopologyDiscovery(source, topology=topology)
        stack.push_async_callback(discovery.aclose)
        misses: list[str] = []
        balancer = keyed_balancer(topology, discovery, lambda: misses.append("refresh"))
        proxy = keyed_proxy(discovery, balancer)

        async def served_by(task: Task) -> str:
            answer = await proxy.dispatch(task, timeout=WAIT)
            return workers.instance_of_pid[answer["pid"]]

        async def check_every_key() -> dict[str, int]:
            reached: dict[str, int] = {}
            for key in KEYS:
                instance = await served_by(keyed(key))
                assert instance == catalog.owner_master(key), key
                reached[instance] = reached.get(instance, 0) + 1
            return reached

        catalog.add_replicaset(r1, {m1: addresses[m1], replica: addresses[replica]})
        catalog.add_replicaset(r2, {m2: addresses[m2]})
        catalog.move_buckets([(1, 1500, r1), (1501, 3000, r2)])
        async with proxy:
            await until(lambda: len(topology.ranges(TIER)) == 2, "the first bucket map")
            assert set(await check_every_key()) == {m1, m2}

            # R3 joins: its replicaset event clears the map, so keys miss (named) until
            # the buckets that moved arrive; then every key reaches its new owner
            catalog.add_replicaset(r3, {m3: addresses[m3]})
            await until(lambda: pooled(proxy, m3), "R3's master pooled")
            with pytest.raises(NoWorkersAvailable, match=r"no route for bucket \d+ of tier"):
                await proxy.dispatch(keyed(KEYS[0]))
            assert misses == ["refresh"]
            catalog.move_buckets([(1, 1000, r1), (1001, 2000, r2), (2001, 3000, r3)])
            await until(lambda: len(topology.ranges(TIER)) == 3, "the new bucket map")
            reached = await check_every_key()
            assert set(reached) == {m1, m2, m3}

            # R1's master dies: a read of an R1 key goes to its replica, a write is
            # refused; once the catalog says it is offline it leaves the pool
            r1_key = next(key for key in KEYS if catalog.owner_master(key) == m1)
            workers.processes[m1].process.send_signal(signal.SIGKILL)
            await workers.processes[m1].process.wait()
            assert await served_by(keyed(r1_key, read_only=True)) == replica
            with pytest.raises(NoWorkersAvailable, match=f"master {m1}"):
                await proxy.dispatch(keyed(r1_key))
            source.send(InstanceEvent("replace", m1, current_state="Offline"))
            await until(lambda: not pooled(proxy, m1), "m1 dropped")
            assert await served_by(keyed(r1_key, read_only=True)) == replica
            # the catalog fails over: the replica becomes R1's master
            catalog.masters[r1] = replica
            source.send(ReplicasetEvent("replace", r1, current_master_uuid=replica))
            await until(
                lambda: topology.route(TIER, r1_key).uuid == replica,  # type: ignore[union-attr]
                "the failover",
            )
            assert await served_by(keyed(r1_key)) == replica
            reached = await check_every_key()
            assert set(reached) == {replica, m2, m3}


# The same with the catalog in PostgreSQL, polled by PollingSource.


def catalog_master(expected: Expected, key: Any) -> str:
    """The master instance uuid the catalog (as read by ``Catalog.expected``) routes ``key`` to."""
    bucket = bucket_id(key, BUCKETS)
    for start, end, replicaset in expected.maps[TIER]:
        if start <= bucket <= end:
            master = expected.replicasets[replicaset][1]
            assert master is not None
            return master
    raise AssertionError(f"bucket {bucket} is not in the catalog")


async def test_every_key_reaches_its_owner_with_the_catalog_in_postgresql(
    pg: PgServer, workers_directory: Path
) -> None:
    catalog = Catalog(pg.create_schema())
    instance_names = ["r1_1", "r1_2", "r2_1", "r3_1"]

    async def scenario() -> None:
        async with AsyncExitStack() as stack:
            workers = await start_workers(
                stack, workers_directory, [name_uuid(name) for name in instance_names]
            )
            address = {name: workers.addresses[name_uuid(name)] for name in instance_names}

            catalog.add_tier(TIER, BUCKETS)
            with catalog.transaction():
                catalog.add_replicaset("r1", instances=2)
                catalog.add_replicaset("r2")
                for name in ("r1_1", "r1_2", "r2_1"):
                    catalog.set_address(name, address[name])
                catalog.rebalance(TIER)

            # polls only when asked: refresh(), or trigger() after a routing miss
            source = PollingSource(catalog.dsn, interval=60.0, retry=60.0, min_interval=0.01)
            stack.push_async_callback(source.aclose)
            topology = Topology()
            discovery = TopologyDiscovery(source, topology=topology)
            stack.push_async_callback(discovery.aclose)
            balancer = keyed_balancer(
                topology, discovery, lambda: (misses.append(None), source.trigger())
            )
            misses: list[None] = []
            proxy = keyed_proxy(discovery, balancer)

            async def check_every_key() -> set[str]:
                reached = set()
                expected = catalog.expected()
                for key in KEYS:
                    answer = await proxy.dispatch(keyed(key), timeout=WAIT)
                    instance = workers.instance_of_pid[answer["pid"]]
                    assert instance == catalog_master(expected, key), key
                    reached.add(instance)
                return reached

            async with proxy:
                assert await check_every_key() == {name_uuid("r1_1"), name_uuid("r2_1")}

                # R3 joins and the buckets move, in one committed change; one poll later
                # every key reaches its new owner
                with catalog.transaction():
                    catalog.add_replicaset("r3")
                    catalog.set_address("r3_1", address["r3_1"])
                    catalog.rebalance(TIER)
                assert await source.refresh()
                await until(lambda: pooled(proxy, name_uuid("r3_1")), "R3's master pooled")
                assert await check_every_key() == {
                    name_uuid("r1_1"),
                    name_uuid("r2_1"),
                    name_uuid("r3_1"),
                }

                # a replicaset joins while _pico_bucket fails (a rebalance in progress): the
                # map is cleared, and a key misses with the reason and triggers a poll, which
                # fails too; once the buckets can be read again, the poll the next miss
                # triggers restores routing (retry=60: no poll comes but those triggered)
                catalog.fail_buckets(TIER)
                with catalog.transaction():
                    catalog.add_replicaset("r4")
                assert not await source.refresh()
                # a poll is over once its read is counted: what it hands out follows at once
                reads = source.state.read_durations.count
                with pytest.raises(NoWorkersAvailable, match=r"no route for bucket \d+ of tier"):
                    await proxy.dispatch(keyed(KEYS[0]))
                assert misses == [None]
                await until(lambda: source.state.read_durations.count > reads, "the triggered poll")
                assert topology.route(TIER, KEYS[0]) is None
                catalog.heal_buckets(TIER)
                with pytest.raises(NoWorkersAvailable, match=r"no route for bucket \d+ of tier"):
                    await proxy.dispatch(keyed(KEYS[0]))
                assert misses == [None, None]
                await until(
                    lambda: topology.route(TIER, KEYS[0]) is not None, "the poll of the second miss"
                )
                assert await check_every_key() == {
                    name_uuid("r1_1"),
                    name_uuid("r2_1"),
                    name_uuid("r3_1"),
                }

    try:
        await scenario()
    finally:
        catalog.close()
