"""`shardline worker`: real worker processes, announced through LocalDiscovery or etcd."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from shardline import WorkerMetadata, WorkerProxy
from shardline.discovery import Discovery
from shardline.discovery.etcd import EtcdDiscovery
from shardline.discovery.local import LocalDiscovery
from shardline.discovery.record import decode_record
from shardline.errors import WorkerError
from shardline.transport import Task, connect
from support.discovery_contract import kinds, take
from support.transport_servers import new_namespace, run

READY = 15.0


class WorkerProcess:
    def __init__(self, process: asyncio.subprocess.Process, stderr: Path) -> None:
        self.process = process
        self.stderr = stderr

    async def ready(self) -> WorkerMetadata:
        """The record the worker prints once it serves and is published."""
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), READY)
        assert line, f"the worker exited before it was ready: {self.stderr.read_text()}"
        return decode_record(line.rstrip(b"\n"))

    async def exit_status(self) -> int:
        return await asyncio.wait_for(self.process.wait(), READY)


@asynccontextmanager
async def worker_process(directory: Path, *arguments: str) -> AsyncIterator[WorkerProcess]:
    """``python -m shardline worker ARGUMENTS`` with its LocalDiscovery under `directory`;
    killed on the way out if it is still running."""
    stderr = directory / f"worker-{uuid.uuid4().hex[:8]}.err"
    with stderr.open("wb") as errors:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "shardline",
            "worker",
            *arguments,
            stdout=asyncio.subprocess.PIPE,
            stderr=errors,
            env={**os.environ, "XDG_RUNTIME_DIR": str(directory)},
        )
    try:
        yield WorkerProcess(process, stderr)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


# A backend: the worker's extra arguments, and how the test opens a handle on a namespace.
Backend = tuple[tuple[str, ...], Callable[[str], Discovery]]


@pytest.fixture(params=["local", "etcd"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "local":
        directory = tmp_path / "shardline"
        return (), lambda namespace: LocalDiscovery(
            namespace, directory=directory, poll_interval=0.005
        )
    endpoint = request.getfixturevalue("etcd").endpoint
    return ("--etcd", endpoint), lambda namespace: EtcdDiscovery([endpoint], namespace)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_worker_process_serves_through_a_proxy_and_withdraws_on_a_signal(
    tmp_path: Path, backend: Backend, signum: signal.Signals
) -> None:
    backend_arguments, open_discovery = backend

    async def scenario() -> None:
        namespace, uid = new_namespace(), uuid.uuid4()
        arguments = ("--namespace", namespace, "--address", "127.0.0.1:0", "--uid", str(uid))
        async with worker_process(tmp_path, *arguments, *backend_arguments) as worker:
            record = await worker.ready()
            assert (record.uid, record.pid) == (uid, worker.process.pid)
            assert record.address.startswith("msgpack+tcp://127.0.0.1:")
            assert not record.address.endswith(":0")
            discovery = open_discovery(namespace)
            try:
                watcher = discovery.subscribe()
                assert kinds(await take(watcher, 1)) == [("worker-added", uid, record.address)]
                proxy = WorkerProxy(discovery=discovery.subscribe(), connect=connect)
                async with proxy:
                    assert await proxy.dispatch(Task("echo", {"n": 1})) == {"n": 1}
                    assert await proxy.dispatch(Task("sleep", 0.01)) == 0.01
                    whoami = await proxy.dispatch(Task("whoami"))
                    assert whoami["pid"] == worker.process.pid
                    with pytest.raises(WorkerError, match="asked to fail"):
                        await proxy.dispatch(Task("fail"))
                    assert [metadata.uid for metadata in proxy.workers] == [uid]
                worker.process.send_signal(signum)
                assert kinds(await take(watcher, 1)) == [("worker-dropped", uid, record.address)]
                assert await worker.exit_status() == 0
            finally:
                await discovery.aclose()

    run(scenario)


def test_a_worker_process_that_cannot_serve_its_address_exits_with_status_1(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        namespace = new_namespace()
        async with worker_process(
            tmp_path, "--namespace", namespace, "--address", "127.0.0.1:0"
        ) as first:
            taken = (await first.ready()).address
            async with worker_process(
                tmp_path, "--namespace", namespace, "--address", taken
            ) as second:
                assert await second.exit_status() == 1
                assert f"cannot serve at {taken}" in second.stderr.read_text()
            first.process.terminate()
            assert await first.exit_status() == 0

    run(scenario)
