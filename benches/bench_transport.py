"""Dispatch over gRPC to 4 local worker processes (issue 4): throughput and latency.

Four ``python -m shardline worker --transport grpc`` processes (this interpreter, the demo
handlers, announced through ``LocalDiscovery`` in a temporary directory; ``workerkit.py``) are
started once for the module. A call is an ``echo`` of a small JSON payload unique to the call;
the result must equal the payload, checked for every call. Per number of concurrent callers
(1, 16, 64: each caller awaits its calls one after another, the callers run together on one
event loop), one group with:

- ``floor: grpc.aio unary call``: ``/shardline.Worker/Dispatch`` called with a multicallable of
  a bare ``grpc.aio`` channel per worker, the request's JSON bytes built before the clock
  starts and the reply decoded after it stops;
- ``GrpcConnection.dispatch``: one connection per worker, no proxy;
- ``WorkerProxy.dispatch``: a proxy following the workers through ``LocalDiscovery``, with its
  default round-robin balancer and ``GrpcConnection``.

The floor and the direct connection send caller ``c``'s ``k``-th call to worker ``(c + k) % 4``,
so all three spread their calls over the same four workers. Before timing, ``whoami`` through
each path must reach all four worker processes.

On a shared machine a drift of a few seconds can hide a difference of a few percent between
separate benchmarks, so ``dispatch over gRPC, the three ways interleaved`` (1 and 16 callers)
has each caller make one call through each of the three in turn (which goes first rotates):
``extra_info`` holds each way's p50/p99 (``by_way``) and the median, over these triples, of the
proxy's (or direct connection's) latency divided by the floor's (``median_ratio_to_floor``).

A round makes ``callers x calls per caller`` calls; ``report.py`` divides the round's time by
that count, so its "per call" figure is the inverse of the throughput. ``extra_info`` holds the
per-call latency's p50 and p99 over the timed rounds (``p50_ns``, ``p99_ns``; a call's latency
is what its caller waited, queueing in this process included), the throughput of the median
round (``calls_per_s``), how many cores this process (``client_cpu``) and the worker processes
(``servers_cpu``) used meanwhile, and how many the machine's other processes did
(``others_cpu``).
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

import pytest

pytest.importorskip("pytest_benchmark")

from shardline.transport import MAX_MESSAGE_BYTES, GrpcConnection, Task

from .benchkit import cpu_shares, cpu_snapshot, percentiles
from .workerkit import GRPC_WORKER, WAIT, Way, Workers, bare_grpc, start_workers, through_proxy

WORKERS = 4
WARMUP_ROUNDS = 3
# callers -> (calls per caller per round, rounds): 2,000-4,000 timed calls each
SHAPES = {1: (20, 100), 16: (8, 25), 64: (5, 12)}


@pytest.fixture(scope="module")
def workers() -> Iterator[Workers]:
    """Four worker processes on free loopback ports; stopped (SIGTERM, then SIGKILL) after."""
    with start_workers(WORKERS, GRPC_WORKER) as started:
        yield started


# --- the three ways to make a call (the other two are workerkit's) ------------------------------


async def direct(workers: Workers) -> Way:
    # A limit one byte under the default: channels of their own, not the proxy's (connections
    # share a channel only when address, credentials and limit are the same).
    connections = [
        GrpcConnection(r, max_message_bytes=MAX_MESSAGE_BYTES - 1) for r in workers.records
    ]

    async def call(worker: int, payload: Any) -> tuple[Any, float]:
        start = time.perf_counter()
        result = await connections[worker % WORKERS].dispatch(Task("echo", payload), timeout=WAIT)
        return result, time.perf_counter() - start

    async def whoami() -> set[int]:
        return {(await c.dispatch(Task("whoami"), timeout=WAIT))["pid"] for c in connections}

    async def close() -> None:
        for connection in connections:
            connection.close()

    return Way(call, whoami, close)


async def grpc_proxy(workers: Workers) -> Way:
    return await through_proxy(workers, GrpcConnection)


WAYS = {
    "floor: grpc.aio unary call": bare_grpc,
    "GrpcConnection.dispatch": direct,
    "WorkerProxy.dispatch": grpc_proxy,
}


def run_rounds(
    benchmark: Any,
    loop: asyncio.AbstractEventLoop,
    workers: Workers,
    ways: Sequence[Way],
    caller: Callable[[int], Awaitable[None]],
    *,
    callers: int,
    rounds: int,
    check_after: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """Times ``rounds`` rounds (after ``WARMUP_ROUNDS``) of ``callers`` concurrent
    ``caller(c)``, then runs ``check_after`` and closes the ways. Returns the median round's
    time and the CPU figures for ``extra_info``."""
    round_times: list[float] = []

    async def round_() -> None:
        if callers == 1:
            await caller(0)
        else:
            await asyncio.gather(*(caller(c) for c in range(callers)))

    def timed_round() -> None:
        start = time.perf_counter()
        loop.run_until_complete(asyncio.wait_for(round_(), WAIT))
        round_times.append(time.perf_counter() - start)

    try:
        before = cpu_snapshot(workers.pids)
        benchmark.pedantic(timed_round, rounds=rounds, iterations=1, warmup_rounds=WARMUP_ROUNDS)
        after = cpu_snapshot(workers.pids)
        check_after()
    finally:
        for way in ways:
            loop.run_until_complete(way.close())
    for process in workers.processes:
        assert process.poll() is None, f"worker {process.pid} died during the benchmark"
    return {
        "median_round_s": statistics.median(round_times[WARMUP_ROUNDS:]),
        **cpu_shares(before, after),
        "worker_shardline": workers.shardline_file,
    }


def check_reach(loop: asyncio.AbstractEventLoop, workers: Workers, ways: Sequence[Way]) -> None:
    """Each way must reach all four worker processes."""
    for way in ways:
        served = loop.run_until_complete(way.whoami())
        assert served == set(workers.pids), (served, workers.pids)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """A new event loop for the test (gRPC channels belong to the loop they are made on)."""
    loop = asyncio.new_event_loop()
    try:
        yield loop
    finally:
        loop.close()


@pytest.mark.parametrize("impl", list(WAYS))
@pytest.mark.parametrize("callers", list(SHAPES))
def test_echo_dispatch(
    benchmark: Any, workers: Workers, loop: asyncio.AbstractEventLoop, callers: int, impl: str
) -> None:
    benchmark.group = f"dispatch over gRPC, {callers} caller{'s' if callers > 1 else ''}"
    per_caller, rounds = SHAPES[callers]
    calls = callers * per_caller
    way = loop.run_until_complete(WAYS[impl](workers))
    check_reach(loop, workers, [way])
    timed: list[float] = []
    numbers = itertools.count()

    async def caller(c: int) -> None:
        for k in range(per_caller):
            payload = {"caller": c, "n": next(numbers)}
            result, elapsed = await way.call(c + k, payload)
            assert result == payload, (result, payload)
            timed.append(elapsed)

    info = run_rounds(benchmark, loop, workers, [way], caller, callers=callers, rounds=rounds)
    samples = timed[WARMUP_ROUNDS * calls :]
    assert len(samples) == rounds * calls
    benchmark.extra_info.update(
        impl=impl,
        callers=callers,
        calls_per_round=calls,
        samples=len(samples),
        **percentiles(samples),
        calls_per_s=round(calls / info.pop("median_round_s")),
        **info,
    )


# callers -> (calls per caller per round through each way, rounds)
INTERLEAVED = {1: (10, 70), 16: (4, 12)}
ORDERS = [(0, 1, 2), (1, 2, 0), (2, 0, 1)]  # which way goes first rotates


@pytest.mark.parametrize("callers", list(INTERLEAVED))
def test_echo_dispatch_interleaved(
    benchmark: Any, workers: Workers, loop: asyncio.AbstractEventLoop, callers: int
) -> None:
    """The three ways in turn, call by call (the order rotating), each caller making one call
    through each before the next: the ratio of each triple's proxy (or direct) call to its
    floor call, whose median a drift of the machine cannot skew.

    A call to the worker that has just answered is faster than one to a worker that has been
    idle (by about a quarter here: the idle process has to be woken and scheduled), so with
    one caller the three calls of a triple go to the same worker: the one the proxy's
    round-robin picks next, which follows the pool's admission order. One ``whoami`` through
    the proxy tells where it stands before timing, and one after timing must find it where
    that prediction says. With 16 callers every worker is kept busy, and the floor and the
    direct connection target workers as in ``test_echo_dispatch``."""
    benchmark.group = "dispatch over gRPC, the three ways interleaved"
    per_caller, rounds = INTERLEAVED[callers]
    names = list(WAYS)
    ways = [loop.run_until_complete(make(workers)) for make in WAYS.values()]
    check_reach(loop, workers, ways)
    proxy = ways[names.index("WorkerProxy.dispatch")].proxy
    assert proxy is not None
    # the proxy's rotation, as indexes into workers.records
    rotation = [[r.uid for r in workers.records].index(m.uid) for m in proxy.workers]

    def proxy_position() -> int:
        """Where in ``rotation`` the proxy's next dispatch goes (found by making one)."""
        answer = loop.run_until_complete(proxy.dispatch(Task("whoami"), timeout=WAIT))
        return rotation.index(workers.pids.index(answer["pid"]))

    first = proxy_position() + 1
    triples: list[list[float]] = []
    numbers = itertools.count()

    async def caller(c: int) -> None:
        for k in range(per_caller):
            triple = [0.0] * len(ways)
            # the worker the proxy takes for this triple (one caller), or spread as elsewhere
            target = rotation[(first + len(triples)) % WORKERS] if callers == 1 else c + k
            for i in ORDERS[len(triples) % len(ORDERS)]:
                payload = {"caller": c, "n": next(numbers)}
                result, triple[i] = await ways[i].call(target, payload)
                assert result == payload, (result, payload)
            triples.append(triple)

    def aligned() -> None:
        if callers == 1:
            assert proxy_position() == (first + len(triples)) % WORKERS, "proxy out of step"

    info = run_rounds(
        benchmark, loop, workers, ways, caller, callers=callers, rounds=rounds, check_after=aligned
    )
    info.pop("median_round_s")
    timed = triples[WARMUP_ROUNDS * callers * per_caller :]
    assert len(timed) == rounds * callers * per_caller
    by_way = {
        name: {key: round(value) for key, value in percentiles([t[i] for t in timed]).items()}
        for i, name in enumerate(names)
    }
    ratios = {
        name: round(statistics.median(t[i] / t[0] for t in timed), 3)
        for i, name in enumerate(names)
        if i
    }
    benchmark.extra_info.update(
        impl=f"the three in turn, {callers} caller{'s' if callers > 1 else ''}",
        callers=callers,
        calls_per_round=len(ways) * callers * per_caller,
        samples=len(timed),
        by_way=by_way,
        median_ratio_to_floor=ratios,
        **info,
    )
