"""What the tests of EtcdDiscovery and EtcdRecordStore share: a relay to cut them off etcd, the
failover a failed call causes, the arguments both refuse, and a pool connection that answers at
once."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from shardline import WorkerMetadata
from shardline.discovery.etcd_connection import EtcdConnection
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
