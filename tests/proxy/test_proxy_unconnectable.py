"""A discovery record that ``connect`` cannot make a connection for (here the transports' own
``connect`` on a malformed address) is skipped and counted, and the proxy goes on following
discovery: the second safety rule in docs/architecture.md."""

from __future__ import annotations

import logging

import pytest

from shardline import WorkerProxy
from shardline.transport import connect
from support.fakes import Stream, added, settle
from support.workers import worker

pytestmark = pytest.mark.async_timeout(30)


async def test_a_record_without_a_connection_is_skipped_and_the_stream_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="shardline.proxy")
    stream = Stream(
        added(1, address="msgpack+tcp://no-port-here"),
        added(2, address="msgpack+tcp://127.0.0.1:5002"),
    )
    async with WorkerProxy(discovery=stream, connect=connect) as proxy:
        await settle()
        assert [record.uid for record in proxy.workers] == [worker(2).uid]
        # a pooled worker's new record that cannot be reached: its old address is superseded,
        # so the worker leaves rather than keep it
        stream.send("worker-updated", worker(2, address="msgpack+tcp://[127.0.0.1]:5002"))
        stream.send("worker-added", worker(3, address="msgpack+tcp://127.0.0.1:5003"))
        await settle()
        assert [record.uid for record in proxy.workers] == [worker(3).uid]
        stats = proxy.stats()
    assert (stats.admissions, stats.not_admitted) == (2, 1)
    assert stats.evictions == {"broken": 0, "dropped": 0, "unconnectable": 1}
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("'msgpack+tcp://no-port-here'" in message for message in warned)
    assert any("'msgpack+tcp://[127.0.0.1]:5002'" in message for message in warned)
