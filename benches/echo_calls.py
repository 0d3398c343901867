"""The echo calls that ``bench_calls.py`` and ``bench_tls.py`` time over a ``Way``: the payloads,
the floor's way, calls one at a time, callers in flight at once, and the ratio of two ways'
latencies."""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .benchkit import ratio_summary
from .call_floor import FloorClient
from .workerkit import Way, Workers

PAYLOAD_CHARS = 40
FLOOR_SERVER = (sys.executable, str(Path(__file__).with_name("call_floor.py")))  # floor_way's


def payload(caller: int, n: int) -> str:
    """The ``n``-th distinct payload of caller ``caller``: ``PAYLOAD_CHARS`` characters."""
    return f"caller {caller:02d} call {n:010d} ".ljust(PAYLOAD_CHARS, ".")


async def floor_way(workers: Workers) -> Way:
    """The floor: ``FloorClient``'s bare frames to the ``call_floor.py`` servers ``workers``;
    the str is encoded before the clock starts and the reply decoded after it stops."""
    client = await FloorClient.connect([r.address for r in workers.records])

    async def call(worker: int, sent: Any) -> tuple[Any, float]:
        body = sent.encode()
        start = time.perf_counter()
        reply = await client.call(worker, body)
        elapsed = time.perf_counter() - start
        return reply.decode(), elapsed

    async def whoami() -> set[int]:
        return set(await client.pids())

    async def close() -> None:
        client.close()

    return Way(call, whoami, close)


async def one_at_a_time(way: Way, block: Sequence[str]) -> list[float]:
    """Echoes each payload of ``block`` in turn (call ``n`` to worker ``n``); the latencies."""
    latencies = []
    for n, sent in enumerate(block):
        result, elapsed = await way.call(n, sent)
        assert result == sent, (result, sent)
        latencies.append(elapsed)
    return latencies


async def in_flight(way: Way, blocks: Sequence[Sequence[str]]) -> float:
    """Caller ``c`` echoes ``blocks[c]`` one call after another, all callers at once; returns
    the seconds from the first call to the last reply."""

    async def caller(c: int) -> None:
        for k, sent in enumerate(blocks[c]):
            result, _ = await way.call(c + k, sent)
            assert result == sent, (result, sent)

    start = time.perf_counter()
    await asyncio.gather(*(caller(c) for c in range(len(blocks))))
    return time.perf_counter() - start


def latency_ratio(
    a_rounds: Sequence[Sequence[float]],
    b_rounds: Sequence[Sequence[float]],
    a_p50: float,
    b_p50: float,
) -> dict[str, float]:
    """Way a's latency against way b's: the summary of the per-round ratios of their median
    latencies, and ``of_p50s``, the ratio of their p50s over all rounds."""
    per_round = [
        statistics.median(x) / statistics.median(y) for x, y in zip(a_rounds, b_rounds, strict=True)
    ]
    return {**ratio_summary(per_round), "of_p50s": round(a_p50 / b_p50, 3)}
