"""Streaming: async generator handlers on real worker processes (``stream_worker.py`` over
loopback TCP, ``LocalPool`` over its Unix sockets), read through ``WorkerProxy.stream``:
items in order, credit-based flow control, cancellation on the wire, an error mid-stream,
the deadline, never sent again after the first item, one dispatch for health, and the clear
errors for a handler of the wrong kind and for the gRPC transport."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgpack  # type: ignore[import-untyped]
import pytest

from shardline import (
    DeadlineExceeded,
    OutcomeUnknown,
    WorkerError,
    WorkerMetadata,
    WorkerProxy,
)
from shardline.discovery.record import decode_record
from shardline.transport import LocalPool, Task, connect
from shardline.transport.msgpack import wire
from shardline.transport.msgpack.stream_wire import DEFAULT_WINDOW
from shardline.workers import DiscoveryEvent
from support.delegate_balancers import InAdmissionOrder
from support.raw_peer import RawPeer
from support.transport_servers import new_namespace
from support.waiting import until

pytestmark = [pytest.mark.integration, pytest.mark.async_timeout(60.0)]

WORKER_SCRIPT = Path(__file__).with_name("stream_worker.py")
SPEC = "stream_handlers:HANDLERS"
READY = 15.0


async def announced(*records: WorkerMetadata) -> AsyncIterator[DiscoveryEvent]:
    """A discovery that adds ``records``, then stays open."""
    for record in records:
        yield DiscoveryEvent("worker-added", record)
    await asyncio.Event().wait()


@asynccontextmanager
async def tcp_workers(
    directory: Path, count: int, **proxy_options: Any
) -> AsyncIterator[tuple[list[WorkerMetadata], WorkerProxy]]:
    """``count`` worker processes serving ``stream_handlers`` on loopback TCP, and a proxy over
    them (made with ``proxy_options``)."""
    processes = []
    try:
        for _ in range(count):
            processes.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    str(WORKER_SCRIPT),
                    str(directory),
                    new_namespace(),
                    "127.0.0.1:0",
                    stdout=asyncio.subprocess.PIPE,
                )
            )
        records = []
        for process in processes:
            assert process.stdout is not None
            line = await asyncio.wait_for(process.stdout.readline(), READY)
            assert line, "the worker exited before it served"
            records.append(decode_record(line.rstrip(b"\n")))
            assert records[-1].address.startswith("msgpack+tcp://127.0.0.1:")
        async with WorkerProxy(
            discovery=announced(*records), connect=connect, quorum=count, **proxy_options
        ) as proxy:
            yield records, proxy
    finally:
        for process in processes:
            if process.returncode is None:
                process.kill()
            await process.communicate()


@asynccontextmanager
async def tcp_worker(
    directory: Path, **proxy_options: Any
) -> AsyncIterator[tuple[WorkerMetadata, WorkerProxy]]:
    """One worker process serving ``stream_handlers`` on loopback TCP, and a proxy over it."""
    async with tcp_workers(directory, 1, **proxy_options) as (records, proxy):
        yield records[0], proxy


async def progress(proxy: WorkerProxy, key: str) -> tuple[int | None, bool]:
    """How many items the generator run under ``key`` produced (None: it never started), and
    whether it closed."""
    produced, closed = await proxy.dispatch(Task("progress", key), timeout=5.0)
    return produced, closed


async def test_items_arrive_in_order_and_the_stream_ends(tmp_path: Path) -> None:
    async with tcp_worker(tmp_path) as (_, proxy):
        assert [item async for item in proxy.stream(Task("count", 1000), timeout=10.0)] == list(
            range(1000)
        )
        assert [item async for item in proxy.stream(Task("count", 0), timeout=10.0)] == []
        stats = proxy.stats()
    assert (stats.dispatched, stats.errors, stats.transient) == (2, 0, 0)


async def test_the_generator_is_never_advanced_past_the_credit_window(tmp_path: Path) -> None:
    key = uuid.uuid4().hex
    async with tcp_worker(tmp_path) as (_, proxy):
        stream = proxy.stream(Task("tracked", key), timeout=30.0)
        read = [await anext(stream) for _ in range(10)]
        assert read == list(range(10))

        async def produced(at_least: int) -> Callable[[], Any]:
            async def reached() -> bool:
                return ((await progress(proxy, key))[0] or 0) >= at_least

            return reached

        # the worker sends a window ahead (10 read: no credit granted back yet), then waits
        await until(await produced(DEFAULT_WINDOW), "a window produced")
        for _ in range(5):  # for as long as the caller does not read (round trips to it)
            assert await progress(proxy, key) == (DEFAULT_WINDOW, False)
        # each half window read grants a half window more: 40 read, one grant
        read += [await anext(stream) for _ in range(30)]
        assert read == list(range(40))
        grant = DEFAULT_WINDOW // 2
        await until(await produced(DEFAULT_WINDOW + grant), "the granted items produced")
        for _ in range(5):
            assert await progress(proxy, key) == (DEFAULT_WINDOW + grant, False)
        await stream.aclose()


async def test_leaving_the_loop_cancels_the_stream_and_closes_the_generator(
    tmp_path: Path,
) -> None:
    key = uuid.uuid4().hex
    async with tcp_worker(tmp_path) as (_, proxy):
        async for item in proxy.stream(Task("tracked", key), timeout=30.0):
            if item == 2:
                break

        async def closed() -> bool:
            return (await progress(proxy, key))[1]

        await until(closed, "generator closed by the cancel")
        produced, _ = await progress(proxy, key)
        assert produced is not None
        assert produced <= 3 + DEFAULT_WINDOW
        # the socket serves on
        assert [item async for item in proxy.stream(Task("count", 3), timeout=5.0)] == [0, 1, 2]


async def test_a_caller_cancelled_while_it_waits_cancels_the_stream(tmp_path: Path) -> None:
    key = uuid.uuid4().hex
    async with tcp_worker(tmp_path) as (_, proxy):
        started = asyncio.Event()

        async def read_all() -> None:
            async for _ in proxy.stream(Task("stalls", [key, 1]), timeout=30.0):
                started.set()

        reader = asyncio.ensure_future(read_all())
        await started.wait()
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader

        async def closed() -> bool:
            return (await progress(proxy, key))[1]

        await until(closed, "generator closed by the cancel")


async def test_an_error_mid_stream_is_raised_at_its_item(tmp_path: Path) -> None:
    async with tcp_worker(tmp_path) as (record, proxy):
        stream = proxy.stream(Task("fails_after", 5), timeout=10.0)
        assert [await anext(stream) for _ in range(5)] == [0, 1, 2, 3, 4]
        with pytest.raises(WorkerError) as caught:
            await anext(stream)
        assert caught.value.remote_type == "ValueError"
        assert caught.value.remote_message == "failed after 5 items"
        assert caught.value.address == record.address
        # an error before the first item too: the handler's, not the transport's
        with pytest.raises(WorkerError, match="failed after 0 items"):
            await anext(proxy.stream(Task("fails_after", 0), timeout=10.0))
        assert proxy.stats().outcomes_unknown == 0


async def test_the_deadline_bounds_the_whole_stream(tmp_path: Path) -> None:
    key, before = uuid.uuid4().hex, uuid.uuid4().hex
    # no health: a stream held before its first item makes its worker look stuck, as a call
    # would, and the test reads the worker's state through it afterwards
    async with tcp_worker(tmp_path, health=None) as (_, proxy):
        loop = asyncio.get_running_loop()
        began = loop.time()
        stream = proxy.stream(Task("stalls", [key, 3]), timeout=0.5)
        assert [await anext(stream) for _ in range(3)] == [0, 1, 2]
        with pytest.raises(DeadlineExceeded) as caught:
            await anext(stream)
        took = loop.time() - began
        assert 0.5 <= took < 3.0
        assert isinstance(caught.value, TimeoutError)
        assert caught.value.may_have_run
        with pytest.raises(StopAsyncIteration):  # the stream is over
            await anext(stream)

        async def closed() -> bool:
            return (await progress(proxy, key))[1]

        await until(closed, "generator closed at the deadline")
        # before the first item: the same error
        with pytest.raises(DeadlineExceeded):
            await anext(proxy.stream(Task("stalls", [before, 0]), timeout=0.3))

        async def closed_before() -> bool:
            return (await progress(proxy, before))[1]

        await until(closed_before, "generator closed at the deadline before its first item")
        assert proxy.stats().deadlines == 2


async def test_a_stalled_worker_that_resumes_never_starts_a_stream_its_caller_gave_up_on(
    tmp_path: Path,
) -> None:
    key = uuid.uuid4().hex
    async with tcp_worker(tmp_path, health=None) as (record, proxy):
        assert await anext(proxy.stream(Task("count", 1), timeout=5.0)) == 0  # connected
        os.kill(record.pid, signal.SIGSTOP)
        try:
            with pytest.raises(DeadlineExceeded):
                await anext(proxy.stream(Task("tracked", key), timeout=0.2))
        finally:
            os.kill(record.pid, signal.SIGCONT)
        # read after its deadline: answered not started, the generator never made
        assert await progress(proxy, key) == (None, False)


async def test_a_stream_ended_in_time_yields_every_item_however_late_it_is_read(
    tmp_path: Path,
) -> None:
    async with tcp_worker(tmp_path) as (_, proxy):
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 2.0
        stream = proxy.stream(Task("count", 5), timeout=2.0)
        assert await anext(stream) == 0
        # the premise, waited for: the stream's end has arrived (long before its deadline)
        await until(lambda: stream._inner._feed.outcome is not None, "the stream's end")
        assert loop.time() < deadline
        # the thing tested: the deadline passes with the stream ended, and nothing is lost
        await asyncio.sleep(deadline + 0.1 - loop.time())
        assert [item async for item in stream] == [1, 2, 3, 4]


async def test_a_stream_is_one_dispatch_for_health(tmp_path: Path) -> None:
    key = uuid.uuid4().hex
    async with tcp_worker(tmp_path) as (record, proxy):
        before = proxy.stats().dispatched
        stream = proxy.stream(Task("tracked", key), timeout=30.0)
        assert await anext(stream) == 0
        health = proxy.health(record.uid)
        assert health is not None
        # counted from its start to its first item: not in flight while it goes on
        assert (health.state, health.in_flight) == ("healthy", 0)
        assert proxy.stats().dispatched == before + 1
        for _ in range(100):
            await anext(stream)
        await stream.aclose()
        assert proxy.stats().dispatched == before + 1


async def test_a_generator_handler_given_to_dispatch_and_a_plain_one_given_to_stream_are_refused(
    tmp_path: Path,
) -> None:
    async with tcp_worker(tmp_path) as (_, proxy):
        with pytest.raises(WorkerError, match=r"is an async generator.*stream") as caught:
            await proxy.dispatch(Task("count", 3), timeout=5.0)
        assert caught.value.remote_type == "shardline.BadRequest"
        with pytest.raises(WorkerError, match="not an async generator function") as caught:
            await anext(proxy.stream(Task("echo", 3), timeout=5.0))
        assert caught.value.remote_type == "shardline.BadRequest"
        with pytest.raises(WorkerError, match="no handler named 'nothing'"):
            await anext(proxy.stream(Task("nothing", 3), timeout=5.0))


async def test_a_stream_is_never_sent_again_after_its_first_item(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    async with LocalPool(SPEC, workers=2, timeout=10.0) as pool:
        for idempotent in (False, True):
            runs.write_text("")
            stream = pool.stream(Task("recorded", str(runs)), idempotent=idempotent)
            pid = await anext(stream)
            os.kill(pid, signal.SIGKILL)
            with pytest.raises(OutcomeUnknown, match="broke after 1 items") as caught:
                await anext(stream)
            assert caught.value.reason == "connection-lost"
            assert runs.read_text().split() == [str(pid)], "run once, on the killed worker"

            async def replaced(pid: int = pid) -> bool:
                return len(pool.workers) == 2 and pid not in pool.pids

            await until(replaced, "the killed worker replaced")


async def test_local_pool_streams_over_its_unix_sockets() -> None:
    async with LocalPool(SPEC, workers=2, timeout=10.0) as pool:
        assert pool.workers[0].address.startswith("msgpack+unix://")
        for _ in range(4):  # round robin: both workers
            assert [item async for item in pool.stream(Task("count", 50))] == list(range(50))


async def test_the_grpc_transport_cannot_stream_and_says_so() -> None:
    async with LocalPool(SPEC, workers=1, transport="grpc", timeout=10.0) as pool:
        with pytest.raises(NotImplementedError, match=r"GrpcConnection.*cannot stream.*grpc"):
            await anext(pool.stream(Task("count", 3)))
        with pytest.raises(WorkerError, match="the grpc transport does not stream") as caught:
            await pool.dispatch(Task("count", 3))
        assert caught.value.remote_type == "shardline.BadRequest"
        assert await pool.dispatch(Task("echo", 1)) == 1


def unordered(messages: list[Any]) -> list[Any]:
    return sorted(messages, key=repr)


async def test_the_wire_items_credit_cancel_and_end_as_specified(tmp_path: Path) -> None:
    async with tcp_worker(tmp_path) as (record, _):
        where = wire.record_address(record.address)
        assert not isinstance(where, str)
        peer = RawPeer(*await asyncio.open_connection(*where), timeout=READY)
        try:
            peer.writer.write(wire.hello(1 << 20, None))
            assert (await peer.read())[1] == wire.HELLO
            # a window of 2: two items, then nothing until a credit comes
            peer.send([0, 5, "shardline.stream", ["count", msgpack.packb(10), None, None, 2]])
            peer.send([0, 6, "shardline.ping", []])
            # (the ping's answer may overtake the items: it needs no task)
            assert unordered([await peer.read() for _ in range(3)]) == unordered(
                [
                    [2, "shardline.item", [5, msgpack.packb(0)]],
                    [2, "shardline.item", [5, msgpack.packb(1)]],
                    [1, 6, None, None],
                ]
            )
            peer.send([2, "shardline.credit", [5, 1]])
            peer.send([0, 7, "shardline.ping", []])
            assert unordered([await peer.read() for _ in range(2)]) == unordered(
                [[2, "shardline.item", [5, msgpack.packb(2)]], [1, 7, None, None]]
            )
            # cancelled: nothing more of it, and the socket serves on
            peer.send([2, "shardline.cancel", [5]])
            peer.send([2, "shardline.credit", [5, 100]])  # for a stream that ended: ignored
            peer.send([0, 8, "shardline.ping", []])
            assert await peer.read() == [1, 8, None, None]
            # a stream to its end: the answer comes last, nil
            peer.send([0, 9, "shardline.stream", ["count", msgpack.packb(2), 5.0, None, 64]])
            assert [await peer.read() for _ in range(3)] == [
                [2, "shardline.item", [9, msgpack.packb(0)]],
                [2, "shardline.item", [9, msgpack.packb(1)]],
                [1, 9, None, None],
            ]
            # a window out of range is the request's bad_request
            peer.send([0, 10, "shardline.stream", ["count", msgpack.packb(2), None, None, 0]])
            answer = await peer.read()
            assert answer[:2] == [1, 10]
            assert answer[2]["kind"] == "bad_request"
            assert "window" in answer[2]["message"]
            # a malformed credit breaks the protocol: the socket is closed
            peer.send([2, "shardline.credit", [9, 0]])
            with pytest.raises(ConnectionError):
                await peer.read()
        finally:
            peer.writer.close()


async def test_before_its_first_item_a_stream_follows_dispatchs_delivery_rules(
    tmp_path: Path,
) -> None:
    async with tcp_workers(tmp_path, 3) as (_, proxy):
        for idempotent in (False, True):
            runs = tmp_path / f"runs-{idempotent}"
            stream = proxy.stream(Task("first_holds", str(runs)), idempotent=idempotent)
            first = asyncio.ensure_future(anext(stream))

            async def reached(runs: Path = runs) -> bool:
                return runs.exists() and len(runs.read_text().split()) == 1

            await until(reached, "the task reached a worker")
            held = int(runs.read_text())
            os.kill(held, signal.SIGKILL)
            if idempotent:  # sent again to another worker (the dead one is not reached)
                served = await first
                assert served != held
                assert runs.read_text().split() == [str(held), str(served)]
            else:  # it may have run: never sent again
                with pytest.raises(OutcomeUnknown, match="may have run") as caught:
                    await first
                assert caught.value.reason == "connection-lost"
                assert runs.read_text().split() == [str(held)]


async def test_a_delegate_balancer_streams_and_offers_the_next_worker_after_a_failure(
    tmp_path: Path,
) -> None:
    async with tcp_workers(tmp_path, 2, loadbalancer=InAdmissionOrder()) as (records, proxy):
        dead = records[0].pid
        os.kill(dead, signal.SIGKILL)

        async def gone() -> bool:  # exited (a zombie, or reaped): its socket is closed
            try:
                return Path(f"/proc/{dead}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
            except FileNotFoundError:
                return True

        await until(gone, "the killed worker gone")
        # the first candidate cannot be reached: the second one streams
        assert [item async for item in proxy.stream(Task("count", 3))] == [0, 1, 2]
        stats = proxy.stats()
    # refused, or (its last threads still exiting) accepted and closed before the hello:
    # either way not sent, so the next candidate took the stream
    failed = {reason: count for reason, count in stats.rpc_failures.items() if count}
    assert failed in ({"cannot-connect": 1}, {"connection-lost": 1})
    assert (stats.dispatched, stats.transient) == (2, 1)
