"""The echo calls that ``bench_calls.py`` and ``bench_tls.py`` time over a ``Way``: the payloads,
the floor's way, calls one at a time, and callers in flight at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from .call_floor import FloorClient
from .workerkit import Way, Workers

PAYLOAD_CHARS = 40


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
