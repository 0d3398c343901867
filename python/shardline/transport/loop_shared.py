"""``LoopShared``: what every connection to a worker with the same settings shares on one event
loop (a gRPC channel, a MessagePack-RPC socket), counted, and closed when none needs it."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

__all__ = ["LoopShared", "Registries", "release"]

K = TypeVar("K", bound=Hashable)
S = TypeVar("S", bound="LoopShared")


class LoopShared:
    """A resource of one loop held by ``references`` connections and running ``in_flight``
    calls. Once the last reference is released it leaves its registry (a connection made
    afterwards gets a new one) and is closed as soon as no call is in flight (``_close``,
    which a subclass provides; it may run more than once)."""

    def __init__(
        self, registry: dict[Any, Any], key: Hashable, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.loop = loop
        self.references = 1
        self.in_flight = 0
        self._registry = registry
        self._key = key

    def release(self) -> None:
        """Drops one reference; must run on the loop."""
        self.references -= 1
        if self.references == 0:
            if self._registry.get(self._key) is self:
                del self._registry[self._key]
            self._close_if_unused()

    def end_call(self) -> None:
        self.in_flight -= 1
        if not (self.references or self.in_flight):  # _close_if_unused, a call fewer per call
            self._close()

    def _close_if_unused(self) -> None:
        if not (self.references or self.in_flight):
            self._close()

    def _close(self) -> None:
        raise NotImplementedError


class Registries(Generic[K, S]):
    """For each event loop, the shared resource of each key; ``make(registry, key, loop)``
    makes a missing one. Per loop, because channels and sockets belong to the loop they were
    made on."""

    def __init__(self, make: Callable[[dict[K, S], K, asyncio.AbstractEventLoop], S]) -> None:
        self._make = make
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[K, S]] = (
            weakref.WeakKeyDictionary()
        )

    def acquire(self, key: K) -> S:
        """A reference to the resource for ``key`` on the running loop, made if there is none."""
        loop = asyncio.get_running_loop()
        registry = self._by_loop.setdefault(loop, {})
        shared = registry.get(key)
        if shared is None:
            shared = registry[key] = self._make(registry, key, loop)
        else:
            shared.references += 1
        return shared


def release(shared: LoopShared) -> None:
    """Releases a reference from any thread, or from a garbage collection; a no-op once the
    resource's loop is closed (its channels and sockets went with it)."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is shared.loop:
        shared.release()
    elif not shared.loop.is_closed():
        shared.loop.call_soon_threadsafe(shared.release)
