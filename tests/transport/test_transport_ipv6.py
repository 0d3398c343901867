"""Both transports on the IPv6 loopback (``[::1]``, never another address), in process: a
worker served at ``[::1]:0`` publishes ``[::1]:PORT`` and a proxy dispatches to it; an IPv6
host without brackets is refused by the servers and the connections alike, naming it."""

from __future__ import annotations

import uuid

import pytest

from shardline import InvalidAddress, WorkerProxy
from shardline.discovery import InProcessDiscovery
from shardline.transport import MsgpackConnection, Task, connect, serve
from shardline.transport.demo_handlers import DEMO_HANDLERS
from shardline.workers import WorkerMetadata
from support.ipv6 import requires_ipv6
from support.transport_servers import WAIT, new_namespace

pytestmark = [pytest.mark.integration, pytest.mark.async_timeout(WAIT)]

TRANSPORTS = {"msgpack": "msgpack+tcp://", "grpc": "grpc://"}


@requires_ipv6
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("scheme", [False, True], ids=["bare", "with-scheme"])
async def test_a_worker_served_at_ipv6_loopback_publishes_it_in_brackets(
    transport: str, scheme: bool
) -> None:

    discovery = InProcessDiscovery(new_namespace())
    address = (TRANSPORTS[transport] if scheme else "") + "[::1]:0"
    async with await serve(DEMO_HANDLERS, address, discovery, transport=transport) as server:
        prefix = f"{TRANSPORTS[transport]}[::1]:"
        assert server.address.startswith(prefix)
        assert int(server.address.removeprefix(prefix)) > 0
        async with WorkerProxy(discovery=discovery.subscribe(), connect=connect) as proxy:
            assert await proxy.dispatch(Task("echo", [6])) == [6]


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(
    ("address", "says"),
    [
        ("::1:0", "an IPv6 host is written in brackets"),
        ("[127.0.0.1]:0", "'127.0.0.1' is not an IPv6 address"),
        ("[::1]:65536", "port 65536 is out of range (0 to 65535)"),
    ],
)
async def test_a_server_refuses_an_address_that_is_not_host_port(
    transport: str, address: str, says: str
) -> None:

    discovery = InProcessDiscovery(new_namespace())
    with pytest.raises(InvalidAddress) as raised:
        await serve(DEMO_HANDLERS, address, discovery, transport=transport)
    assert str(raised.value).startswith(f"address must be host:port, got {address!r}: {says}")


@pytest.mark.parametrize(
    ("address", "says"),
    [
        ("msgpack+tcp://::1:5000", "an IPv6 host is written in brackets"),
        ("msgpack+tcp://[127.0.0.1]:5000", "'127.0.0.1' is not an IPv6 address"),
    ],
)
def test_a_msgpack_connection_refuses_an_ipv6_host_without_brackets(
    address: str, says: str
) -> None:

    record = WorkerMetadata(uid=uuid.uuid4(), address=address, pid=0, version="")
    with pytest.raises(InvalidAddress) as raised:
        MsgpackConnection(record)
    assert str(raised.value) == (
        "a msgpack worker's address is msgpack+tcp://host:port, msgpack+tls://host:port or"
        f" msgpack+unix:///absolute/path, not {address!r}: {raised.value.reason}"
    )
    assert raised.value.reason is not None
    assert raised.value.reason.startswith(says)
