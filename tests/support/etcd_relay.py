"""A TCP relay in front of etcd that a test can cut and restore, to drop a client's connection
while etcd itself keeps running (and, say, compacts its history)."""

from __future__ import annotations

import asyncio
import contextlib


class Relay:
    """Listens on a free loopback port and relays each connection to ``port``; while cut, it
    aborts every relayed connection and refuses new ones."""

    def __init__(self, port: int) -> None:
        self.upstream_port = port
        self.is_cut = False
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.StreamWriter] = set()
        self._pipes: set[asyncio.Task[None]] = set()

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        return f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)

    def cut(self) -> None:
        self.is_cut = True
        for writer in list(self._connections):
            writer.transport.abort()

    def restore(self) -> None:
        self.is_cut = False

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.is_cut:
            writer.transport.abort()
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                "127.0.0.1", self.upstream_port
            )
        except OSError:
            writer.transport.abort()
            return
        self._connections.update((writer, upstream_writer))
        for source, sink in ((reader, upstream_writer), (upstream_reader, writer)):
            pipe = asyncio.create_task(self._pipe(source, sink))
            self._pipes.add(pipe)
            pipe.add_done_callback(self._pipes.discard)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
        except OSError:
            pass
        finally:
            self._connections.discard(sink)
            sink.transport.abort()

    async def aclose(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for pipe in list(self._pipes):
            pipe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pipe
