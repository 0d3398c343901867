"""Streaming (issue 26, item 3): the items per second of a streamed call against the calls per
second of dispatch, through ``WorkerProxy`` and the MessagePack-RPC transport, and against
wool 0.15.7's streaming of an async generator routine.

- ``shardline``: one worker process (``stream_worker.py``: ``lines``, an async generator of
  40-character str, and ``echo``) on loopback TCP, on uvloop when installed, and a
  ``WorkerProxy`` (round-robin, the default health and deadline) following it through
  ``LocalDiscovery``, on the same kind of loop. In each round, one after another: a stream of
  ``STREAM_ITEMS`` items read as fast as they come (``proxy.stream``, the default window of
  64), ``CALLS`` echoes of a 40-character str one after another (1 in flight), and the same
  number from 16 callers at once (16 in flight). Items/s and calls/s per round; the ratio of
  stream to dispatch per round.
- ``wool``: ``WorkerPool(spawn=1)`` and a ``@wool.routine`` async generator yielding the same
  items (``wool_stream.py``), ``WOOL_ITEMS`` per stream: wool pulls each item with a request
  of its own. Items/s per round. wool installs a task factory of its own on the loop its pool
  is entered on, so it runs on a loop of its own, in a test of its own.

Groups: ``streaming: shardline stream vs dispatch`` and ``streaming: wool stream``; the figures
(median and quartiles over rounds) are in ``extra_info``. ``BENCH_STREAM_ROUNDS`` sets the
rounds (default 7).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pytest_benchmark")
pytest.importorskip("wool")

import wool

from shardline import WorkerMetadata, WorkerProxy
from shardline.discovery.record import decode_record
from shardline.transport import Task, connect
from shardline.workers import DiscoveryEvent

from . import wool_stream
from .call_floor import loop_factory

STREAM_ITEMS = 20_000
CALLS = 2_000
IN_FLIGHT = 16
WOOL_ITEMS = 1_000
ROUNDS = int(os.environ.get("BENCH_STREAM_ROUNDS", "7"))
WAIT = 60.0
ROOT = Path(__file__).resolve().parent.parent

NEW_LOOP, LOOP = loop_factory()


def summary(samples: list[float]) -> dict[str, float]:
    q1, _, q3 = statistics.quantiles(samples, n=4) if len(samples) > 1 else samples * 3
    return {"median": round(statistics.median(samples), 3), "q1": round(q1, 3), "q3": round(q3, 3)}


async def announced(record: WorkerMetadata) -> AsyncIterator[DiscoveryEvent]:
    yield DiscoveryEvent("worker-added", record)
    await asyncio.Event().wait()


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerMetadata]:
    """The worker process, serving; stopped at the module's end."""
    directory = tmp_path_factory.mktemp("stream")
    loop = NEW_LOOP()
    try:
        process = loop.run_until_complete(
            asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "benches.stream_worker",
                str(directory),
                f"bench-stream-{uuid.uuid4().hex}",
                stdout=asyncio.subprocess.PIPE,
                cwd=ROOT,
            )
        )
        assert process.stdout is not None
        line = loop.run_until_complete(asyncio.wait_for(process.stdout.readline(), WAIT))
        assert line, "the stream worker exited before it served"
        yield decode_record(line.rstrip(b"\n"))
        assert process.returncode is None, "the worker died during the benchmark"
        process.terminate()
        loop.run_until_complete(asyncio.wait_for(process.communicate(), WAIT))
    finally:
        loop.close()


async def stream_rate(proxy: WorkerProxy) -> float:
    start = time.perf_counter()
    items = [item async for item in proxy.stream(Task("lines", STREAM_ITEMS), timeout=WAIT)]
    took = time.perf_counter() - start
    assert len(items) == STREAM_ITEMS
    assert items[-1].startswith(f"item {STREAM_ITEMS - 1:010d}")
    return len(items) / took


async def dispatch_rate(proxy: WorkerProxy, callers: int) -> float:
    async def caller(c: int) -> None:
        for n in range(CALLS // callers):
            sent = f"caller {c:02d} call {n:010d} ".ljust(40, ".")
            assert await proxy.dispatch(Task("echo", sent), timeout=WAIT) == sent

    start = time.perf_counter()
    await asyncio.gather(*(caller(c) for c in range(callers)))
    return CALLS // callers * callers / (time.perf_counter() - start)


def test_shardline_stream_against_dispatch(benchmark: Any, worker: WorkerMetadata) -> None:
    benchmark.group = "streaming: shardline stream vs dispatch"
    loop = NEW_LOOP()
    figures: dict[str, list[float]] = {
        "stream items/s": [],
        "dispatch calls/s, 1 in flight": [],
        f"dispatch calls/s, {IN_FLIGHT} in flight": [],
    }
    try:
        proxy = WorkerProxy(discovery=announced(worker), connect=connect)
        loop.run_until_complete(proxy.start())

        def round_() -> None:
            run = loop.run_until_complete
            figures["stream items/s"].append(run(stream_rate(proxy)))
            figures["dispatch calls/s, 1 in flight"].append(run(dispatch_rate(proxy, 1)))
            figures[f"dispatch calls/s, {IN_FLIGHT} in flight"].append(
                run(dispatch_rate(proxy, IN_FLIGHT))
            )

        benchmark.pedantic(round_, rounds=ROUNDS, warmup_rounds=1, iterations=1)
        loop.run_until_complete(proxy.stop())
    finally:
        loop.close()
    warm = {name: samples[-ROUNDS:] for name, samples in figures.items()}
    streams = warm["stream items/s"]
    ratios = {
        f"stream items/s / {name}": summary([s / d for s, d in zip(streams, samples, strict=True)])
        for name, samples in warm.items()
        if name != "stream items/s"
    }
    benchmark.extra_info.update(
        loop=LOOP,
        stream_items=STREAM_ITEMS,
        calls=CALLS,
        figures={name: summary(samples) for name, samples in warm.items()},
        ratios=ratios,
    )


def test_wool_stream(benchmark: Any) -> None:
    benchmark.group = "streaming: wool stream"
    loop = NEW_LOOP()
    jobs: asyncio.Queue[Awaitable[float] | None] = asyncio.Queue()
    results: asyncio.Queue[float | BaseException] = asyncio.Queue()

    async def host(ready: asyncio.Future[None]) -> None:
        # wool's routines find their pool through context variables, which hold only in the
        # task that entered the pool: every round runs here
        async with wool.WorkerPool(spawn=1):
            ready.set_result(None)
            while (job := await jobs.get()) is not None:
                try:
                    results.put_nowait(await job)
                except Exception as error:
                    results.put_nowait(error)

    async def wool_rate() -> float:
        start = time.perf_counter()
        items = [item async for item in wool_stream.lines(WOOL_ITEMS)]
        took = time.perf_counter() - start
        assert len(items) == WOOL_ITEMS
        assert items[-1].startswith(f"item {WOOL_ITEMS - 1:010d}")
        return len(items) / took

    rates: list[float] = []
    try:
        ready = loop.create_future()
        hosting = loop.create_task(host(ready))
        loop.run_until_complete(
            asyncio.wait([ready, hosting], timeout=WAIT, return_when=asyncio.FIRST_COMPLETED)
        )
        if hosting.done():
            hosting.result()
        assert ready.done(), f"wool's pool did not start within {WAIT} s"

        def round_() -> None:
            jobs.put_nowait(wool_rate())
            rate = loop.run_until_complete(asyncio.wait_for(results.get(), WAIT))
            if isinstance(rate, BaseException):
                raise rate
            rates.append(rate)

        benchmark.pedantic(round_, rounds=ROUNDS, warmup_rounds=1, iterations=1)
        jobs.put_nowait(None)
        loop.run_until_complete(asyncio.wait_for(hosting, WAIT))
    finally:
        loop.close()
    benchmark.extra_info.update(
        loop=LOOP, stream_items=WOOL_ITEMS, figures={"stream items/s": summary(rates[-ROUNDS:])}
    )
