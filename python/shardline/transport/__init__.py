"""Workers reached over the network: :func:`serve` runs a worker and announces it through
discovery; :func:`connect` makes the connection a ``WorkerProxy`` dispatches :class:`Task`
objects through, chosen by the scheme of the worker's address.

Two transports: MessagePack-RPC over TCP or a Unix socket (the default; the ``msgpack``
extra; the protocol is in ``docs/msgpack-rpc.md``): :func:`serve_msgpack`,
:class:`MsgpackConnection`; and gRPC (the ``grpc`` extra; the wire format is in
:mod:`shardline.transport.grpc.wire`): :func:`serve_grpc`, :class:`GrpcConnection`. Each is
imported on first use, so one transport's dependencies are never needed for the other.
Both serve and dial TLS and mutual TLS, configured by one :class:`TlsSettings`; a worker
refuses to serve plaintext off loopback unless told ``insecure=True``.
:class:`WorkerLimits` bounds what clients can make a MessagePack-RPC worker hold.
``shardline worker`` runs one worker with the handlers of
:mod:`shardline.transport.demo_handlers`, or the caller's (``--handlers MODULE:ATTRIBUTE``).

:class:`LocalPool` starts worker processes on this machine serving the caller's handlers,
announced through ``LocalDiscovery``, and dispatches to them through a ``WorkerProxy``, in one
``async with``; it replaces workers that die and stops them all on the way out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardline._lazy import lazy_exports
from shardline.transport.schemes import DEFAULT_TRANSPORT, TRANSPORTS, connect, serve
from shardline.transport.serving import Handler, RetryElsewhere
from shardline.transport.task import MAX_MESSAGE_BYTES, Task

if TYPE_CHECKING:
    from shardline.transport.grpc.connection import GrpcConnection
    from shardline.transport.grpc.server import WorkerServer, serve_grpc
    from shardline.transport.limits import WorkerLimits
    from shardline.transport.local.pool import LocalPool
    from shardline.transport.msgpack.connection import MsgpackConnection
    from shardline.transport.msgpack.server import MsgpackWorkerServer, serve_msgpack
    from shardline.transport.tls import TlsSettings

__all__ = [
    "DEFAULT_TRANSPORT",
    "MAX_MESSAGE_BYTES",
    "TRANSPORTS",
    "GrpcConnection",
    "Handler",
    "LocalPool",
    "MsgpackConnection",
    "MsgpackWorkerServer",
    "RetryElsewhere",
    "Task",
    "TlsSettings",
    "WorkerLimits",
    "WorkerServer",
    "connect",
    "serve",
    "serve_grpc",
    "serve_msgpack",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "shardline.transport.local.pool": ["LocalPool"],
        "shardline.transport.limits": ["WorkerLimits"],
        "shardline.transport.grpc.connection": ["GrpcConnection"],
        "shardline.transport.grpc.server": ["WorkerServer", "serve_grpc"],
        "shardline.transport.msgpack.connection": ["MsgpackConnection"],
        "shardline.transport.msgpack.server": ["MsgpackWorkerServer", "serve_msgpack"],
        "shardline.transport.tls": ["TlsSettings"],
    },
)
