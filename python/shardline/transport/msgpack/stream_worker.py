"""`StreamProducer`: a worker's side of one streamed call, an async generator handler's items
sent as the caller's credit allows."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from typing import Any

from shardline.transport.msgpack import stream_wire, wire

__all__ = ["StreamProducer", "UnsendableItem"]


class UnsendableItem(ValueError):
    """An item msgpack cannot carry, or whose frame is over the limit: the stream ends with
    ``bad_result``."""


class StreamProducer:
    """Sends the items of ``generator`` (the handler's) for stream ``msgid`` through
    ``write``, one frame each, never more than the caller granted: ``window`` at first, then
    what each :meth:`grant` adds. The generator is advanced only while some credit is left,
    so a caller that stops reading stops it within ``window`` items.

    ``await run()`` returns once the generator is exhausted (the caller then answers the end,
    ``[1, msgid, nil, nil]``); it raises what the generator raised, or
    :class:`UnsendableItem`. Cancelled (the caller's cancel, the deadline, the worker's stop),
    it raises ``CancelledError``. Whichever way it ends, the generator is closed first
    (``aclose``: its ``finally`` blocks run)."""

    def __init__(
        self,
        msgid: int,
        name: str,
        generator: AsyncGenerator[Any, None],
        window: int,
        write: Callable[[bytes], None],
        limit: int,
    ) -> None:
        self._msgid = msgid
        self._name = name
        self._generator = generator
        self._credit = window
        self._write = write
        self._limit = limit
        self._waiting: asyncio.Future[None] | None = None

    def grant(self, items: int) -> None:
        """Lets ``items`` more be sent (the caller read as many); the credit held is capped at
        :data:`~shardline.transport.msgpack.stream_wire.MAX_WINDOW`."""
        self._credit = min(self._credit + items, stream_wire.MAX_WINDOW)
        waiting = self._waiting
        if waiting is not None and not waiting.done():
            waiting.set_result(None)

    async def run(self) -> None:
        generator = self._generator
        msgid = self._msgid
        write = self._write
        try:
            while True:
                while self._credit <= 0:
                    self._waiting = asyncio.get_running_loop().create_future()
                    await self._waiting
                self._waiting = None
                try:
                    value = await anext(generator)
                except StopAsyncIteration:
                    return
                write(self._frame(msgid, value))
                self._credit -= 1
        finally:
            await generator.aclose()

    def _frame(self, msgid: int, value: Any) -> bytes:
        try:
            frame = stream_wire.item(msgid, wire.pack_value(value, "an item", self._name))
        except (TypeError, ValueError) as error:
            raise UnsendableItem(str(error)) from None
        if len(frame) > self._limit:
            raise UnsendableItem(
                f"handler {self._name!r}: an item's frame is {len(frame)} bytes, over the limit"
                f" of {self._limit}"
            )
        return frame
