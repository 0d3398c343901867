"""`WorkerProxy.stats()` and `measure_latency()`: dispatches by outcome, exhausted calls,
admissions, refreshes, evictions by reason, RPC failures by reason, pool size and the latency
histogram.

A scripted run checks every number, through both balancer protocols (``balancer_protocol``)
and the round-robin native path (whose latency the pool samples, one dispatch in
``DISPATCH_SAMPLE``: ``expected_timed``); Hypothesis checks the counters against a reference
model that replays what the connections and discovery did, in the order they did it, over
concurrent calls with evictions and drops in the middle of them.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any, get_args

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardline import (
    DiscoveryEvent,
    LeastLoadedLoadBalancer,
    NoWorkersAvailable,
    RoundRobinLoadBalancer,
    RpcError,
    TransientRpcError,
    WorkerMetadata,
    WorkerProxy,
)
from shardline.errors import RpcReason
from shardline.pool.context import LoadBalancerContext
from shardline.proxy import EVICTION_REASONS, DispatchLatency, ProxyStats

pytestmark = pytest.mark.usefixtures("balancer_protocol")  # each test through both protocols


def record(n: int, address: str | None = None) -> WorkerMetadata:
    return WorkerMetadata(
        uid=uuid.UUID(int=n), address=address or f"127.0.0.1:{7000 + n}", pid=n, version="1"
    )


class Stream:
    """Discovery fed by the test; each event is logged when the proxy receives it."""

    def __init__(self, log: list[tuple[str, int]]) -> None:
        self.queue: asyncio.Queue[DiscoveryEvent] = asyncio.Queue()
        self.log = log

    def send(self, kind: str, metadata: WorkerMetadata) -> None:
        self.queue.put_nowait(DiscoveryEvent(kind, metadata))  # type: ignore[arg-type]

    async def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
        while True:
            event = await self.queue.get()
            self.log.append((event.type, event.metadata.uid.int))
            yield event


class Scripted:
    """A connection that answers with its next scripted outcome (``ok`` once the script is
    spent), yielding to the loop first, and logs the outcome as it answers."""

    def __init__(self, n: int, log: list[tuple[str, int]]) -> None:
        self.n = n
        self.log = log
        self.script: list[str] = []

    async def dispatch(self, task: Any, *, timeout: float | None = None) -> Any:
        await asyncio.sleep(0)
        outcome = self.script.pop(0) if self.script else "ok"
        self.log.append((outcome, self.n))
        if outcome == "transient":
            raise TransientRpcError(f"worker {self.n} is busy", reason="busy")
        if outcome == "broken":
            raise RpcError(f"worker {self.n} is gone", reason="protocol")
        if outcome == "error":
            raise ValueError(f"worker {self.n} cannot run {task!r}")
        return self.n


class Fleet:
    def __init__(self, balancer: Any = RoundRobinLoadBalancer, lease: int | None = None) -> None:
        self.log: list[tuple[str, int]] = []
        self.connections: dict[int, Scripted] = {}
        self.stream = Stream(self.log)
        self.proxy = WorkerProxy(
            discovery=self.stream,
            loadbalancer=balancer,
            connect=self.connect,
            lease=lease,
            quorum=0,
            # the counts without health and its timing of every dispatch, and every retry
            # allowed (tests/proxy/test_proxy_delivery.py counts those)
            health=None,
            retry_budget=None,
        )

    def connect(self, metadata: WorkerMetadata) -> Scripted:
        connection = Scripted(metadata.uid.int, self.log)
        self.connections[metadata.uid.int] = connection
        return connection

    async def settle(self) -> None:
        while not self.stream.queue.empty():
            await asyncio.sleep(0)
        await asyncio.sleep(0)


def dispatch_paths(proxy: WorkerProxy) -> tuple[int, int]:
    """The proxy's dispatches so far: those of the select and delegate paths, and those the
    pool handed out natively."""
    native = proxy._context.dispatch_counts()[0]
    return proxy.stats().dispatched - native, native


def expected_timed(proxy: WorkerProxy, mark: tuple[int, int] = (0, 0)) -> int:
    """How many dispatches the latency histogram holds since ``mark`` (``dispatch_paths``
    when ``measure_latency`` was called), by its contract: every one of the select and
    delegate paths, and of the native path the pool's Nth, 2Nth… (``DISPATCH_SAMPLE``), but
    every one of least-loaded's native path, which always times."""
    every = 1 if proxy._least_loaded_first else LoadBalancerContext.DISPATCH_SAMPLE
    paths, native = dispatch_paths(proxy)
    return paths - mark[0] + native // every - mark[1] // every


def zero_stats(balancer: str) -> ProxyStats:
    return ProxyStats(
        balancer=balancer,
        dispatched=0,
        transient=0,
        broken=0,
        errors=0,
        exhausted=0,
        workers=0,
        admissions=0,
        refreshes=0,
        not_admitted=0,
        evictions=dict.fromkeys(EVICTION_REASONS, 0),
        rpc_failures=rpc_failures(),
        latency=None,
    )


def rpc_failures(**counts: int) -> dict[str, int]:
    """Every RpcReason at 0 but those given (``shutting_down`` for ``shutting-down``...)."""
    zero = dict.fromkeys(get_args(RpcReason), 0)
    return {**zero, **{name.replace("_", "-"): count for name, count in counts.items()}}


@pytest.fixture(params=[RoundRobinLoadBalancer, LeastLoadedLoadBalancer])
def balancer(request: pytest.FixtureRequest) -> Any:
    """The round-robin balancer (the pool's native path) and one that needs the load."""
    return request.param


async def test_a_scripted_run_counts_every_outcome(balancer: Any) -> None:
    fleet = Fleet(balancer, lease=3)
    proxy = fleet.proxy
    assert proxy.stats() == zero_stats(balancer.__name__)
    await proxy.start()
    for n in (1, 2, 3, 4):  # 4 is refused: the lease is 3
        fleet.stream.send("worker-added", record(n))
    fleet.stream.send("worker-updated", record(2, "127.0.0.1:9002"))  # a refresh
    fleet.stream.send("worker-updated", record(9))  # not pooled: nothing
    await fleet.settle()
    proxy.measure_latency()
    for task in range(5):
        assert await proxy.dispatch(task) in (1, 2, 3)
    fleet.connections[1].script = ["transient"]
    fleet.connections[2].script = ["transient"]
    fleet.connections[3].script = ["transient"]
    with pytest.raises(NoWorkersAvailable):  # each worker once, all busy
        await proxy.dispatch("busy")
    fleet.connections[2].script = ["broken"]
    fleet.connections[3].script = ["broken"]
    fleet.connections[1].script = ["broken"]
    with pytest.raises(NoWorkersAvailable):  # each evicted in turn
        await proxy.dispatch("gone")
    fleet.stream.send("worker-added", record(5))
    fleet.stream.send("worker-added", record(6))
    await fleet.settle()
    fleet.connections[5].script = ["error"]
    fleet.connections[6].script = ["error"]
    with pytest.raises(ValueError, match="cannot run"):
        await proxy.dispatch("bad")
    fleet.stream.send("worker-dropped", record(5))
    fleet.stream.send("worker-dropped", record(6))
    fleet.stream.send("worker-dropped", record(6))  # gone already: counted once
    await fleet.settle()
    with pytest.raises(NoWorkersAvailable):
        await proxy.dispatch("nobody")
    await proxy.stop()

    stats = proxy.stats()
    latency = stats.latency
    assert latency is not None
    assert stats == ProxyStats(
        balancer=balancer.__name__,
        dispatched=5 + 3 + 3 + 1,
        transient=3,
        broken=3,
        errors=1,
        exhausted=3,
        workers=0,
        admissions=3 + 2,
        refreshes=1,
        not_admitted=1,
        evictions={"broken": 3, "dropped": 2, "unconnectable": 0},
        rpc_failures=rpc_failures(busy=3, protocol=3),
        latency=latency,
    )
    assert (latency.bounds[0], latency.bounds[-1]) == (0.000025, 10.0)
    assert len(latency.counts) == len(latency.bounds) + 1
    assert latency.count == expected_timed(proxy)
    assert 0 < latency.sum < 10


class Unexplained(TransientRpcError):
    """A plugin's error that never calls ``RpcError.__init__``: it has no ``reason``."""

    def __init__(self) -> None:
        pass


class OwnWord(TransientRpcError):
    """A plugin's error whose ``reason`` is a word of its own, set past the check."""

    def __init__(self) -> None:
        super().__init__("tired")
        self.reason = "tired"  # type: ignore[assignment]


async def test_an_rpc_error_without_a_known_reason_counts_as_unspecified() -> None:
    fleet = Fleet()
    await fleet.proxy.start()
    fleet.stream.send("worker-added", record(1))
    await fleet.settle()
    connection = fleet.connections[1]
    for error in (Unexplained(), OwnWord()):

        async def fail(task: Any, *, timeout: float | None = None, error: Any = error) -> Any:
            raise error

        connection.dispatch = fail  # type: ignore[method-assign]
        with pytest.raises(NoWorkersAvailable):
            await fleet.proxy.dispatch("x")
    await fleet.proxy.stop()
    assert fleet.proxy.stats().rpc_failures == rpc_failures(unspecified=2)


async def test_latency_is_none_until_asked_and_counts_only_from_then(balancer: Any) -> None:
    fleet = Fleet(balancer)
    await fleet.proxy.start()
    fleet.stream.send("worker-added", record(1))
    await fleet.settle()
    await fleet.proxy.dispatch("before")
    assert fleet.proxy.stats().latency is None
    fleet.proxy.measure_latency()
    fleet.proxy.measure_latency()  # again: nothing changes
    mark = dispatch_paths(fleet.proxy)
    await fleet.proxy.dispatch("after")
    stats = fleet.proxy.stats()
    assert isinstance(stats.latency, DispatchLatency)
    assert stats.dispatched == 2
    # timed: the one after, except on round-robin's native path (not its pool's 8th dispatch)
    timed = mark[1] == 0 or fleet.proxy._least_loaded_first
    assert stats.latency.count == expected_timed(fleet.proxy, mark) == timed
    await fleet.proxy.stop()


async def test_a_balancer_that_raises_no_workers_itself_is_not_counted_as_exhausted() -> None:
    class NoRoute:
        needs_load = False

        def select(self, task: Any, *, context: Any, tried: Any) -> uuid.UUID | None:
            raise NoWorkersAvailable(f"no route for {task!r}")

        async def delegate(self, task: Any, *, context: Any) -> AsyncIterator[uuid.UUID]:
            raise NoWorkersAvailable(f"no route for {task!r}")
            yield uuid.UUID(int=0)  # an async generator, as delegate is

    fleet = Fleet(NoRoute)
    await fleet.proxy.start()
    with pytest.raises(NoWorkersAvailable, match="no route"):
        await fleet.proxy.dispatch("key")
    assert fleet.proxy.stats().exhausted == 0
    await fleet.proxy.stop()


OUTCOMES = st.sampled_from(["ok", "ok", "transient", "broken", "error"])


@settings(max_examples=60)
@given(
    scripts=st.lists(st.lists(OUTCOMES, max_size=4), min_size=1, max_size=4),
    calls=st.integers(1, 8),
    drops=st.lists(st.integers(0, 3), max_size=3),
    measure=st.booleans(),
    balancer=st.sampled_from([RoundRobinLoadBalancer, LeastLoadedLoadBalancer]),
)
def test_counts_match_a_replay_of_what_happened(
    scripts: list[list[str]], calls: int, drops: list[int], measure: bool, balancer: Any
) -> None:
    async def run() -> tuple[list[Any], Fleet]:
        fleet = Fleet(balancer)
        await fleet.proxy.start()
        for n in range(1, len(scripts) + 1):
            fleet.stream.send("worker-added", record(n))
        await fleet.settle()
        for n, script in enumerate(scripts, 1):
            fleet.connections[n].script = list(script)
        if measure:
            fleet.proxy.measure_latency()
        for drop in drops:  # delivered while the calls are under way
            fleet.stream.send("worker-dropped", record(drop % len(scripts) + 1))
        results = await asyncio.gather(
            *(fleet.proxy.dispatch(task) for task in range(calls)), return_exceptions=True
        )
        await fleet.settle()
        await fleet.proxy.stop()
        return results, fleet

    results, fleet = asyncio.run(run())
    # the reference: replay the log, in order, against a set of pooled workers
    pooled: set[int] = set()
    outcomes = {"ok": 0, "transient": 0, "broken": 0, "error": 0}
    evictions = dict.fromkeys(EVICTION_REASONS, 0)
    admissions = 0
    for what, n in fleet.log:
        if what == "worker-added":
            pooled.add(n)
            admissions += 1
        elif what == "worker-dropped":
            evictions["dropped"] += n in pooled
            pooled.discard(n)
        else:
            outcomes[what] += 1
            if what == "broken":
                evictions["broken"] += n in pooled
                pooled.discard(n)
    stats = fleet.proxy.stats()
    assert stats.dispatched == sum(outcomes.values())
    assert (stats.transient, stats.broken, stats.errors) == (
        outcomes["transient"],
        outcomes["broken"],
        outcomes["error"],
    )
    assert stats.exhausted == sum(isinstance(r, NoWorkersAvailable) for r in results)
    assert stats.errors == sum(isinstance(r, ValueError) for r in results)
    assert (stats.admissions, stats.evictions, stats.workers) == (
        admissions,
        evictions,
        len(pooled),
    )
    assert stats.rpc_failures == rpc_failures(
        busy=outcomes["transient"], protocol=outcomes["broken"]
    )
    if measure:
        assert stats.latency is not None
        assert stats.latency.count == expected_timed(fleet.proxy)
    else:
        assert stats.latency is None


async def test_a_registry_scraped_after_a_scripted_run_shows_every_number() -> None:
    prometheus = pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families

    from shardline.metrics import register

    fleet = Fleet(lease=2)
    registry = prometheus.CollectorRegistry()
    register(registry, proxies={"api": fleet.proxy})  # turns the latency histogram on
    await fleet.proxy.start()
    for n in (1, 2, 3):
        fleet.stream.send("worker-added", record(n))
    fleet.stream.send("worker-added", record(1, "127.0.0.1:9001"))
    await fleet.settle()
    for task in range(5):
        await fleet.proxy.dispatch(task)
    fleet.connections[1].script = ["transient"]
    fleet.connections[2].script = ["transient"]
    with pytest.raises(NoWorkersAvailable):
        await fleet.proxy.dispatch("busy")
    fleet.stream.send("worker-dropped", record(2))
    await fleet.settle()
    fleet.connections[1].script = ["error", "broken"]
    with pytest.raises(ValueError, match="cannot run"):
        await fleet.proxy.dispatch("bad")
    with pytest.raises(NoWorkersAvailable):
        await fleet.proxy.dispatch("gone")
    await fleet.proxy.stop()

    text = prometheus.generate_latest(registry).decode()
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    proxy = (("balancer", "RoundRobinLoadBalancer"), ("proxy", "api"))

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted((*proxy, *labels.items()))))]

    dispatched = 5 + 2 + 1 + 1
    assert value("shardline_proxy_dispatches_total") == dispatched
    assert value("shardline_proxy_dispatch_failures_total", reason="transient") == 2
    assert value("shardline_proxy_dispatch_failures_total", reason="broken") == 1
    assert value("shardline_proxy_dispatch_failures_total", reason="error") == 1
    assert value("shardline_proxy_exhausted_total") == 2
    assert value("shardline_proxy_admissions_total") == 2
    assert value("shardline_proxy_refreshes_total") == 1
    assert value("shardline_proxy_not_admitted_total") == 1
    assert value("shardline_proxy_evictions_total", reason="broken") == 1
    assert value("shardline_proxy_evictions_total", reason="dropped") == 1
    for reason, count in rpc_failures(busy=2, protocol=1).items():
        assert value("shardline_proxy_rpc_failures_total", reason=reason) == count
    assert samples[("shardline_proxy_workers", (("proxy", "api"),))] == 0
    histogram = "shardline_proxy_dispatch_duration_seconds"
    timed = expected_timed(fleet.proxy)
    # through delegate every dispatch; on the native path ("gone", its pool's 8th dispatch,
    # is sampled) that one and the retry of "busy" through select
    assert timed == (dispatched if dispatch_paths(fleet.proxy)[1] == 0 else 2)
    assert value(f"{histogram}_count") == timed
    assert value(f"{histogram}_bucket", le="+Inf") == timed
    assert value(f"{histogram}_bucket", le="10.0") == timed
    assert 0 < value(f"{histogram}_sum") < 10
    bounds = [
        float(dict(labels)["le"])
        for name, labels in samples
        if name == f"{histogram}_bucket" and dict(labels)["le"] != "+Inf"
    ]
    assert sorted(bounds) == list(fleet.proxy.stats().latency.bounds)  # type: ignore[union-attr]
