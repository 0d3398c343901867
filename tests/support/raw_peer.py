"""A raw MessagePack-RPC client connection, for the tests that speak the protocol's messages
themselves (a hand-made request, a peer that stalls or closes at a chosen point)."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack  # type: ignore[import-untyped]


class RawPeer:
    """Writes frames, reads messages (none lost between two reads); each read waits at most
    ``timeout`` seconds for the socket (None: no bound of its own)."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        timeout: float | None = None,
    ) -> None:
        self.reader, self.writer = reader, writer
        self._timeout = timeout
        self._unpacker = msgpack.Unpacker(raw=False)

    async def read(self) -> Any:
        for message in self._unpacker:
            return message
        while data := await asyncio.wait_for(self.reader.read(65536), self._timeout):
            self._unpacker.feed(data)
            for message in self._unpacker:
                return message
        raise ConnectionError("closed")

    def send(self, message: Any) -> None:
        self.writer.write(msgpack.packb(message, use_bin_type=True))
