"""gRPC channels shared by every connection to the same address, closed when none needs them."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from shardline._extras import requires_extra

with requires_extra("grpc", __name__):
    import grpc
    import grpc.aio

from shardline.transport.grpc.wire import METHOD
from shardline.transport.loop_shared import LoopShared, Registries

__all__ = ["SharedChannel", "acquire_channel"]

logger = logging.getLogger("shardline.transport.grpc.channels")

# What makes two channels interchangeable. Credentials objects compare by identity: two
# connections share a channel only when they were given the very same credentials object.
# The last item is the name the worker's certificate is checked against, when not the host.
_Key = tuple[str, grpc.ChannelCredentials | None, int, str | None]

# Closes under way: asyncio holds tasks weakly, and nothing else needs to wait for them.
_closing: set[asyncio.Task[None]] = set()


class SharedChannel(LoopShared):
    """One gRPC channel and the connections that hold it (see :class:`LoopShared`)."""

    def __init__(
        self, registry: dict[_Key, SharedChannel], key: _Key, loop: asyncio.AbstractEventLoop
    ) -> None:
        super().__init__(registry, key, loop)
        address, credentials, max_message_bytes, server_hostname = key
        self.address = address
        options: list[tuple[str, Any]] = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
        ]
        if server_hostname is not None:
            options.append(("grpc.ssl_target_name_override", server_hostname))
        if credentials is None:
            self.channel = grpc.aio.insecure_channel(address, options=options)
        else:
            self.channel = grpc.aio.secure_channel(address, credentials, options=options)
        # Start connecting now: the entry was made because a dispatch is coming.
        self.channel.get_state(try_to_connect=True)
        self.call: Any = self.channel.unary_unary(METHOD)
        self.closed = False

    def begin_call(self) -> None:
        self.in_flight += 1

    def _close(self) -> None:
        if self.closed:
            return
        self.closed = True
        logger.debug("closing the channel to %s", self.address)
        # No call is left, so the close has nothing to wait for.
        task = self.loop.create_task(self.channel.close())
        _closing.add(task)
        task.add_done_callback(_closing.discard)


_registries: Registries[_Key, SharedChannel] = Registries(SharedChannel)


def acquire_channel(
    address: str,
    credentials: grpc.ChannelCredentials | None,
    max_message_bytes: int,
    server_hostname: str | None = None,
) -> SharedChannel:
    """A reference to the open channel for these settings on the running loop, made if there
    is none; ``server_hostname``: the name the worker's certificate is checked against, when
    not the host of ``address``."""
    return _registries.acquire((address, credentials, max_message_bytes, server_hostname))
