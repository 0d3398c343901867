"""A MessagePack-RPC worker with one async echo handler, for ``worker_ir.py``: prints its
address, serves until its stdin closes. ``python echo_worker.py`` in the venv of the build to
count (a build from before the transport's move to ``shardline.transport.msgpack`` too)."""

import asyncio
import sys
import uuid

import uvloop

try:
    from shardline.transport.msgpack.server import serve_msgpack
except ImportError:  # a build from before issue 28's layout
    from shardline.transport.msgpack_server import serve_msgpack  # type: ignore[import-not-found,no-redef]
from shardline.discovery.local import LocalDiscovery


async def echo(value: object) -> object:
    return value


async def main() -> None:
    discovery = LocalDiscovery("callgrind-" + uuid.uuid4().hex)
    server = await serve_msgpack({"echo": echo}, "127.0.0.1:0", discovery)
    print(server.metadata.address, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.stop()


uvloop.run(main())
