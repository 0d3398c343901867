"""``serve`` by transport name and ``connect`` by address scheme: one proxy holds workers of
both transports, each reached by the connection its record's scheme names."""

from __future__ import annotations

import re

import pytest

from shardline import WorkerProxy
from shardline.discovery import InProcessDiscovery
from shardline.transport import (
    DEFAULT_TRANSPORT,
    GrpcConnection,
    MsgpackConnection,
    Task,
    connect,
    serve,
)
from shardline.transport.demo_handlers import DEMO_HANDLERS
from shardline.workers import WorkerMetadata
from support.transport_servers import WAIT, at, new_namespace

pytestmark = [
    pytest.mark.integration,
    pytest.mark.async_timeout(WAIT),
]  # each async test, start to finish


async def test_serve_defaults_to_msgpack_and_records_carry_their_scheme() -> None:

    assert DEFAULT_TRANSPORT == "msgpack"
    namespace = new_namespace()
    async with (
        await serve(DEMO_HANDLERS, "127.0.0.1:0", InProcessDiscovery(namespace)) as fast,
        await serve(
            DEMO_HANDLERS, "127.0.0.1:0", InProcessDiscovery(namespace), transport="grpc"
        ) as interop,
    ):
        assert fast.metadata.address.startswith("msgpack+tcp://127.0.0.1:")
        assert interop.metadata.address.startswith("grpc://127.0.0.1:")
        made: dict[str, type] = {}

        def connect_and_note(metadata: WorkerMetadata) -> object:
            connection = connect(metadata)
            made[metadata.address] = type(connection)
            return connection

        proxy = WorkerProxy(
            discovery=InProcessDiscovery(namespace).subscribe(),
            connect=connect_and_note,
            quorum=2,
        )
        async with proxy:
            assert made == {
                fast.metadata.address: MsgpackConnection,
                interop.metadata.address: GrpcConnection,
            }
            # round-robin over the two: each transport answers half the calls
            answers = [await proxy.dispatch(Task("echo", {"n": n})) for n in range(6)]
            assert answers == [{"n": n} for n in range(6)]


async def test_connect_picks_the_class_by_scheme_and_names_an_unknown_one() -> None:

    for address, kind in (
        ("msgpack+tcp://127.0.0.1:1", MsgpackConnection),
        ("msgpack+unix:///tmp/x.sock", MsgpackConnection),
        ("grpc://127.0.0.1:1", GrpcConnection),
        ("127.0.0.1:1", GrpcConnection),  # a record from before the scheme
    ):
        connection = connect(at(address))
        try:
            assert type(connection) is kind
        finally:
            connection.close()
    with pytest.raises(ValueError, match=re.escape("'http://127.0.0.1:1'")):
        connect(at("http://127.0.0.1:1"))
    with pytest.raises(ValueError, match="msgpack\\+tcp://host:port"):
        connect(at("msgpack+udp://127.0.0.1:1"))
    with pytest.raises(ValueError, match="transport must be one of msgpack, grpc, got 'zmq'"):
        await serve(
            DEMO_HANDLERS, "127.0.0.1:0", InProcessDiscovery(new_namespace()), transport="zmq"
        )
