"""What every worker server shares, whatever its transport: handlers, ``RetryElsewhere``, the
publishers in use, and the record's life around serving."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import logging
import os
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from types import MappingProxyType, TracebackType
from typing import Any, Self
from weakref import WeakSet

from shardline.checks import refusal
from shardline.discovery.protocol import Discovery, DiscoveryPublisher
from shardline.workers import WorkerMetadata

__all__ = [
    "DEFAULT_THREADS",
    "AnnouncedServer",
    "Handler",
    "RetryElsewhere",
    "check_handlers",
    "claimed_publisher",
    "handler_threads",
    "is_stream_handler",
    "publish_record",
    "type_name",
]

Handler = Callable[[Any], Any] | Callable[[Any], Awaitable[Any]]
"""A handler takes a task's payload and returns a result the transport can carry."""

# Publishers owned by a running server: stopping a server closes its publisher, which would
# withdraw the records of any other server publishing through it.
_publishers_in_use: WeakSet[DiscoveryPublisher] = WeakSet()


class RetryElsewhere(Exception):
    """Raised by a handler to end the call with a status the caller retries on another worker
    (``TransientRpcError``); the worker stays pooled. Over gRPC the status is ``UNAVAILABLE``,
    or ``RESOURCE_EXHAUSTED`` when ``overloaded`` is true; over msgpack the error kind is
    ``unavailable``, or ``busy`` when ``overloaded`` is true. Either way the caller's error
    says the task was not sent (``RpcError.sent`` false): the handler asked for it to go
    elsewhere, so it must not have done anything it would do again there."""

    def __init__(self, message: str | None = None, *, overloaded: bool = False) -> None:
        super().__init__(*(() if message is None else (message,)))
        self.overloaded = overloaded


def check_handlers(handlers: Mapping[str, Handler]) -> dict[str, tuple[Handler, bool]]:
    """Each handler by name, with whether it is awaited (a coroutine function, or an object
    whose ``__call__`` is one) rather than run in a thread; ``ValueError`` for a name that is
    not a non-empty str, ``TypeError`` for a handler that is not callable."""
    for name, handler in handlers.items():
        if not isinstance(name, str) or not name:
            raise refusal(name, str)(f"handler names must be non-empty str, got {name!r}")
        if not callable(handler):
            raise TypeError(f"handler {name!r} is not callable: {handler!r}")
    return {
        name: (
            handler,
            inspect.iscoroutinefunction(handler)
            or inspect.iscoroutinefunction(type(handler).__call__),
        )
        for name, handler in handlers.items()
    }


def is_stream_handler(handler: Handler) -> bool:
    """Whether ``handler`` streams its items: an async generator function, or an object whose
    ``__call__`` is one (served by the msgpack transport's ``stream``; see
    docs/msgpack-rpc.md, "Streaming")."""
    return inspect.isasyncgenfunction(handler) or inspect.isasyncgenfunction(type(handler).__call__)


DEFAULT_THREADS = min(32, (os.cpu_count() or 1) + 4)
"""The threads a server runs its sync handlers on unless told otherwise: what
``concurrent.futures.ThreadPoolExecutor`` (and so asyncio's default executor) picks, for the
same reason: sync handlers mostly wait (on a database, a file, a socket) with the GIL
released, so a few more threads than cores keep the cores busy, while a handler that computes
holds the GIL and gains nothing from more; 32 at most bounds the memory and the GIL
contention of a large machine."""


def handler_threads(threads: int | None) -> concurrent.futures.ThreadPoolExecutor:
    """The executor a server runs its sync handlers on, ``threads`` of them
    (:data:`DEFAULT_THREADS` when None); ``ValueError`` unless it is a positive int."""
    if threads is None:
        threads = DEFAULT_THREADS
    elif isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise refusal(threads, int)(f"threads must be a positive int, got {threads!r}")
    return concurrent.futures.ThreadPoolExecutor(
        max_workers=threads, thread_name_prefix="shardline-handler"
    )


def type_name(error: BaseException) -> str:
    """The exception's class, module-qualified unless it is a builtin."""
    kind = type(error)
    return (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )


@contextlib.contextmanager
def claimed_publisher(discovery: Discovery) -> Iterator[DiscoveryPublisher]:
    """``discovery.publisher``, owned by the caller's server from here on, until its
    :class:`AnnouncedServer` stops; ``ValueError`` when a running server owns it. A block that
    raises gives it back: that server never started."""
    publisher = discovery.publisher
    if publisher in _publishers_in_use:
        raise ValueError(f"the publisher of {discovery!r} already announces a running server")
    # Owned from the check on, with no await in between, so two concurrent serves cannot
    # both take it.
    _publishers_in_use.add(publisher)
    try:
        yield publisher
    except BaseException:
        _publishers_in_use.discard(publisher)
        raise


async def publish_record(
    publisher: DiscoveryPublisher,
    address: str,
    *,
    uid: uuid.UUID | None,
    version: str,
    tags: Iterable[str],
    extra: Mapping[str, Any] | None,
) -> WorkerMetadata:
    """Publishes the record of the worker this process serves at ``address`` as
    ``worker-added`` through ``publisher``, and returns it: ``WorkerMetadata(uid or a new
    uuid4, address, os.getpid(), version, tags, extra)``."""
    metadata = WorkerMetadata(
        uid=uuid.uuid4() if uid is None else uid,
        address=address,
        pid=os.getpid(),
        version=version,
        tags=frozenset(tags),
        extra=MappingProxyType(dict(extra or {})),
    )
    await publisher.publish("worker-added", metadata)
    return metadata


class AnnouncedServer:
    """A running worker whose record is published while it serves: ``metadata`` is that
    record, ``address`` where the worker serves, as published.

    ``await stop(grace=None)`` (or leaving ``async with``) withdraws the record first, so
    subscribers stop choosing the worker while it drains, then stops serving, giving calls in
    flight ``grace`` seconds (the server's own unless given). It is idempotent, and finishes
    even if the caller is cancelled. Each transport's server says how it stops serving
    (``_close``).
    """

    def __init__(self, metadata: WorkerMetadata, publisher: DiscoveryPublisher, grace: float):
        self._metadata = metadata
        self._publisher = publisher
        self._grace = grace
        self._stopped: asyncio.Future[None] | None = None

    @property
    def metadata(self) -> WorkerMetadata:
        return self._metadata

    @property
    def address(self) -> str:
        """Where the worker serves, as published (with the port actually bound)."""
        return self._metadata.address

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._metadata.uid}, {self._metadata.address!r})"

    async def stop(self, grace: float | None = None) -> None:
        """Withdraws the record and stops serving; ``grace`` overrides the server's."""
        if self._stopped is None:
            self._stopped = asyncio.ensure_future(
                self._shutdown(self._grace if grace is None else grace)
            )
        await asyncio.shield(self._stopped)

    async def _shutdown(self, grace: float) -> None:
        logger = logging.getLogger(type(self).__module__)
        try:
            await self._publisher.aclose()
        except Exception:
            logger.exception("withdrawing the record of worker %s failed", self._metadata.uid)
        finally:
            _publishers_in_use.discard(self._publisher)
            await self._close(grace)
        logger.info("worker %s at %s stopped", self._metadata.uid, self._metadata.address)

    async def _close(self, grace: float) -> None:
        """Stops serving, letting calls in flight run for up to ``grace`` seconds."""
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()
