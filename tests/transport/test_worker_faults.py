"""A sick worker on real worker processes (``LocalPool``'s, and ``local_worker`` processes
started here): a stalled worker that resumes drops what its callers gave up on, a handler's
BaseException is that call's error and never the worker's end, sync handlers run on the
server's own threads, and a handler that blocks the loop does not cost the worker its
discovery membership."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from shardline.discovery.local import LocalDiscovery
from shardline.errors import TransientRpcError, WorkerError
from shardline.transport import LocalPool, Task
from shardline.transport.schemes import connect
from shardline.workers import DiscoveryEvent, WorkerMetadata

SPEC = "fault_handlers:HANDLERS"

pytestmark = [pytest.mark.integration, pytest.mark.async_timeout(40.0)]


@asynccontextmanager
async def stopped(pid: int) -> AsyncIterator[None]:
    """The process ``pid`` SIGSTOPped for the block, continued on the way out."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


async def test_a_stalled_worker_that_resumes_drops_the_calls_its_callers_gave_up_on(
    tmp_path: Path,
) -> None:
    ran = tmp_path / "ran"
    async with LocalPool(SPEC, workers=1) as pool:
        (metadata,) = pool.workers
        connection = connect(metadata)
        loop = asyncio.get_running_loop()
        try:
            # the socket and its hellos (the client's clock) are up before the stall
            began = loop.time()
            payload = {"file": str(ran), "tag": "before"}
            assert await connection.dispatch(Task("record", payload), timeout=5.0)
            # The worker places this client's deadlines late by at most what it saw of a
            # request's transit (the round trip just made, at most); resumed once the callers'
            # deadlines are past by more than that, it must drop every one of their calls.
            margin = loop.time() - began
            async with stopped(metadata.pid):
                calls = [
                    connection.dispatch(Task("record", {"file": str(ran), "tag": n}), timeout=0.2)
                    for n in range(20)
                ]
                given_up = loop.time() + 0.2
                failures = await asyncio.gather(*calls, return_exceptions=True)
                await asyncio.sleep(max(0.0, given_up + margin - loop.time()))
            for failure in failures:
                assert isinstance(failure, TransientRpcError), failure
                # given up on with the request written: as far as the caller knows, it may run
                assert (failure.reason, failure.sent) == ("deadline", True)
            # read after the 20 on the same socket: they were judged before this one ran
            tag = "after"
            payload = {"file": str(ran), "tag": tag}
            assert await connection.dispatch(Task("record", payload), timeout=5.0) == tag
        finally:
            connection.close()
    assert ran.read_text().split() == ["before", "after"]


@pytest.mark.parametrize("transport", ["msgpack", "grpc"])
async def test_a_handler_raising_a_base_exception_fails_its_call_and_the_worker_lives_on(
    transport: str,
) -> None:
    variants = [
        *(
            ("raise_async", [kind, when])
            for kind in ("SystemExit", "KeyboardInterrupt", "Custom")
            for when in ("before", "after")
        ),
        *(("raise_sync", kind) for kind in ("SystemExit", "KeyboardInterrupt", "Custom")),
    ]
    async with LocalPool(SPEC, workers=1, transport=transport) as pool:
        (metadata,) = pool.workers
        connection = connect(metadata)
        try:
            pid = await connection.dispatch(Task("whoami"), timeout=5.0)
            assert pid == metadata.pid
            for handler, payload in variants:
                # a call in flight on the same connection meanwhile, answered as usual
                beside = asyncio.ensure_future(connection.dispatch(Task("slow", 0.3), timeout=5.0))
                with pytest.raises(WorkerError) as failed:
                    await connection.dispatch(Task(handler, payload), timeout=5.0)
                kind = payload[0] if isinstance(payload, list) else payload
                expected = "fault_handlers.Custom" if kind == "Custom" else kind
                assert failed.value.remote_type == expected, (handler, payload)
                assert await beside == "slow done"
                assert await connection.dispatch(Task("whoami"), timeout=5.0) == pid
            assert pool.pids == [pid]
        finally:
            connection.close()


@pytest.mark.parametrize("transport", ["msgpack", "grpc"])
async def test_sync_handlers_run_on_the_servers_own_threads(transport: str) -> None:
    async with LocalPool(SPEC, workers=1, transport=transport) as pool:
        (metadata,) = pool.workers
        connection = connect(metadata)
        try:
            name = await connection.dispatch(Task("thread_name"), timeout=5.0)
        finally:
            connection.close()
    assert name.startswith("shardline-handler"), name


@asynccontextmanager
async def local_worker(
    directory: Path, namespace: str
) -> AsyncIterator[tuple[WorkerMetadata, asyncio.Queue[DiscoveryEvent]]]:
    """A ``local_worker`` process serving the fault handlers over msgpack, announced through
    LocalDiscovery (its defaults: a heartbeat a second, presumed dead after 5 s), and the
    events a subscriber of this process sees, from the worker's ``worker-added`` on."""
    discovery = LocalDiscovery(namespace, directory=directory, poll_interval=0.01)
    events: asyncio.Queue[DiscoveryEvent] = asyncio.Queue()
    subscription = discovery.subscribe()

    async def follow() -> None:
        async for event in subscription:
            events.put_nowait(event)

    following = asyncio.create_task(follow())
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(map(os.path.abspath, sys.path))}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "shardline.transport.local.worker",
        "--handlers", SPEC,
        "--namespace", namespace,
        "--directory", str(directory),
        "--transport", "msgpack",
        "--address", "127.0.0.1:0",
        "--uid", str(uuid.uuid4()),
        "--grace", "1",
        stdin=asyncio.subprocess.PIPE,
        env=environment,
    )  # fmt: skip
    try:
        async with asyncio.timeout(20.0):
            added = await events.get()
        assert added.type == "worker-added"
        assert added.metadata.pid == process.pid
        yield added.metadata, events
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        await process.wait()
        await subscription.aclose()
        following.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await following
        await discovery.aclose()


async def test_a_handler_blocking_the_loop_past_the_liveness_timeout_does_not_drop_the_worker(
    tmp_path: Path,
) -> None:
    async with local_worker(tmp_path, f"hb-{uuid.uuid4().hex[:8]}") as (metadata, events):
        connection = connect(metadata)
        try:
            # 6.5 s: past the 5 s liveness timeout plus a heartbeat; the subscriber here reaps
            # a lapsed publisher every second while its subscription is read
            assert await connection.dispatch(Task("block_loop", 6.5), timeout=20.0) == 6.5
            assert await connection.dispatch(Task("whoami"), timeout=5.0) == metadata.pid
        finally:
            connection.close()
        seen = []
        while not events.empty():
            seen.append(events.get_nowait())
        assert [(e.type, e.metadata.uid) for e in seen] == [], "the worker flapped"
