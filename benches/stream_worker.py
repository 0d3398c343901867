"""The worker process ``bench_streaming.py`` streams from: ``python -m benches.stream_worker
DIRECTORY NAMESPACE`` serves ``lines`` (an async generator of ``n`` 40-character str) and
``echo`` over MessagePack-RPC on loopback TCP, on uvloop when installed, announced through
LocalDiscovery under DIRECTORY; prints its record once it serves, and stops on SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any

from shardline.discovery.local import LocalDiscovery
from shardline.discovery.record import encode_record
from shardline.transport.event_loop import run
from shardline.transport.msgpack.server import serve_msgpack

ITEM_CHARS = 40


async def lines(n: int) -> AsyncIterator[str]:
    """``n`` distinct 40-character str, as bench_calls.py's payloads."""
    for k in range(n):
        yield f"item {k:010d} ".ljust(ITEM_CHARS, ".")


async def echo(payload: Any) -> Any:
    return payload


async def main(directory: str, namespace: str) -> None:
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    discovery = LocalDiscovery(namespace, directory=directory)
    server = await serve_msgpack({"lines": lines, "echo": echo}, "127.0.0.1:0", discovery)
    print(encode_record(server.metadata).decode(), flush=True)
    await stopping.wait()
    await server.stop(0)
    await discovery.aclose()


if __name__ == "__main__":
    run(main(*sys.argv[1:3]))
