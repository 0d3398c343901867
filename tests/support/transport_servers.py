"""Real gRPC servers on loopback for the transport tests: workers made by `serve`, and raw
servers that answer the dispatch method the way no worker does."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import grpc
import grpc.aio

from shardline.discovery import InProcessDiscovery
from shardline.transport import Handler, WorkerServer, serve_grpc
from shardline.transport.demo_handlers import DEMO_HANDLERS
from shardline.workers import WorkerMetadata

T = TypeVar("T")
WAIT = 20.0
_namespaces = itertools.count()

RawBehaviour = Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]


def new_namespace() -> str:
    return f"transport-{next(_namespaces)}-{uuid.uuid4().hex[:8]}"


def at(address: str) -> WorkerMetadata:
    """A record of a worker (a fresh uid) at ``address``: what a test publishes by hand."""
    return WorkerMetadata(uid=uuid.uuid4(), address=address, pid=0, version="")


@asynccontextmanager
async def worker(
    namespace: str | None = None,
    handlers: Mapping[str, Handler] = DEMO_HANDLERS,
    address: str = "127.0.0.1:0",
    **options: Any,
) -> AsyncIterator[WorkerServer]:
    """A worker announced through its own handle on `namespace`, stopped on the way out."""
    discovery = InProcessDiscovery(namespace or new_namespace())
    server = await serve_grpc(handlers, address, discovery, **options)
    try:
        yield server
    finally:
        await server.stop(0)


@asynccontextmanager
async def raw_server(behaviour: RawBehaviour | None) -> AsyncIterator[str]:
    """A bare gRPC server answering ``/shardline.Worker/Dispatch`` with `behaviour` (with
    nothing when it is None); yields its address."""
    server = grpc.aio.server()
    if behaviour is not None:
        method = grpc.unary_unary_rpc_method_handler(behaviour)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("shardline.Worker", {"Dispatch": method}),)
        )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)
