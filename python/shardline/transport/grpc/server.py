"""`serve_grpc`: a worker process's gRPC server, announced through discovery while it runs."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import uuid
from collections.abc import Iterable, Mapping
from contextvars import copy_context
from typing import Any

from shardline._extras import requires_extra

with requires_extra("grpc", __name__):
    import grpc
    import grpc.aio

from shardline.discovery.protocol import Discovery, DiscoveryPublisher
from shardline.host_port import join_host_port, split_host_port
from shardline.transport.grpc.wire import (
    METHOD,
    SCHEME,
    TLS_SCHEME,
    decode_request,
    encode_error,
    encode_result,
    grpc_target,
)
from shardline.transport.remote_errors import builtin_base, remote_traceback
from shardline.transport.serving import (
    AnnouncedServer,
    Handler,
    RetryElsewhere,
    check_handlers,
    claimed_publisher,
    handler_threads,
    is_stream_handler,
    publish_record,
    type_name,
)
from shardline.transport.task import (
    BAD_REQUEST,
    BAD_RESULT,
    MAX_MESSAGE_BYTES,
    UNKNOWN_HANDLER,
    MalformedMessage,
)
from shardline.transport.tls import TlsSettings, check_plaintext
from shardline.workers import WorkerMetadata

__all__ = ["NOT_STARTED", "Handler", "RetryElsewhere", "WorkerServer", "serve_grpc"]

logger = logging.getLogger("shardline.transport.grpc.server")

_SERVICE, _, _METHOD_NAME = METHOD[1:].partition("/")

NOT_STARTED = ("shardline-started", "0")
"""The trailing metadata of a status this server sends for a call whose handler did not run,
or asked to be retried elsewhere (``RetryElsewhere``): the client may send the task again."""


class WorkerServer(AnnouncedServer):
    """A running worker, made by :func:`serve_grpc`. ``metadata`` is the record it published.

    ``await stop()`` (or leaving ``async with``) withdraws the record, then stops serving:
    calls in flight get ``grace`` seconds to finish, new calls are refused with
    ``UNAVAILABLE``; then its handler threads are shut down (a sync handler still running
    finishes in its thread). It is idempotent, and finishes even if the caller is cancelled.
    """

    def __init__(
        self,
        server: grpc.aio.Server,
        metadata: WorkerMetadata,
        publisher: DiscoveryPublisher,
        grace: float,
        threads: concurrent.futures.ThreadPoolExecutor,
    ) -> None:
        super().__init__(metadata, publisher, grace)
        self._server = server
        self._threads = threads

    async def _close(self, grace: float) -> None:
        try:
            await self._server.stop(grace)
        finally:
            self._threads.shutdown(wait=False, cancel_futures=True)


async def serve_grpc(
    handlers: Mapping[str, Handler],
    address: str,
    discovery: Discovery,
    *,
    uid: uuid.UUID | None = None,
    version: str = "",
    tags: Iterable[str] = frozenset(),
    extra: Mapping[str, Any] | None = None,
    credentials: grpc.ServerCredentials | None = None,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    max_concurrent_calls: int | None = None,
    grace: float = 5.0,
    threads: int | None = None,
    tls: TlsSettings | None = None,
    insecure: bool = False,
) -> WorkerServer:
    """Serves ``handlers`` over gRPC at ``address`` and announces the worker through
    ``discovery``; returns once it serves and its record is published.

    ``handlers`` maps names to handlers. A handler takes the task's payload (a JSON value) and
    returns a JSON-serialisable result; a coroutine function is awaited on the server's loop,
    any other callable runs on the server's own ``threads`` threads
    (:data:`~shardline.transport.serving.DEFAULT_THREADS` by default), so it may block; a
    call that finds them all busy waits in their queue, and one cancelled there (its
    deadline passed, its caller gave up) never starts. A handler that raises, a
    ``BaseException`` included (``SystemExit``, ``KeyboardInterrupt``: the worker lives on),
    makes the caller's ``dispatch`` raise :class:`~shardline.errors.WorkerError`, with the
    handler's traceback and built-in type (:mod:`~shardline.transport.remote_errors`), and logs
    it here; one that raises :class:`RetryElsewhere` makes it retry on another worker (its
    status carries :data:`NOT_STARTED`).

    ``address`` is ``host:port`` (or ``grpc://host:port``; an IPv6 host in brackets,
    ``[::1]:port``), published as ``grpc://host:port``; port 0 picks a free port, and the
    record carries the port bound. Subscribers dial the address as published, so ``host`` must
    be reachable by them (not ``0.0.0.0``). A port already in use is an ``OSError``; an address
    that is not ``host:port`` an :class:`~shardline.errors.InvalidAddress` (a ``ValueError``).
    ``tls`` (a :class:`~shardline.transport.tls.TlsSettings` with ``cert`` and ``key``; with
    ``ca``, client certificates signed by it are required) serves with TLS, published as
    ``grpcs://host:port``; ``credentials`` (a ``grpc.ServerCredentials``, not with ``tls``)
    does the same with credentials made by the caller. Without either, a host that is not
    loopback is refused with ``ValueError`` unless ``insecure`` is true: anyone who can reach
    it could run every handler. Requests and results over ``max_message_bytes`` are
    refused. With ``max_concurrent_calls``, calls beyond that many at
    once are refused with ``RESOURCE_EXHAUSTED``, so a proxy offers them to another worker.

    The record is ``WorkerMetadata(uid or a new uuid4, address, os.getpid(), version, tags,
    extra)``, published as ``worker-added`` through ``discovery.publisher``. Stopping the
    server closes that publisher, withdrawing every record it still owns, but not one another
    publisher has since taken over. Give each server a publisher of its own: a publisher that
    is in use by a running server is refused with ``ValueError``.
    """
    if max_message_bytes < 1:
        raise ValueError(f"max_message_bytes must be positive, got {max_message_bytes}")
    if max_concurrent_calls is not None and max_concurrent_calls < 1:
        raise ValueError(f"max_concurrent_calls must be positive, got {max_concurrent_calls}")
    host, port = split_host_port(grpc_target(address), any_port=True)
    target = join_host_port(host, port)
    if tls is not None:
        if credentials is not None:
            raise ValueError("give serve_grpc tls or credentials, not both")
        credentials = tls.grpc_server_credentials()
    elif credentials is None:
        if address.startswith(TLS_SCHEME):
            raise ValueError(
                f"{address!r} names TLS: serve it with tls=TlsSettings(cert=..., key=...)"
            )
        await check_plaintext(host, port, insecure)
    checked = check_handlers(handlers)
    with claimed_publisher(discovery) as publisher:
        executor = handler_threads(threads)
        servicer = _Servicer(checked, max_message_bytes, executor)
        server = grpc.aio.server(
            options=[
                ("grpc.max_send_message_length", max_message_bytes),
                ("grpc.max_receive_message_length", max_message_bytes),
                # Without this a second server binds a port already in use and shares its
                # traffic.
                ("grpc.so_reuseport", 0),
            ],
            maximum_concurrent_rpcs=max_concurrent_calls,
        )
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    _SERVICE,
                    {_METHOD_NAME: grpc.unary_unary_rpc_method_handler(servicer.dispatch)},
                ),
            )
        )
        try:
            if credentials is None:
                bound = server.add_insecure_port(target)
            else:
                bound = server.add_secure_port(target, credentials)
        except RuntimeError as error:
            executor.shutdown(wait=False)
            raise OSError(f"cannot serve at {address}: {error}") from None
        scheme = SCHEME if credentials is None else TLS_SCHEME
        try:
            await server.start()
            metadata = await publish_record(
                publisher,
                scheme + join_host_port(host, bound),
                uid=uid,
                version=version,
                tags=tags,
                extra=extra,
            )
        except BaseException:
            await server.stop(None)
            executor.shutdown(wait=False)
            raise
    logger.info("worker %s serves %s at %s", metadata.uid, sorted(handlers), metadata.address)
    return WorkerServer(server, metadata, publisher, grace, executor)


class _Servicer:
    def __init__(
        self,
        handlers: dict[str, tuple[Handler, bool]],
        max_message_bytes: int,
        threads: concurrent.futures.ThreadPoolExecutor,
    ) -> None:
        self._handlers = handlers
        self._max_message_bytes = max_message_bytes
        self._threads = threads

    async def dispatch(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            task = decode_request(request)
        except MalformedMessage as error:
            return encode_error(BAD_REQUEST, str(error))
        entry = self._handlers.get(task.handler)
        if entry is None:
            served = ", ".join(sorted(self._handlers)) or "none"
            return encode_error(
                UNKNOWN_HANDLER, f"no handler named {task.handler!r} (this worker serves: {served})"
            )
        handler, is_async = entry
        if not is_async and is_stream_handler(handler):
            return encode_error(
                BAD_REQUEST,
                f"handler {task.handler!r} is an async generator: the grpc transport does not"
                " stream; serve it over msgpack and read its items with stream()",
            )
        try:
            if is_async:
                result = await handler(task.payload)
            else:
                result = await asyncio.wrap_future(
                    self._threads.submit(copy_context().run, handler, task.payload)
                )
        except RetryElsewhere as signal:
            code = (
                grpc.StatusCode.RESOURCE_EXHAUSTED
                if signal.overloaded
                else grpc.StatusCode.UNAVAILABLE
            )
            await context.abort(
                code, f"handler {task.handler!r}: {signal}", trailing_metadata=(NOT_STARTED,)
            )
            raise  # not reached: abort() ends the call by raising
        except asyncio.CancelledError:
            raise  # the call was cancelled: its caller's, its deadline, the server's stop
        except Exception as error:
            logger.warning("handler %r raised", task.handler, exc_info=True)
            return self._failed(error)
        except BaseException as error:
            # SystemExit, KeyboardInterrupt...: one call's failure; raised on, it would end
            # the event loop, and the worker with it
            logger.error(
                "handler %r raised %s, which is no Exception: answered as that call's error,"
                " the worker goes on",
                task.handler,
                type_name(error),
                exc_info=True,
            )
            return self._failed(error)
        try:
            return encode_result(result, self._max_message_bytes)
        except (TypeError, ValueError) as error:
            return encode_error(BAD_RESULT, f"handler {task.handler!r}: {error}")

    def _failed(self, error: BaseException) -> bytes:
        """The reply to a call whose handler raised ``error``, with its built-in type and
        traceback (:mod:`~shardline.transport.remote_errors`), or without the traceback when
        that would not fit ``max_message_bytes``."""
        remote_type, message, builtin = type_name(error), str(error), builtin_base(error)
        reply = encode_error(
            remote_type, message, builtin=builtin, traceback=remote_traceback(error)
        )
        if len(reply) > self._max_message_bytes:
            reply = encode_error(remote_type, message, builtin=builtin)
        return reply
