"""A separate process that publishes workers through LocalDiscovery, for the fault tests.

    python local_publisher.py DIRECTORY NAMESPACE --first 1 --count 3 [--versions 1]
        [--heartbeat S] [--liveness S]

Publishes workers ``first`` … ``first + count - 1`` (uid = UUID(int=n)), ``versions`` times
each, round-robin, with ``pid`` = the version (or this process's pid when there is only one),
prints ``ready``, then keeps them alive until its stdin closes, when it closes the handle.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import uuid

from shardline.discovery.local import LocalDiscovery
from shardline.workers import WorkerMetadata


def record(n: int, pid: int) -> WorkerMetadata:
    return WorkerMetadata(
        uid=uuid.UUID(int=n), address=f"127.0.0.1:{5000 + n}", pid=pid, version="1.0"
    )


async def main(arguments: argparse.Namespace) -> None:
    discovery = LocalDiscovery(
        arguments.namespace,
        directory=arguments.directory,
        heartbeat=arguments.heartbeat,
        liveness_timeout=arguments.liveness,
    )
    workers = range(arguments.first, arguments.first + arguments.count)
    for version in range(1, arguments.versions + 1):
        pid = os.getpid() if arguments.versions == 1 else version
        for n in workers:
            await discovery.publisher.publish("worker-updated", record(n, pid))
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.read)
    await discovery.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("namespace")
    parser.add_argument("--first", type=int, default=1)
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--versions", type=int, default=1)
    parser.add_argument("--heartbeat", type=float, default=1.0)
    parser.add_argument("--liveness", type=float, default=5.0)
    asyncio.run(main(parser.parse_args()))
