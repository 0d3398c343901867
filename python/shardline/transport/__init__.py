"""Workers over gRPC: :func:`serve` runs a worker and announces it through discovery;
:class:`GrpcConnection` dispatches :class:`Task` objects to it, for ``WorkerProxy``.

:class:`LocalPool` starts worker processes on this machine serving the caller's handlers,
announced through ``LocalDiscovery``, and dispatches to them through a ``WorkerProxy``, in one
``async with``; it replaces workers that die and stops them all on the way out.

Needs the ``grpc`` extra (``grpcio``). The wire format is described in
:mod:`shardline.transport.wire`; ``shardline worker`` runs one worker with the handlers of
:mod:`shardline.transport.demo_handlers`.
"""

from shardline.transport.connection import GrpcConnection
from shardline.transport.local_pool import LocalPool
from shardline.transport.server import Handler, RetryElsewhere, WorkerServer, serve
from shardline.transport.wire import MAX_MESSAGE_BYTES, Task

__all__ = [
    "MAX_MESSAGE_BYTES",
    "GrpcConnection",
    "Handler",
    "LocalPool",
    "RetryElsewhere",
    "Task",
    "WorkerServer",
    "serve",
]
