"""`GrpcConnection`: how a `WorkerProxy` reaches a worker served by `serve`."""

from __future__ import annotations

import weakref
from typing import Any

from shardline._extras import requires_extra

with requires_extra("grpc", __name__):
    import grpc
    import grpc.aio

from shardline.errors import RpcError, RpcReason, TransientRpcError
from shardline.transport.grpc.channels import acquire_channel
from shardline.transport.grpc.wire import (
    TLS_SCHEME,
    decode_reply,
    encode_request,
    grpc_record_target,
)
from shardline.transport.loop_shared import release
from shardline.transport.remote_errors import worker_error
from shardline.transport.task import MAX_MESSAGE_BYTES, MalformedMessage, Task
from shardline.transport.tls import TlsSettings
from shardline.workers import WorkerMetadata

__all__ = ["GrpcConnection"]

# The statuses worth trying another worker for, and their reasons. CANCELLED reaches a caller
# only from the other side (its own cancellation is CancelledError): a worker that is stopping
# resets some calls that way instead of answering UNAVAILABLE.
_TRANSIENT_CODES: dict[grpc.StatusCode, RpcReason] = {
    grpc.StatusCode.UNAVAILABLE: "unavailable",
    grpc.StatusCode.DEADLINE_EXCEEDED: "deadline",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "busy",
    grpc.StatusCode.CANCELLED: "cancelled",
}
# What grpc-core says when no connection to the worker could be made: nothing was written.
_NOT_CONNECTED = "failed to connect to all addresses"
# What grpc-core says when a TLS worker closed the connection during the handshake.
_CLOSED = "Socket closed"
# The trailing metadata serve_grpc sends with a status for a call whose handler did not run
# (shardline.transport.grpc.server.NOT_STARTED, not imported: the server's module is not needed).
_NOT_STARTED = ("shardline-started", "0")


class GrpcConnection:
    """A connection to the worker at ``metadata.address`` (``grpc://host:port``,
    ``grpcs://host:port`` or a bare ``host:port``), for ``WorkerProxy(connect=...)``.

    Must be made on a running event loop and used on that loop. A ``grpcs://`` worker is
    reached with TLS, by ``tls`` (a :class:`~shardline.transport.tls.TlsSettings`; default
    ``TlsSettings()``: the worker's certificate verified against the system's trust store and
    its name checked, no client certificate); the others in plaintext, whatever ``tls``.
    ``credentials`` (a ``grpc.ChannelCredentials``, not with ``tls``) makes the channel
    secure, whatever the scheme. ``max_message_bytes`` bounds the requests sent and the
    replies accepted.
    Use ``functools.partial(GrpcConnection, credentials=...)`` to give these to a proxy. An
    address with no ``host:port`` after the scheme (a port from 1 to 65535; an IPv6 host in
    brackets) is an :class:`~shardline.errors.InvalidAddress` naming it, raised here, before
    anything is dialled, so a proxy skips such a record (``not_admitted``) instead of
    evicting the worker at its first dispatch.

    ``await dispatch(task, timeout=None)`` runs the :class:`Task` on the worker and returns its
    handler's result. ``timeout`` (seconds) becomes the call's deadline, which the worker sees
    too. Failures, as :class:`WorkerProxy` expects them, each with whether the task may have
    started on the worker (``sent``, see :class:`~shardline.errors.RpcError`), as far as gRPC
    tells: not sent for ``"closed"``, for ``UNAVAILABLE`` when no connection to the worker
    could be made (grpc-core's "failed to connect to all addresses"), and for a status the
    worker's ``serve_grpc`` marked as not started (its handler raised ``RetryElsewhere``);
    sent for every other status, ``DEADLINE_EXCEEDED`` and ``CANCELLED`` included, and for
    ``UNAVAILABLE`` after the call may have reached the worker (the connection broke, the
    worker was stopping), which gRPC does not tell apart from a refusal before the handler
    ran:

    - ``TransientRpcError`` (the worker stays pooled; the proxy tries another): the worker is
      unreachable or shutting down (``UNAVAILABLE``, reason ``"unavailable"``; or
      ``CANCELLED``, ``"cancelled"``, for a call it reset while stopping), the deadline passed
      (``DEADLINE_EXCEEDED``, ``"deadline"``), the worker is overloaded
      (``RESOURCE_EXHAUSTED``, ``"busy"``), or this connection was closed (``"closed"``);
    - ``RpcError`` (the proxy evicts the worker): any other gRPC status (``"grpc-status"``),
      or a reply that does not follow the wire format (``"protocol"``);
    - :class:`~shardline.errors.WorkerError` (propagates; the worker stays pooled; for a
      handler's built-in exception type, also an instance of it, see ``WorkerError``): the
      handler raised, or the worker has no handler of that name;
    - ``TypeError`` / ``ValueError`` before anything is sent: ``task`` is not a ``Task`` with a
      str handler, its payload is not JSON, or the request would exceed ``max_message_bytes``.

    Every ``RpcError`` it raises has its ``address`` (``metadata.address``) and ``reason`` set
    (see :class:`~shardline.errors.RpcError`).

    ``close()`` (idempotent, synchronous) says this connection is no longer needed; calls in
    flight through it finish normally. A connection that is garbage-collected unclosed is
    closed then.

    Implementation notes: connections with the same address, credentials object and limit on
    the same loop share one gRPC channel, counted by reference. The channel is made (and starts
    connecting) with the first such connection; when the last one closes it leaves the
    registry, so a connection made afterwards gets a new channel, and it is closed once its
    last call in flight has finished. A worker refreshed to a new address therefore gets a
    new channel, and the old one closes when the old connection does and its calls are done.
    """

    def __init__(
        self,
        metadata: WorkerMetadata,
        *,
        credentials: grpc.ChannelCredentials | None = None,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        tls: TlsSettings | None = None,
    ) -> None:
        if max_message_bytes < 1:
            raise ValueError(f"max_message_bytes must be positive, got {max_message_bytes}")
        if tls is not None and credentials is not None:
            raise ValueError("give GrpcConnection tls or credentials, not both")
        target = grpc_record_target(metadata.address)
        name = None
        if metadata.address.startswith(TLS_SCHEME) and credentials is None:
            if tls is None:
                tls = TlsSettings()
            credentials = tls.grpc_channel_credentials()
            name = tls.server_hostname
        self.metadata = metadata
        self._max_message_bytes = max_message_bytes
        self._shared = acquire_channel(target, credentials, max_message_bytes, name)
        self._finalizer = weakref.finalize(self, release, self._shared)
        # At exit the loop, and the channels on it, are gone already.
        self._finalizer.atexit = False

    def __repr__(self) -> str:
        state = "" if self._finalizer.alive else ", closed"
        return f"GrpcConnection({self.metadata.uid}, {self.metadata.address!r}{state})"

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def close(self) -> None:
        """Releases this connection's share of its channel; later calls are no-ops."""
        self._finalizer()

    async def dispatch(self, task: Task, *, timeout: float | None = None) -> Any:
        """Runs ``task`` on the worker; see the class docstring for the errors."""
        if not isinstance(task, Task):
            raise TypeError(f"a GrpcConnection dispatches Task objects, not {type(task).__name__}")
        address = self.metadata.address
        if not self._finalizer.alive:
            raise TransientRpcError(
                f"the connection to the worker at {address} is closed",
                reason="closed",
                address=address,
            )
        request = encode_request(task, self._max_message_bytes)
        shared = self._shared
        shared.begin_call()
        try:
            reply = await shared.call(request, timeout=timeout)
        except grpc.aio.AioRpcError as error:
            code = error.code()
            details = error.details() or ""
            message = f"worker at {address}: {code.name}: {details}"
            sent = not (
                _NOT_STARTED in tuple(error.trailing_metadata() or ())
                or (code == grpc.StatusCode.UNAVAILABLE and _NOT_CONNECTED in details)
            )
            if not sent and address.startswith(TLS_SCHEME) and _CLOSED in details:
                # what gRPC says of a worker that refused this side's certificate
                message += (
                    " (a worker that requires client certificates closes the connection so when"
                    " it refuses this side's, or none was given)"
                )
            reason = _TRANSIENT_CODES.get(code)
            if reason is not None:
                raise TransientRpcError(
                    message, reason=reason, address=address, sent=sent
                ) from error
            raise RpcError(message, reason="grpc-status", address=address, sent=sent) from error
        finally:
            shared.end_call()
        try:
            result, failure = decode_reply(reply)
        except MalformedMessage as error:
            raise RpcError(
                f"worker at {address}: {error}", reason="protocol", address=address
            ) from None
        if failure is not None:
            raise worker_error(
                failure.type,
                failure.message,
                handler=task.handler,
                address=address,
                builtin=failure.builtin,
                traceback=failure.traceback,
            )
        return result
