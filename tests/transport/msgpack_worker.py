"""A worker process serving MessagePack-RPC, for the transport's fault tests.

    python msgpack_worker.py DIRECTORY NAMESPACE ADDRESS

Serves the demo handlers plus ``hold`` (prints ``holding PAYLOAD`` on stdout, then sleeps
until cancelled) at ADDRESS, announced through LocalDiscovery under DIRECTORY; prints its
record on stdout once it serves, and stops on SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Mapping
from typing import Any

from shardline.discovery.local import LocalDiscovery
from shardline.discovery.record import encode_record
from shardline.transport.demo_handlers import DEMO_HANDLERS
from shardline.transport.msgpack.server import serve_msgpack


async def hold(payload: Any) -> None:
    print(f"holding {payload}", flush=True)
    await asyncio.Event().wait()


async def serve_until_terminated(
    handlers: Mapping[str, Any], directory: str, namespace: str, address: str
) -> None:
    """Serves ``handlers`` at ``address``, announced through LocalDiscovery under
    ``directory``; prints the record on stdout once it serves; stops on SIGTERM. Also the main
    of ``stream_worker.py``."""
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    discovery = LocalDiscovery(namespace, directory=directory, poll_interval=0.01)
    server = await serve_msgpack(handlers, address, discovery)
    print(encode_record(server.metadata).decode(), flush=True)
    await stopping.wait()
    await server.stop(0)
    await discovery.aclose()


if __name__ == "__main__":
    asyncio.run(serve_until_terminated({**DEMO_HANDLERS, "hold": hold}, *sys.argv[1:4]))
