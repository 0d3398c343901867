"""A worker process serving the streaming tests' handlers over MessagePack-RPC.

    python stream_worker.py DIRECTORY NAMESPACE ADDRESS

Serves ``stream_handlers.HANDLERS`` at ADDRESS, announced through LocalDiscovery under
DIRECTORY; prints its record on stdout once it serves, and stops on SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from stream_handlers import HANDLERS

from shardline.discovery.local import LocalDiscovery
from shardline.discovery.record import encode_record
from shardline.transport.msgpack.server import serve_msgpack


async def main(directory: str, namespace: str, address: str) -> None:
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    discovery = LocalDiscovery(namespace, directory=directory, poll_interval=0.01)
    server = await serve_msgpack(HANDLERS, address, discovery)
    print(encode_record(server.metadata).decode(), flush=True)
    await stopping.wait()
    await server.stop(0)
    await discovery.aclose()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
