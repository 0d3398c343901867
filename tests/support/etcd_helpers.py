"""What the tests of EtcdDiscovery and EtcdRecordStore share: a relay to cut them off etcd, the
failover a failed call causes, the arguments both refuse, a pool connection that answers at
once, and fresh registration namespaces with a record store run on one."""

from __future__ import annotations

import contextlib
import itertools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from shardline import WorkerMetadata
from shardline.discovery.etcd_connection import EtcdConnection
from shardline.registration.etcd_store import EtcdRecordStore
from support.etcd_relay import Relay
from support.etcd_server import EtcdServer

# (arguments, what the ValueError names) that every etcd handle refuses: its connection's and its
# namespace's; a test adds the handle's own and merges them into valid arguments
BAD_CONNECTION_ARGUMENTS: list[tuple[dict[str, Any], str]] = [
    ({"endpoints": []}, "at least one"),
    ({"endpoints": ["127.0.0.1"]}, "'127.0.0.1'"),
    ({"endpoints": ["ftp://127.0.0.1:2379"]}, "'ftp://127.0.0.1:2379'"),
    ({"endpoints": "127.0.0.1:2379,localhost:x"}, "'localhost:x'"),
    ({"endpoints": ["http://127.0.0.1:2379"], "ca_cert": __file__}, "plain http"),
    ({"namespace": ""}, "''"),
    ({"namespace": "a/b"}, "'a/b'"),
    ({"namespace": None}, "None"),
    ({"timeout": 0}, "0"),
    ({"timeout": -1}, "-1"),
    ({"username": "someone"}, "username and password"),
    ({"cert_key": "key.pem"}, "cert_key and cert_cert"),
    ({"ca_cert": "/nonexistent/ca.pem"}, "'/nonexistent/ca.pem'"),
]


@contextlib.asynccontextmanager
async def relay_to(etcd: EtcdServer) -> AsyncIterator[Relay]:
    """A started :class:`Relay` in front of ``etcd``, closed afterwards."""
    relay = Relay(etcd.client_port)
    await relay.start()
    try:
        yield relay
    finally:
        await relay.aclose()


async def fail_over(connection: EtcdConnection) -> None:
    """What a call that failed with UNAVAILABLE does: the shared channel is closed (the next
    one opens on the next endpoint), and grpc cancels every stream on it."""
    await connection.recover(await connection.stubs(), ConnectionError("lost"))


class Instant:
    """A connection that answers at once with the address it was made for."""

    def __init__(self, metadata: WorkerMetadata) -> None:
        self.address = metadata.address

    async def dispatch(self, task: Any, *, timeout: float | None = None) -> str:
        return self.address


_namespaces = itertools.count()


def namespace() -> str:
    """A fresh registration namespace: a test's records never meet another's."""
    return f"registration-{next(_namespaces)}-{uuid.uuid4().hex[:8]}"


async def with_store(
    etcd: EtcdServer, scenario: Callable[[EtcdRecordStore], Awaitable[Any]], **options: Any
) -> Any:
    """Runs ``scenario`` with a store on a fresh namespace, closing it afterwards."""
    async with EtcdRecordStore([etcd.endpoint], namespace(), **options) as store:
        return await scenario(store)
