"""The floor of ``bench_calls.py``: the least a call over TCP can cost, a bare echo of
length-prefixed frames on asyncio ``Protocol`` objects.

A frame is a 4-byte big-endian length and that many bytes; the server echoes each as it came,
and answers an empty frame with its process id (decimal ASCII), so that a client can tell which
process it reached. ``FloorClient`` is its client: one connection per server, many calls in
flight over each, answered in order (so no request id).

Run as a script, ``python benches/call_floor.py --namespace NS --address HOST:PORT`` serves
until SIGTERM or SIGINT on the event loop ``shardline worker`` uses (uvloop's when it is
installed, asyncio's otherwise), and prints one line when ready: a discovery record
(``encode_record``) with the address bound, as ``shardline worker`` does. It announces nothing
(``--namespace`` is accepted, and ignored, so that ``workerkit.start_workers`` can start it).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import signal
import struct
import sys
import uuid
from collections.abc import Callable
from typing import cast

from shardline import WorkerMetadata
from shardline.discovery.record import encode_record
from shardline.host_port import join_host_port, split_host_port
from shardline.transport.event_loop import run

HEADER = struct.Struct(">I")
MAX_FRAME = 1 << 20  # a longer frame closes the connection


def loop_factory() -> tuple[Callable[[], asyncio.AbstractEventLoop], str]:
    """uvloop's ``new_event_loop`` and ``"uvloop"`` when uvloop is installed, else asyncio's
    and ``"asyncio"``: the client's side of the choice ``shardline worker`` makes."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop, "asyncio"
    return uvloop.new_event_loop, "uvloop"


def frames(buffer: bytearray) -> list[bytes]:
    """Takes the complete frames' bodies off the front of ``buffer``; raises ``ValueError`` on a
    frame longer than ``MAX_FRAME``."""
    bodies = []
    start = 0
    while len(buffer) - start >= HEADER.size:
        (length,) = HEADER.unpack_from(buffer, start)
        if length > MAX_FRAME:
            raise ValueError(f"frame of {length} bytes, over the {MAX_FRAME} allowed")
        end = start + HEADER.size + length
        if end > len(buffer):
            break
        bodies.append(bytes(buffer[start + HEADER.size : end]))
        start = end
    del buffer[:start]
    return bodies


class _EchoServer(asyncio.Protocol):
    def __init__(self) -> None:
        self._buffer = bytearray()
        self._pid = str(os.getpid()).encode()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        assert self._transport is not None
        self._buffer += data
        try:
            bodies = frames(self._buffer)
        except ValueError:
            self._transport.close()
            return
        for body in bodies:
            reply = body or self._pid
            self._transport.write(HEADER.pack(len(reply)) + reply)


class _FloorConnection(asyncio.Protocol):
    """The client side of one connection: replies come back in the order of the requests, so
    each completes the oldest waiting future."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._waiting: collections.deque[asyncio.Future[bytes]] = collections.deque()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        for body in frames(self._buffer):
            future = self._waiting.popleft()
            if not future.done():
                future.set_result(body)

    def connection_lost(self, exc: Exception | None) -> None:
        while self._waiting:
            future = self._waiting.popleft()
            if not future.done():
                future.set_exception(ConnectionError(f"the floor server went away: {exc}"))

    def call(self, body: bytes) -> asyncio.Future[bytes]:
        assert self.transport is not None
        future = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        self.transport.write(HEADER.pack(len(body)) + body)
        return future


class FloorClient:
    """One connection to each floor server (``host:port`` addresses); ``await call(n, body)``
    sends ``body`` to server ``n % len(addresses)`` and returns the echo."""

    def __init__(self, connections: list[_FloorConnection]) -> None:
        self._connections = connections

    @classmethod
    async def connect(cls, addresses: list[str]) -> FloorClient:
        loop = asyncio.get_running_loop()
        connections = []
        for address in addresses:
            host, port = split_host_port(address)
            _, protocol = await loop.create_connection(_FloorConnection, host, port)
            connections.append(protocol)
        return cls(connections)

    def call(self, n: int, body: bytes) -> asyncio.Future[bytes]:
        return self._connections[n % len(self._connections)].call(body)

    async def pids(self) -> list[int]:
        """The pid of the process behind each connection."""
        return [int(await connection.call(b"")) for connection in self._connections]

    def close(self) -> None:
        for connection in self._connections:
            if connection.transport is not None:
                connection.transport.close()


async def _serve(address: str) -> None:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    host, port = split_host_port(address, any_port=True)
    server = await loop.create_server(_EchoServer, host, port)
    bound = server.sockets[0].getsockname()[1]
    record = WorkerMetadata(uuid.uuid4(), join_host_port(host, bound), os.getpid(), version="")
    print(encode_record(record).decode(), flush=True)
    async with server:
        await stopping.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--address", required=True, metavar="HOST:PORT")
    args = parser.parse_args()
    run(_serve(args.address))
    return 0


if __name__ == "__main__":
    sys.exit(main())
