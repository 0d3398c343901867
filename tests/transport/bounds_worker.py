"""A worker process serving MessagePack-RPC under given limits, for the bounds tests and the
attack benchmark.

    python bounds_worker.py LIMITS_JSON [MAX_IN_FLIGHT [asyncio|uvloop [CERT KEY]]]

``LIMITS_JSON`` is a JSON object of :class:`~shardline.transport.limits.WorkerLimits` fields
(``{}`` for the defaults); ``asyncio`` serves on asyncio's own loop, not uvloop's; ``CERT``
and ``KEY`` (PEM files) serve with TLS. Serves, on 127.0.0.1 with a free port, the demo
handlers and:

- ``big``: returns ``payload`` bytes (1,000,000 when nil) at once;
- ``big_later``: the same after one turn of the loop (so a burst of calls all start before
  any answers);
- ``hold``: waits until cancelled;
- ``block``: blocks the loop for ``payload`` seconds (``time.sleep`` in an async handler, as a
  handler that forgot to await, or a long GC pause, would), logging ``blocking the loop`` at
  WARNING as it starts;
- ``hog``: opens file descriptors until the system refuses one (EMFILE), keeping them;
- ``release``: closes those ``hog`` opened.

Prints the worker's address on stdout once it serves; logs at INFO on stderr; stops on
SIGTERM.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

from shardline.discovery import InProcessDiscovery
from shardline.transport.demo_handlers import DEMO_HANDLERS
from shardline.transport.event_loop import run
from shardline.transport.limits import WorkerLimits
from shardline.transport.msgpack.server import MAX_IN_FLIGHT, serve_msgpack
from shardline.transport.tls import TlsSettings

_hogged: list[int] = []


async def big(payload: Any) -> bytes:
    return b"x" * (1_000_000 if payload is None else payload)


async def big_later(payload: Any) -> bytes:
    await asyncio.sleep(0)
    return b"x" * (1_000_000 if payload is None else payload)


async def hold(payload: Any) -> None:
    await asyncio.Event().wait()


async def block(payload: Any) -> float:
    logging.getLogger("bounds_worker").warning("blocking the loop for %s s", payload)
    time.sleep(payload)
    return float(payload)


async def ticks(payload: Any) -> AsyncIterator[int]:
    for n in itertools.count():
        yield n


def hog(payload: Any) -> int:
    while True:
        try:
            _hogged.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            return len(_hogged)


def release(payload: Any) -> int:
    count = len(_hogged)
    while _hogged:
        os.close(_hogged.pop())
    return count


HANDLERS = {
    **DEMO_HANDLERS,
    "big": big,
    "big_later": big_later,
    "hold": hold,
    "block": block,
    "ticks": ticks,
    "hog": hog,
    "release": release,
}


async def main(limits: WorkerLimits, max_in_flight: int, tls: TlsSettings | None) -> None:
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    server = await serve_msgpack(
        HANDLERS,
        "127.0.0.1:0",
        InProcessDiscovery("bounds"),
        limits=limits,
        max_in_flight=max_in_flight,
        tls=tls,
    )
    print(server.address, flush=True)
    await stopping.wait()
    await server.stop(0)


if __name__ == "__main__":
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
    )
    given = WorkerLimits(**json.loads(sys.argv[1]))
    tls = TlsSettings(sys.argv[4], sys.argv[5]) if len(sys.argv) > 5 else None
    serving = main(given, int(sys.argv[2]) if len(sys.argv) > 2 else MAX_IN_FLIGHT, tls)
    if sys.argv[3:4] == ["asyncio"]:
        asyncio.run(serving)
    else:
        run(serving)
