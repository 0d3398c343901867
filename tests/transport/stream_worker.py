"""A worker process serving the streaming tests' handlers over MessagePack-RPC.

    python stream_worker.py DIRECTORY NAMESPACE ADDRESS

Serves ``stream_handlers.HANDLERS`` at ADDRESS, announced through LocalDiscovery under
DIRECTORY; prints its record on stdout once it serves, and stops on SIGTERM.
"""

from __future__ import annotations

import asyncio
import sys

from msgpack_worker import serve_until_terminated
from stream_handlers import HANDLERS

if __name__ == "__main__":
    asyncio.run(serve_until_terminated(HANDLERS, *sys.argv[1:4]))
