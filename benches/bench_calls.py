"""The whole call (issue 13, section 3): five ways to echo a 40-byte payload to 2 local worker
processes on loopback, side by side in one run.

Ways (each with 2 worker processes of its own, started once for the module and stopped at
its end, also when it fails):

- ``floor``: bare length-prefixed frames over asyncio ``Protocol`` objects, a client
  connection per worker, the calls spread over the two (``call_floor.py``: the servers, and
  ``FloorClient``). The servers answer in order, so the client matches a reply to the
  oldest call waiting on that connection: no request id, no payload encoding (the str's
  UTF-8 bytes), less than any RPC protocol can do. On uvloop when it is installed (the
  ``fast`` extra), on plain asyncio otherwise; the group names say which.
- ``shardline: WorkerProxy + MsgpackConnection``: the MessagePack-RPC transport over TCP, a
  ``WorkerProxy`` (round-robin) following 2 ``shardline worker --transport msgpack`` processes
  (the demo handlers) through ``LocalDiscovery``. Where
  ``shardline.transport.msgpack.connection`` cannot be imported this way is left out: its
  entry in ``by_way`` and the goals say "not available", and its test in ``calls end to end,
  each way alone`` is skipped.
- ``shardline: WorkerProxy + GrpcConnection``: the same with 2 ``shardline worker --transport
  grpc`` processes.
- ``bare grpc.aio unary call``: ``/shardline.Worker/Dispatch`` on a channel per ``shardline
  worker`` (the same two processes as the way above), no shardline in the client.
- ``wool 0.15.7``: ``WorkerPool(spawn=2)`` and a ``@wool.routine`` echo (``wool_echo.py``).
  wool installs a task factory of its own on the loop its pool is entered on, which every
  task made on that loop then goes through, so wool runs on an event loop of its own (of the
  same kind); the other four share one. Its calls take milliseconds: it makes fewer per round
  (its figures are per call all the same).

The worker processes serve on uvloop when it is installed, as ``shardline worker`` does. The
calls through ``WorkerProxy`` and the bare gRPC ones carry a deadline (``timeout=20``
seconds), as a service's calls would; the floor's and wool's do not. Every call's payload is a
distinct 40-character str; the result must equal it. Before any
timing each way must reach both of its worker processes (``whoami``; the floor's servers
answer an empty frame with their pid) and echo correctly.

Groups (``{placement}``: ``separate CPUs``, ``one CPU`` or ``unpinned``, every thread of this
process and of every way's worker processes placed as ``placement.py`` says, because on a
2-core virtual machine a round trip's cost depends on it; ``{loop}``: ``uvloop``, or
``asyncio, uvloop not installed``):

``calls end to end, 1 in flight, {placement}, {loop}``: in each round every way makes a block
of calls one after another (16; wool 2: short blocks, so that the ways of a round see the same
moments of a shared machine), the ways in turn, which goes first rotating from round to round,
each call timed alone (a bare way builds its request before the clock starts and decodes
the reply after it stops). ``by_way``: each way's p50/p99 over all rounds, and its
latency distribution as ``cdf_ns`` (``benchkit.cdf_ns``, which plots.py draws); ``ratios``: per pair
of ways, the median over rounds of the ratio of the two ways' median latencies in that round,
with quartiles, and the ratio of the p50s.

``calls end to end, 16 in flight, {placement}, {loop}``: in each round every way, in turn as
above, has 16 callers on its loop each make 16 calls one after another (wool: 2 each).
``by_way``: calls/s (the median round, and quartiles), this process's CPU per call, and the
worker processes'
CPU per call (theirs only, summed over the rounds; Linux counts it in 10 ms ticks, so it is
coarse for the fast ways); ``ratios``: the median over rounds of the
per-round throughput ratio, with quartiles.

``extra_info["goals"]`` holds the issue's goals with the figure each is judged on (the
median of the per-round ratios) and whether it is met: through ``WorkerProxy`` (the
MessagePack-RPC way), p50 at most 1.5x the floor's and throughput at least 0.7x, and at least
10x the gRPC way and 50x wool (latency and throughput). ``loop`` says which event loop ran.

``calls end to end, each way alone, 1 in flight, {loop}``: one test per way, timing only that
way (64 calls per round, wool 8), for a figure free of the others' effects on the machine.

The number of timed rounds of every test is ``BENCH_CALLS_ROUNDS`` when set (say 3, for a
quick check), otherwise the defaults below.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import multiprocessing
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

pytest.importorskip("pytest_benchmark")
pytest.importorskip("wool")

import wool

from shardline.transport import GrpcConnection

from . import wool_echo
from .benchkit import (
    cdf_ns,
    in_turn,
    percentiles,
    process_cpu,
    ratio_summary,
    spread,
    timed_rounds,
)
from .call_floor import loop_factory
from .echo_calls import FLOOR_SERVER, floor_way, in_flight, latency_ratio, one_at_a_time, payload
from .placement import PLACEMENTS, placed
from .workerkit import (
    GRPC_WORKER,
    MSGPACK_WORKER,
    WAIT,
    Way,
    bare_grpc,
    start_workers,
    through_proxy,
)

try:
    from shardline.transport.msgpack.connection import MsgpackConnection
except ImportError as error:
    MsgpackConnection = None
    MSGPACK_MISSING = f"shardline.transport.msgpack.connection cannot be imported: {error}"
else:
    MSGPACK_MISSING = ""

NEW_LOOP, LOOP = loop_factory()
LOOP_LABEL = LOOP if LOOP == "uvloop" else "asyncio, uvloop not installed"

WORKERS = 2

FLOOR = f"floor: length-prefixed frames, {LOOP}"
MSGPACK = "shardline: WorkerProxy + MsgpackConnection"
GRPC = "shardline: WorkerProxy + GrpcConnection"
BARE = "bare grpc.aio unary call"
WOOL = "wool 0.15.7: WorkerPool(spawn=2) + @wool.routine"
NAMES = [FLOOR, MSGPACK, GRPC, BARE, WOOL]
NOT_AVAILABLE = "not available"


def rounds_or(default: int) -> int:
    rounds = int(os.environ.get("BENCH_CALLS_ROUNDS", default))
    if rounds < 2:
        raise ValueError(f"BENCH_CALLS_ROUNDS must be at least 2 (quartiles), got {rounds}")
    return rounds


SINGLE_CALLS = {"default": 16, WOOL: 2}  # calls per way and round, 1 in flight
SINGLE_ROUNDS = rounds_or(300)
ALONE_CALLS = {"default": 64, WOOL: 8}  # calls per round, each way alone
CALLERS = 16
PER_CALLER = {"default": 16, WOOL: 2}  # calls per caller, way and round, 16 in flight
FLIGHT_ROUNDS = rounds_or(60)
ALONE_ROUNDS = rounds_or(40)
WARMUP_ROUNDS = 2
ROUND_WAIT = 60.0  # seconds one way's block may take before the benchmark fails

# (goal, numerator, denominator, kind, bound): the goal is met when the median per-round
# ratio numerator / denominator (latency at 1 in flight, calls/s at 16) is within the bound
LATENCY_GOALS = [
    ("p50 through WorkerProxy <= 1.5x the floor's", MSGPACK, FLOOR, "<=", 1.5),
    ("p50 of the gRPC way >= 10x WorkerProxy's", GRPC, MSGPACK, ">=", 10.0),
    ("p50 of wool >= 50x WorkerProxy's", WOOL, MSGPACK, ">=", 50.0),
]
THROUGHPUT_GOALS = [
    ("throughput through WorkerProxy >= 0.7x the floor's", MSGPACK, FLOOR, ">=", 0.7),
    ("throughput through WorkerProxy >= 10x the gRPC way's", MSGPACK, GRPC, ">=", 10.0),
    ("throughput through WorkerProxy >= 50x wool's", MSGPACK, WOOL, ">=", 50.0),
]
# the ratios recorded (numerator, denominator), the goals' among them: latency, then calls/s
LATENCY_PAIRS = [
    (MSGPACK, FLOOR),
    (GRPC, MSGPACK),
    (WOOL, MSGPACK),
    (GRPC, FLOOR),
    (BARE, FLOOR),
    (GRPC, BARE),
    (WOOL, FLOOR),
    (WOOL, GRPC),
]
THROUGHPUT_PAIRS = [
    (MSGPACK, FLOOR),
    (MSGPACK, GRPC),
    (MSGPACK, WOOL),
    (GRPC, FLOOR),
    (BARE, FLOOR),
    (BARE, GRPC),
    (GRPC, WOOL),
    (FLOOR, WOOL),
]


# --- the stand: worker processes, loops, ways --------------------------------------------------


@dataclass
class Stand:
    """Every way, ready: ``ways[name]`` and the loop it runs on, ``pids[name]`` its worker
    processes."""

    loop: asyncio.AbstractEventLoop
    wool_loop: asyncio.AbstractEventLoop
    wool_jobs: asyncio.Queue[tuple[Awaitable[Any], asyncio.Future[Any]] | None]
    ways: dict[str, Way] = field(default_factory=dict)
    pids: dict[str, list[int]] = field(default_factory=dict)
    worker_shardline: str = ""

    def run(self, name: str, coroutine: Awaitable[Any]) -> Any:
        """Runs ``coroutine`` to completion on ``name``'s loop (wool's: in ``wool_host``)."""
        if name != WOOL:
            return self.loop.run_until_complete(asyncio.wait_for(coroutine, ROUND_WAIT))
        done = self.wool_loop.create_future()
        self.wool_jobs.put_nowait((coroutine, done))
        return self.wool_loop.run_until_complete(asyncio.wait_for(done, ROUND_WAIT))

    @property
    def available(self) -> list[str]:
        return [name for name in NAMES if name in self.ways]

    @property
    def all_pids(self) -> list[int]:
        return sorted(itertools.chain(*self.pids.values()))


async def wool_way() -> Way:
    async def call(worker: int, payload: Any) -> tuple[Any, float]:
        start = time.perf_counter()
        result = await wool_echo.echo(payload)
        return result, time.perf_counter() - start

    async def whoami() -> set[int]:
        # the pool's round-robin: a few calls reach both processes
        return {await wool_echo.whoami() for _ in range(4 * WORKERS)}

    async def close() -> None:
        pass

    return Way(call, whoami, close)


def check(stand: Stand, name: str) -> None:
    """The way reaches each of its worker processes, and echoes."""
    way = stand.ways[name]
    served = stand.run(name, way.whoami())
    assert served == set(stand.pids[name]), (name, served, stand.pids[name])

    async def echoes() -> None:
        for n in range(4 * WORKERS):
            sent = payload(99, n)
            result, _ = await way.call(n, sent)
            assert result == sent, (name, result, sent)

    stand.run(name, echoes())


@pytest.fixture(scope="module")
def stand() -> Iterator[Stand]:
    with contextlib.ExitStack() as stack:
        floor_workers = stack.enter_context(start_workers(WORKERS, FLOOR_SERVER))
        grpc_workers = stack.enter_context(start_workers(WORKERS, GRPC_WORKER))
        msgpack_workers = None
        if MsgpackConnection is not None:
            msgpack_workers = stack.enter_context(start_workers(WORKERS, MSGPACK_WORKER))
        loop = NEW_LOOP()
        stack.callback(loop.close)
        wool_loop = NEW_LOOP()
        stack.callback(wool_loop.close)
        jobs: asyncio.Queue[tuple[Awaitable[Any], asyncio.Future[Any]] | None] = asyncio.Queue()
        s = Stand(loop, wool_loop, jobs, worker_shardline=grpc_workers.shardline_file)
        others = {child.pid for child in multiprocessing.active_children()}
        stack.callback(_stop_pool_children, others)
        ready = wool_loop.create_future()
        host = wool_loop.create_task(wool_host(jobs, ready))
        wool_loop.run_until_complete(
            asyncio.wait([ready, host], timeout=WAIT, return_when=asyncio.FIRST_COMPLETED)
        )
        if host.done():
            host.result()  # raises what stopped wool's pool from starting
        assert ready.done(), f"wool's pool did not start within {WAIT} s"

        def leave_pool() -> None:
            jobs.put_nowait(None)
            wool_loop.run_until_complete(asyncio.wait_for(host, WAIT))

        stack.callback(leave_pool)
        made: list[tuple[str, Callable[[], Awaitable[Way]], list[int]]] = [
            (FLOOR, functools.partial(floor_way, floor_workers), floor_workers.pids),
            (
                GRPC,
                functools.partial(through_proxy, grpc_workers, GrpcConnection),
                grpc_workers.pids,
            ),
            (BARE, functools.partial(bare_grpc, grpc_workers), grpc_workers.pids),
        ]
        if msgpack_workers is not None:
            made.append(
                (
                    MSGPACK,
                    functools.partial(through_proxy, msgpack_workers, MsgpackConnection),
                    msgpack_workers.pids,
                )
            )
        for name, make, pids in made:
            s.ways[name] = loop.run_until_complete(asyncio.wait_for(make(), WAIT))
            stack.callback(loop.run_until_complete, s.ways[name].close())
            s.pids[name] = pids
        s.ways[WOOL] = s.run(WOOL, wool_way())
        children = {process.pid for process in multiprocessing.active_children()}
        s.pids[WOOL] = sorted(s.run(WOOL, s.ways[WOOL].whoami()))
        assert len(s.pids[WOOL]) == WORKERS, s.pids[WOOL]
        assert set(s.pids[WOOL]) <= children, (s.pids[WOOL], children)
        for name in s.available:
            check(s, name)
        yield s
        for workers in (floor_workers, grpc_workers, msgpack_workers):
            for process in workers.processes if workers else []:
                assert process.poll() is None, f"worker {process.pid} died during the benchmark"


async def wool_host(
    jobs: asyncio.Queue[tuple[Awaitable[Any], asyncio.Future[Any]] | None],
    ready: asyncio.Future[None],
) -> None:
    """Enters a ``WorkerPool(spawn=2)``, then runs each job of ``jobs`` inside it until a
    ``None``: wool's routines find their pool through context variables, which hold only in
    the task that entered the pool and the tasks it starts."""
    async with wool.WorkerPool(spawn=WORKERS):
        ready.set_result(None)
        while (job := await jobs.get()) is not None:
            coroutine, done = job
            try:
                result = await coroutine
            except Exception as error:
                if not done.done():
                    done.set_exception(error)
            else:
                if not done.done():
                    done.set_result(result)


def _stop_pool_children(others: set[int]) -> None:
    """wool's worker processes, should leaving its pool have left any behind: the
    ``multiprocessing`` children of this process but ``others`` (there before the pool)."""
    for child in multiprocessing.active_children():
        if child.pid in others:
            continue
        child.terminate()
        child.join(10)
        if child.is_alive():
            child.kill()
            child.join()


# --- figures -----------------------------------------------------------------------------------


def goals(
    table: list[tuple[str, str, str, str, float]], ratios: dict[str, dict[str, float]]
) -> dict[str, Any]:
    """Each goal, its bound, the median per-round ratio it is judged on, and whether it is met
    ("not available" while a way is missing)."""
    judged: dict[str, Any] = {}
    for text, numerator, denominator, kind, bound in table:
        key = ratio_key(numerator, denominator)
        if key not in ratios:
            judged[text] = {"bound": bound, "measured": NOT_AVAILABLE, "met": NOT_AVAILABLE}
            continue
        measured = ratios[key]["median"]
        met = measured <= bound if kind == "<=" else measured >= bound
        judged[text] = {"bound": bound, "ratio": key, "measured": measured, "met": met}
    return judged


def ratio_key(a: str, b: str) -> str:
    return f"{a} / {b}"


def measure(benchmark: Any, stand: Stand, round_: Callable[[], None], rounds: int) -> None:
    """``benchkit.timed_rounds`` over every way's worker processes, recording also the loop and
    where the workers import shardline from."""
    timed_rounds(benchmark, round_, rounds, WARMUP_ROUNDS, lambda: stand.all_pids)
    benchmark.extra_info.update(loop=LOOP, worker_shardline=stand.worker_shardline)


def calls_of(name: str, table: dict[str, int]) -> int:
    return table.get(name, table["default"])


# --- 1 in flight --------------------------------------------------------------------------------


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_calls_1_in_flight(benchmark: Any, stand: Stand, placement: str) -> None:
    names = stand.available
    latencies: dict[str, list[list[float]]] = {name: [] for name in names}
    numbers = itertools.count()
    turns = itertools.count()

    def round_() -> None:
        for name in in_turn(names, next(turns)):
            block = [payload(0, next(numbers)) for _ in range(calls_of(name, SINGLE_CALLS))]
            latencies[name].append(stand.run(name, one_at_a_time(stand.ways[name], block)))

    benchmark.group = f"calls end to end, 1 in flight, {placement}, {LOOP_LABEL}"
    with placed(stand.all_pids, placement):
        measure(benchmark, stand, round_, SINGLE_ROUNDS)
    kept = {name: rounds[-SINGLE_ROUNDS:] for name, rounds in latencies.items()}
    samples = {name: list(itertools.chain(*kept[name])) for name in names}
    by_way: dict[str, Any] = {
        name: {
            **percentiles(samples[name]),
            "cdf_ns": cdf_ns(samples[name]),
            "calls": calls_of(name, SINGLE_CALLS) * SINGLE_ROUNDS,
        }
        for name in names
    }
    ratios: dict[str, dict[str, float]] = {}
    for a, b in LATENCY_PAIRS:
        if a in kept and b in kept:
            ratios[ratio_key(a, b)] = latency_ratio(
                kept[a], kept[b], by_way[a]["p50_ns"], by_way[b]["p50_ns"]
            )
    by_way.update({name: NOT_AVAILABLE for name in NAMES if name not in names})
    benchmark.extra_info.update(
        impl="five ways in turn, a block of calls each per round, 1 caller",
        calls_per_round=sum(calls_of(name, SINGLE_CALLS) for name in names),
        by_way=by_way,
        ratios=ratios,
        goals=goals(LATENCY_GOALS, ratios),
        msgpack_missing=MSGPACK_MISSING,
    )


# --- 16 in flight -------------------------------------------------------------------------------


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_calls_16_in_flight(benchmark: Any, stand: Stand, placement: str) -> None:
    names = stand.available
    per_s: dict[str, list[float]] = {name: [] for name in names}
    client_cpu: dict[str, list[float]] = {name: [] for name in names}
    server_cpu: dict[str, list[float]] = {name: [] for name in names}
    numbers = itertools.count()
    turns = itertools.count()

    def round_() -> None:
        for name in in_turn(names, next(turns)):
            per_caller = calls_of(name, PER_CALLER)
            blocks = [
                [payload(c, next(numbers)) for _ in range(per_caller)] for c in range(CALLERS)
            ]
            servers0 = sum(map(process_cpu, stand.pids[name]))
            cpu0 = time.process_time()
            wall = stand.run(name, in_flight(stand.ways[name], blocks))
            client_cpu[name].append(time.process_time() - cpu0)
            server_cpu[name].append(sum(map(process_cpu, stand.pids[name])) - servers0)
            per_s[name].append(CALLERS * per_caller / wall)

    benchmark.group = f"calls end to end, 16 in flight, {placement}, {LOOP_LABEL}"
    with placed(stand.all_pids, placement):
        measure(benchmark, stand, round_, FLIGHT_ROUNDS)
    kept = {name: samples[-FLIGHT_ROUNDS:] for name, samples in per_s.items()}
    by_way: dict[str, Any] = {}
    for name in names:
        calls = CALLERS * calls_of(name, PER_CALLER) * FLIGHT_ROUNDS
        by_way[name] = {
            "calls_per_s": spread(kept[name]),
            "client_cpu_us_per_call": round(
                sum(client_cpu[name][-FLIGHT_ROUNDS:]) / calls * 1e6, 1
            ),
            "servers_cpu_us_per_call": round(
                sum(server_cpu[name][-FLIGHT_ROUNDS:]) / calls * 1e6, 1
            ),
        }
    ratios: dict[str, dict[str, float]] = {}
    for a, b in THROUGHPUT_PAIRS:
        if a in kept and b in kept:
            ratios[ratio_key(a, b)] = ratio_summary(
                [x / y for x, y in zip(kept[a], kept[b], strict=True)]
            )
    by_way.update({name: NOT_AVAILABLE for name in NAMES if name not in names})
    benchmark.extra_info.update(
        impl="five ways in turn, 16 callers each per round",
        calls_per_round=sum(CALLERS * calls_of(name, PER_CALLER) for name in names),
        by_way=by_way,
        ratios=ratios,
        goals=goals(THROUGHPUT_GOALS, ratios),
        msgpack_missing=MSGPACK_MISSING,
    )


# --- each way alone -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_one_way_alone(benchmark: Any, stand: Stand, name: str) -> None:
    if name not in stand.ways:
        pytest.skip(f"{name}: {NOT_AVAILABLE} ({MSGPACK_MISSING})")
    way = stand.ways[name]
    calls = calls_of(name, ALONE_CALLS)
    timed: list[list[float]] = []
    numbers = itertools.count()

    def round_() -> None:
        block = [payload(0, next(numbers)) for _ in range(calls)]
        timed.append(stand.run(name, one_at_a_time(way, block)))

    benchmark.group = f"calls end to end, each way alone, 1 in flight, {LOOP_LABEL}"
    measure(benchmark, stand, round_, ALONE_ROUNDS)
    samples = list(itertools.chain(*timed[-ALONE_ROUNDS:]))
    benchmark.extra_info.update(
        impl=name, calls_per_round=calls, samples=len(samples), **percentiles(samples)
    )
