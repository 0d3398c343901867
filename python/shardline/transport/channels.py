"""gRPC channels shared by every connection to the same address, closed when none needs them."""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Any

import grpc
import grpc.aio

from shardline.transport.wire import METHOD

__all__ = ["SharedChannel", "acquire_channel", "release_channel"]

logger = logging.getLogger("shardline.transport.channels")

# What makes two channels interchangeable. Credentials objects compare by identity: two
# connections share a channel only when they were given the very same credentials object.
_Key = tuple[str, grpc.ChannelCredentials | None, int]

# Closes under way: asyncio holds tasks weakly, and nothing else needs to wait for them.
_closing: set[asyncio.Task[None]] = set()


class SharedChannel:
    """One gRPC channel and the connections that hold it.

    ``references`` counts the connections holding it and ``in_flight`` the calls running on
    it. Once the last reference is released the channel leaves its registry (a connection made
    afterwards gets a new channel) and is closed as soon as no call is in flight.
    """

    def __init__(
        self, registry: dict[_Key, SharedChannel], key: _Key, loop: asyncio.AbstractEventLoop
    ) -> None:
        address, credentials, max_message_bytes = key
        options = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
        ]
        if credentials is None:
            self.channel = grpc.aio.insecure_channel(address, options=options)
        else:
            self.channel = grpc.aio.secure_channel(address, credentials, options=options)
        # Start connecting now: the entry was made because a dispatch is coming.
        self.channel.get_state(try_to_connect=True)
        self.call: Any = self.channel.unary_unary(METHOD)
        self.loop = loop
        self.references = 1
        self.in_flight = 0
        self.closed = False
        self._registry = registry
        self._key = key

    def release(self) -> None:
        """Drops one reference; must run on the channel's loop."""
        self.references -= 1
        if self.references == 0:
            if self._registry.get(self._key) is self:
                del self._registry[self._key]
            self._close_if_unused()

    def begin_call(self) -> None:
        self.in_flight += 1

    def end_call(self) -> None:
        self.in_flight -= 1
        self._close_if_unused()

    def _close_if_unused(self) -> None:
        if self.references or self.in_flight or self.closed:
            return
        self.closed = True
        logger.debug("closing the channel to %s", self._key[0])
        # No call is left, so the close has nothing to wait for.
        task = self.loop.create_task(self.channel.close())
        _closing.add(task)
        task.add_done_callback(_closing.discard)


_registries: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[_Key, SharedChannel]] = (
    weakref.WeakKeyDictionary()
)


def acquire_channel(
    address: str, credentials: grpc.ChannelCredentials | None, max_message_bytes: int
) -> SharedChannel:
    """A reference to the open channel for these settings on the running loop, made if there
    is none. gRPC channels belong to the loop they were made on, hence one registry per loop.
    """
    loop = asyncio.get_running_loop()
    registry = _registries.setdefault(loop, {})
    key: _Key = (address, credentials, max_message_bytes)
    shared = registry.get(key)
    if shared is None:
        shared = registry[key] = SharedChannel(registry, key, loop)
    else:
        shared.references += 1
    return shared


def release_channel(shared: SharedChannel) -> None:
    """Releases a reference from any thread, or from a garbage collection; a no-op once the
    channel's loop is closed (its channels went with it)."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is shared.loop:
        shared.release()
    elif not shared.loop.is_closed():
        shared.loop.call_soon_threadsafe(shared.release)
