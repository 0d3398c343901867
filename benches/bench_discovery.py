"""Event propagation from ``publish`` to a subscriber's pool (issue 4), over real backends.

A sample is one ``publisher.publish(type, record)`` of a discovery handle, timed from just before
the call to the moment a ``WorkerProxy`` subscribed through *another* handle on the same
namespace (in the same process and event loop) has applied the event to its pool. The proxy
reads its events through :class:`AppliedProbe`, a pass-through async iterator: the proxy asks it
for the next event synchronously right after applying the previous one, so the entry into
``__anext__`` is the moment the previous event reached the pool. Publishes cycle through add,
update (a new address) and drop of four rotating workers, beside two steady workers that the
proxy keeps pooled throughout; each sample then checks that the proxy's pool holds exactly the
record just published (or no longer holds the dropped uid), and at the end that the proxy was
handed exactly one event per publish.

Groups, each a backend beside its floor:

- ``propagation: etcd``: ``EtcdDiscovery`` on one loopback etcd member
  (``tests/support/etcd_server.py``), against ``floor: etcd put → watch``: the same puts and deletes
  sent with the ``aetcd.rpc`` KV stub on one ``grpc.aio`` channel and seen by a task reading a
  ``Watch`` stream of the prefix on another channel, as ``EtcdDiscovery`` talks to etcd, minus
  shardline.
- ``propagation: local``: ``LocalDiscovery`` (SQLite in WAL mode, doorbells, default settings)
  against ``floor: InProcessDiscovery``, the same contract with no storage and no process
  boundary.

``propagation: etcd, interleaved`` makes the two etcd samples in turn (which goes first
alternates), so both see the same moment of a shared machine: ``extra_info`` has each one's
p50/p99 (``by_way``) and the median, over the pairs, of EtcdDiscovery's sample divided by the
floor's (``median_ratio_to_floor``).

A round makes ``SAMPLES_PER_ROUND`` publishes; ``report.py`` divides the round's time by that
count. ``extra_info`` holds each sample's p50 and p99 (``p50_ns``, ``p99_ns``) over the timed
rounds, how many cores this process (``client_cpu``) and the etcd server (``servers_cpu``) used
meanwhile, and how many the machine's other processes did (``others_cpu``). The median per
round covers more than a sample: also the check of the pool and the wake-up of the sampling
coroutine after each one, so it runs above the p50.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pytest_benchmark")

import grpc.aio
from aetcd import rpc

from shardline import WorkerMetadata, WorkerProxy
from shardline.discovery import DiscoveryEvent, InProcessDiscovery, Subscription
from shardline.discovery.etcd import EtcdDiscovery
from shardline.discovery.local import LocalDiscovery
from shardline.discovery.record import encode_record

from .benchkit import cpu_shares, cpu_snapshot, percentiles

# The test suite's etcd helper, used as is (never skips: a missing etcd raises EtcdUnavailable).
sys.path.append(str(Path(__file__).resolve().parent.parent / "tests"))
from support.etcd_server import EtcdServer

SAMPLES_PER_ROUND = 10
ROUNDS = 100  # 1,000 timed samples per benchmark
WARMUP_ROUNDS = 5
WAIT = 10.0  # seconds an event may take before the benchmark fails
ROTATING = 4  # workers cycling through add, update, drop
STEADY = 2  # workers pooled throughout

Handle = InProcessDiscovery | LocalDiscovery | EtcdDiscovery


def record(uid: uuid.UUID, port: int) -> WorkerMetadata:
    return WorkerMetadata(uid=uid, address=f"127.0.0.1:{port}", pid=os.getpid(), version="bench")


class Plan:
    """The publishes, in order: for each rotating worker in turn, add, update, drop."""

    def __init__(self) -> None:
        self.uids = [uuid.uuid4() for _ in range(ROTATING)]
        self.steady = [record(uuid.uuid4(), 19_000 + n) for n in range(STEADY)]
        self._counter = itertools.count()

    def next(self) -> tuple[str, WorkerMetadata]:
        n = next(self._counter)
        step, slot = n % 3, (n // 3) % ROTATING
        uid = self.uids[slot]
        if step == 0:
            return "worker-added", record(uid, 20_000 + slot)
        return ("worker-updated" if step == 1 else "worker-dropped"), record(uid, 21_000 + slot)


class AppliedProbe:
    """The proxy's discovery stream: passes the subscription's events through, and notes when
    the proxy has applied the one a sample waits for.

    ``WorkerProxy`` applies an event and calls ``__anext__`` again in the same step of its task,
    with no await in between, so entering ``__anext__`` marks the previous event as applied.
    """

    def __init__(self, subscription: Subscription) -> None:
        self._subscription = subscription
        self._last: DiscoveryEvent | None = None
        self._waiting: tuple[str, uuid.UUID, asyncio.Future[float]] | None = None
        self.events = 0

    def expect(self, kind: str, uid: uuid.UUID) -> asyncio.Future[float]:
        """A future set to the time the proxy applies the next ``kind`` event of ``uid``."""
        applied: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._waiting = (kind, uid, applied)
        return applied

    def __aiter__(self) -> AppliedProbe:
        return self

    async def aclose(self) -> None:
        await self._subscription.aclose()

    async def __anext__(self) -> DiscoveryEvent:
        now = time.perf_counter()
        last, self._last = self._last, None
        if last is not None and self._waiting is not None:
            kind, uid, applied = self._waiting
            if last.type == kind and last.metadata.uid == uid:
                self._waiting = None
                applied.set_result(now)
        self._last = await anext(self._subscription)
        self.events += 1
        return self._last


class StubConnection:
    """What the proxy pools for each record: this benchmark never dispatches."""

    def __init__(self, metadata: WorkerMetadata) -> None:
        self.metadata = metadata

    async def dispatch(self, task: Any, *, timeout: float | None = None) -> Any:
        raise AssertionError("the propagation benchmark does not dispatch")


# --- measuring -----------------------------------------------------------------------------


def measure(
    benchmark: Any,
    loop: asyncio.AbstractEventLoop,
    sample: Callable[[], Awaitable[float]],
    *,
    servers: Sequence[int] = (),
    **info: Any,
) -> list[float]:
    """Times ``ROUNDS`` rounds of ``SAMPLES_PER_ROUND`` samples (after ``WARMUP_ROUNDS``);
    records p50/p99 of the samples of the timed rounds in ``extra_info``; returns them."""
    samples: list[float] = []

    async def round_() -> None:
        for _ in range(SAMPLES_PER_ROUND):
            samples.append(await sample())

    before = cpu_snapshot(servers)
    benchmark.pedantic(
        lambda: loop.run_until_complete(round_()),
        rounds=ROUNDS,
        iterations=1,
        warmup_rounds=WARMUP_ROUNDS,
    )
    after = cpu_snapshot(servers)
    timed = samples[WARMUP_ROUNDS * SAMPLES_PER_ROUND :]
    assert len(timed) == ROUNDS * SAMPLES_PER_ROUND
    benchmark.extra_info.update(
        calls_per_round=SAMPLES_PER_ROUND,
        samples=len(timed),
        **percentiles(timed),
        **cpu_shares(before, after),
        **info,
    )
    return timed


async def within(future: asyncio.Future[float], what: str) -> float:
    """``future``'s result, or ``AssertionError`` after ``WAIT`` seconds (a timer handle:
    cheaper than ``asyncio.wait_for``, whose bookkeeping would run inside the timed rounds)."""

    def expire() -> None:
        if not future.done():
            future.set_exception(AssertionError(f"not within {WAIT} s: {what}"))

    timer = asyncio.get_running_loop().call_later(WAIT, expire)
    try:
        return await future
    finally:
        timer.cancel()


# --- the two things timed ------------------------------------------------------------------


class ThroughProxy:
    """A ``WorkerProxy`` following one handle on a fresh namespace, fed by another handle's
    publishes; ``sample()`` times one publish until the proxy has applied it."""

    def __init__(self, publishing: Handle, subscribing: Handle) -> None:
        self._publishing = publishing
        self._subscribing = subscribing
        self._plan = Plan()
        self._published = 0
        self._probe = AppliedProbe(subscribing.subscribe())
        self._proxy = WorkerProxy(discovery=self._probe, connect=StubConnection, quorum=STEADY)

    async def start(self) -> None:
        for metadata in self._plan.steady:
            await self._publishing.publisher.publish("worker-added", metadata)
        await asyncio.wait_for(self._proxy.start(), WAIT)
        assert {m.uid for m in self._proxy.workers} == {m.uid for m in self._plan.steady}

    async def sample(self) -> float:
        """One publish, timed until the proxy has applied it; checks the pool reflects it."""
        kind, metadata = self._plan.next()
        applied = self._probe.expect(kind, metadata.uid)
        publish = self._publishing.publisher.publish
        start = time.perf_counter()
        await publish(kind, metadata)  # type: ignore[arg-type]
        end = await within(applied, f"{kind} of {metadata.uid} applied")
        self._published += 1
        pooled = {m.uid: m for m in self._proxy.workers}
        if kind == "worker-dropped":
            assert metadata.uid not in pooled, f"{metadata.uid} still pooled after its drop"
        else:
            assert pooled.get(metadata.uid) == metadata, f"{kind} of {metadata} not in the pool"
        assert len(pooled) == STEADY + (kind != "worker-dropped")
        return end - start

    def check(self) -> None:
        """One event per publish (the steady workers' replay included), no more, no fewer."""
        expected = STEADY + self._published
        assert self._probe.events == expected, (self._probe.events, expected)

    async def stop(self) -> None:
        await self._proxy.stop()
        await self._probe.aclose()
        await self._publishing.aclose()
        await self._subscribing.aclose()


class RawWatch:
    """A task reading a ``Watch`` stream of a prefix, noting when each awaited change arrives."""

    def __init__(self, stub: Any, prefix: bytes) -> None:
        self._stub = stub
        self._prefix = prefix
        self._waiting: tuple[bytes, bytes | None, asyncio.Future[float]] | None = None
        self._task: asyncio.Task[None] | None = None
        self._created = asyncio.get_running_loop().create_future()

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._read())
        await asyncio.wait_for(self._created, WAIT)

    def expect(self, key: bytes, value: bytes | None) -> asyncio.Future[float]:
        """A future set to the time the watch delivers ``key`` put to ``value`` (or deleted)."""
        seen: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._waiting = (key, value, seen)
        return seen

    async def _read(self) -> None:
        end = self._prefix[:-1] + bytes([self._prefix[-1] + 1])
        call = self._stub.Watch()
        create = rpc.WatchCreateRequest(key=self._prefix, range_end=end)
        await call.write(rpc.WatchRequest(create_request=create))
        try:
            while True:
                response = await call.read()
                now = time.perf_counter()
                assert response is not grpc.aio.EOF, "etcd ended the watch"
                if response.created:
                    self._created.set_result(None)
                for change in response.events:
                    if self._waiting is None:
                        continue
                    key, value, seen = self._waiting
                    deleted = change.type == rpc.Event.DELETE
                    if change.kv.key == key and (
                        deleted if value is None else change.kv.value == value
                    ):
                        self._waiting = None
                        seen.set_result(now)
        finally:
            call.cancel()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


class PutToWatch:
    """etcd's own put → watch: the same records put and deleted with the KV stub on one
    channel, seen through a Watch stream on another, with no shardline code on the way."""

    def __init__(self, etcd: EtcdServer) -> None:
        self._plan = Plan()
        self._prefix = f"/bench/{namespace()}/workers/".encode()
        target = f"127.0.0.1:{etcd.client_port}"
        self._put_channel = grpc.aio.insecure_channel(target)
        self._watch_channel = grpc.aio.insecure_channel(target)
        self._kv = rpc.KVStub(self._put_channel)
        self._watch = RawWatch(rpc.WatchStub(self._watch_channel), self._prefix)

    async def start(self) -> None:
        await self._watch.start()

    async def sample(self) -> float:
        kind, metadata = self._plan.next()
        key = self._prefix + str(metadata.uid).encode()
        value = None if kind == "worker-dropped" else encode_record(metadata)
        seen = self._watch.expect(key, value)
        start = time.perf_counter()
        if value is None:
            reply = await self._kv.DeleteRange(rpc.DeleteRangeRequest(key=key), timeout=WAIT)
            assert reply.deleted == 1
        else:
            await self._kv.Put(rpc.PutRequest(key=key, value=value), timeout=WAIT)
        return await within(seen, f"{kind} of {key!r} watched") - start

    def check(self) -> None:
        pass  # each sample has seen its own change, with its value

    async def stop(self) -> None:
        await self._watch.stop()
        await self._put_channel.close()
        await self._watch_channel.close()


Timed = ThroughProxy | PutToWatch


def run(
    benchmark: Any,
    make: Callable[[], Timed],
    *,
    servers: Sequence[int] = (),
    impl: str,
) -> None:
    """Makes the timed thing on a new event loop, measures it, checks it, stops it."""
    loop = asyncio.new_event_loop()
    timed = loop.run_until_complete(_made(make))
    try:
        loop.run_until_complete(timed.start())
        measure(benchmark, loop, timed.sample, servers=servers, impl=impl)
        timed.check()
    finally:
        loop.run_until_complete(timed.stop())
        loop.close()


async def _made(make: Callable[[], Timed]) -> Timed:
    return make()  # on the running loop: handles and channels belong to it


def namespace() -> str:
    return f"bench-{uuid.uuid4().hex[:12]}"


# --- etcd --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    server = EtcdServer()  # raises EtcdUnavailable, with the reason, if etcd cannot run
    try:
        server.start()
        assert server.process is not None
        yield server
    finally:
        server.close()


def etcd_proxy(etcd: EtcdServer) -> ThroughProxy:
    name = namespace()
    return ThroughProxy(EtcdDiscovery([etcd.endpoint], name), EtcdDiscovery([etcd.endpoint], name))


@pytest.mark.benchmark(group="propagation: etcd")
def test_etcd_discovery_to_pool(benchmark: Any, etcd: EtcdServer) -> None:
    assert etcd.process is not None
    run(benchmark, lambda: etcd_proxy(etcd), servers=[etcd.process.pid], impl="EtcdDiscovery")


@pytest.mark.benchmark(group="propagation: etcd")
def test_etcd_put_to_watch_floor(benchmark: Any, etcd: EtcdServer) -> None:
    assert etcd.process is not None
    run(
        benchmark,
        lambda: PutToWatch(etcd),
        servers=[etcd.process.pid],
        impl="floor: etcd put → watch",
    )


@pytest.mark.benchmark(group="propagation: etcd, interleaved")
def test_etcd_interleaved(benchmark: Any, etcd: EtcdServer) -> None:
    """The two in turn, sample by sample (which goes first alternates), so that both see the
    same moment of the machine: ``extra_info`` has each one's p50/p99 (``by_way``) and the
    median over the pairs of EtcdDiscovery's sample divided by the floor's."""
    assert etcd.process is not None
    loop = asyncio.new_event_loop()

    async def made() -> tuple[PutToWatch, ThroughProxy]:
        return PutToWatch(etcd), etcd_proxy(etcd)

    floor, ours = loop.run_until_complete(made())
    pairs: list[tuple[float, float]] = []

    async def sample() -> float:
        if len(pairs) % 2:
            theirs, mine = await floor.sample(), await ours.sample()
        else:
            mine, theirs = await ours.sample(), await floor.sample()
        pairs.append((theirs, mine))
        return theirs + mine

    try:
        loop.run_until_complete(floor.start())
        loop.run_until_complete(ours.start())
        measure(
            benchmark,
            loop,
            sample,
            servers=[etcd.process.pid],
            impl="EtcdDiscovery and the floor in turn",
        )
        floor.check()
        ours.check()
    finally:
        loop.run_until_complete(floor.stop())
        loop.run_until_complete(ours.stop())
        loop.close()
    timed = pairs[WARMUP_ROUNDS * SAMPLES_PER_ROUND :]
    by_way = {
        name: {key: round(value) for key, value in percentiles([p[i] for p in timed]).items()}
        for i, name in enumerate(["floor: etcd put → watch", "EtcdDiscovery"])
    }
    # the pair's sum is what the round timed: not a latency, so not reported as one
    for key in ("p50_ns", "p99_ns"):
        del benchmark.extra_info[key]
    benchmark.extra_info.update(
        by_way=by_way,
        median_ratio_to_floor=round(statistics.median(mine / theirs for theirs, mine in timed), 3),
    )


# --- one machine -------------------------------------------------------------------------------


@pytest.fixture
def local_directory() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="shardline-bench-") as directory:
        yield Path(directory)


@pytest.mark.benchmark(group="propagation: local")
def test_local_discovery_to_pool(benchmark: Any, local_directory: Path) -> None:
    name = namespace()
    run(
        benchmark,
        lambda: ThroughProxy(
            LocalDiscovery(name, directory=local_directory),
            LocalDiscovery(name, directory=local_directory),
        ),
        impl="LocalDiscovery",
    )


@pytest.mark.benchmark(group="propagation: local")
def test_in_process_discovery_to_pool(benchmark: Any) -> None:
    name = namespace()
    run(
        benchmark,
        lambda: ThroughProxy(InProcessDiscovery(name), InProcessDiscovery(name)),
        impl="floor: InProcessDiscovery",
    )
