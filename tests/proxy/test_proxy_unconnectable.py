"""A discovery record that ``connect`` cannot make a connection for (here the transports' own
``connect`` on a malformed address) is skipped and counted, and the proxy goes on following
discovery: the second safety rule in docs/architecture.md."""

from __future__ import annotations

import logging

import pytest

from shardline import InvalidAddress, WorkerProxy
from shardline.transport import connect
from shardline.transport.grpc.connection import GrpcConnection
from support.fakes import Stream, added, settle
from support.workers import worker

pytestmark = pytest.mark.async_timeout(30)


@pytest.mark.parametrize(
    "scheme", ["msgpack+tcp://", "grpc://", ""], ids=["msgpack", "grpc", "bare"]
)
async def test_a_record_without_a_connection_is_skipped_and_the_stream_goes_on(
    caplog: pytest.LogCaptureFixture, scheme: str
) -> None:
    caplog.set_level(logging.WARNING, logger="shardline.proxy")
    stream = Stream(
        added(1, address=f"{scheme}no-port-here"),
        added(2, address=f"{scheme}127.0.0.1:5002"),
    )
    async with WorkerProxy(discovery=stream, connect=connect) as proxy:
        await settle()
        assert [record.uid for record in proxy.workers] == [worker(2).uid]
        # a pooled worker's new record that cannot be reached: its old address is superseded,
        # so the worker leaves rather than keep it
        stream.send("worker-updated", worker(2, address=f"{scheme}[127.0.0.1]:5002"))
        stream.send("worker-added", worker(3, address=f"{scheme}127.0.0.1:5003"))
        await settle()
        assert [record.uid for record in proxy.workers] == [worker(3).uid]
        stats = proxy.stats()
    assert (stats.admissions, stats.not_admitted) == (2, 1)
    assert stats.evictions == {"broken": 0, "dropped": 0, "unconnectable": 1}
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"'{scheme}no-port-here'" in message for message in warned)
    assert any(f"'{scheme}[127.0.0.1]:5002'" in message for message in warned)


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("grpc://127.0.0.1", None),
        ("grpc://127.0.0.1:0", "port 0 is out of range (1 to 65535)"),
        ("127.0.0.1:http", "the port 'http' is not a number"),
        ("grpc://::1:5000", "an IPv6 host is written in brackets, as [::1]:port"),
    ],
)
async def test_a_grpc_connection_checks_its_address_when_it_is_made(
    address: str, reason: str | None
) -> None:
    with pytest.raises(InvalidAddress, match=f"not {address!r}") as refused:
        GrpcConnection(worker(1, address=address))
    assert refused.value.reason == reason
    made = GrpcConnection(worker(1, address="grpc://[::1]:5000"))
    assert not made.closed
    made.close()
