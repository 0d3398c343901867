"""``serve`` and ``connect``: the transport of a worker chosen by name when it is served, and by
the scheme of its published address when a proxy connects to it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from shardline.discovery.protocol import Discovery
from shardline.transport.grpc.wire import SCHEME as GRPC_SCHEME
from shardline.transport.grpc.wire import TLS_SCHEME as GRPCS_SCHEME
from shardline.transport.serving import Handler
from shardline.workers import WorkerMetadata

if TYPE_CHECKING:
    from shardline.transport.grpc.connection import GrpcConnection
    from shardline.transport.grpc.server import WorkerServer
    from shardline.transport.msgpack.connection import MsgpackConnection
    from shardline.transport.msgpack.server import MsgpackWorkerServer

__all__ = ["DEFAULT_TRANSPORT", "TRANSPORTS", "connect", "serve"]

TRANSPORTS = ("msgpack", "grpc")
"""The transports a worker can be served with; the first is the default."""
DEFAULT_TRANSPORT = TRANSPORTS[0]

_MSGPACK = "msgpack+"


async def serve(
    handlers: Mapping[str, Handler],
    address: str,
    discovery: Discovery,
    *,
    transport: str = DEFAULT_TRANSPORT,
    **options: Any,
) -> MsgpackWorkerServer | WorkerServer:
    """Serves ``handlers`` at ``address`` over ``transport`` and announces the worker through
    ``discovery``; returns once it serves and its record is published.

    ``transport`` is ``"msgpack"`` (MessagePack-RPC, the default: see
    :func:`~shardline.transport.msgpack.server.serve_msgpack`, which also takes a Unix socket
    path as ``address``) or ``"grpc"`` (:func:`~shardline.transport.grpc.server.serve_grpc`, which
    needs the ``grpc`` extra); ``options`` are that function's keyword arguments. Any other
    ``transport`` is a ``ValueError``. The record's address carries the transport's scheme
    (``msgpack+tcp://``, ``msgpack+tls://``, ``msgpack+unix://``, ``grpc://``, ``grpcs://``),
    so :func:`connect` picks the matching connection, with TLS when the worker serves it.

    Both take ``tls=TlsSettings(cert=..., key=..., ca=...)`` (see
    :class:`~shardline.transport.tls.TlsSettings`; with ``ca``, mutual TLS) and refuse to
    serve plaintext at a TCP address that is not loopback unless ``insecure=True``.
    """
    if transport == "msgpack":
        from shardline.transport.msgpack.server import serve_msgpack

        return await serve_msgpack(handlers, address, discovery, **options)
    if transport == "grpc":
        from shardline.transport.grpc.server import serve_grpc

        return await serve_grpc(handlers, address, discovery, **options)
    raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}")


def connect(metadata: WorkerMetadata, **options: Any) -> MsgpackConnection | GrpcConnection:
    """The connection to the worker ``metadata`` describes, by the scheme of its address:
    :class:`~shardline.transport.msgpack.connection.MsgpackConnection` for
    ``msgpack+tcp://``, ``msgpack+tls://`` and ``msgpack+unix://``,
    :class:`~shardline.transport.grpc.connection.GrpcConnection` for ``grpc://``, ``grpcs://`` and
    for a bare ``host:port`` (records published before addresses carried a scheme).
    ``options`` go to the class. Made for ``WorkerProxy(connect=connect)``: one proxy can hold
    workers of both kinds. Any other scheme is a ``ValueError`` naming the address.

    ``msgpack+tls://`` and ``grpcs://`` are dialled with TLS: give the caller's
    :class:`~shardline.transport.tls.TlsSettings` as ``tls=`` (say
    ``functools.partial(connect, tls=settings)``; without it, the system's trust store and no
    client certificate). Workers whose records name no TLS are dialled in plaintext.
    """
    address = metadata.address
    # the connection class checks the rest of the address; this picks it without importing
    # either transport's dependencies
    if address.startswith(_MSGPACK):
        from shardline.transport.msgpack.connection import MsgpackConnection

        return MsgpackConnection(metadata, **options)
    if address.startswith((GRPC_SCHEME, GRPCS_SCHEME)) or "://" not in address:
        from shardline.transport.grpc.connection import GrpcConnection

        return GrpcConnection(metadata, **options)
    raise ValueError(
        f"worker {metadata.uid} has an address of no known transport: {address!r}"
        f" (expected msgpack+tcp://, msgpack+tls://, msgpack+unix://, {GRPC_SCHEME} or"
        f" {GRPCS_SCHEME})"
    )
