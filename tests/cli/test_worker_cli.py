"""`shardline worker`: real worker processes, announced through LocalDiscovery or etcd."""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

import pytest

from shardline import WorkerProxy
from shardline.errors import WorkerError
from shardline.transport import Task, connect
from support.discovery_contract import kinds, take
from support.transport_servers import WAIT, new_namespace
from support.worker_processes import Backend, worker_process

pytestmark = [
    pytest.mark.integration,
    pytest.mark.async_timeout(WAIT),
]  # each async test, start to finish


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_a_worker_process_serves_through_a_proxy_and_withdraws_on_a_signal(
    tmp_path: Path, backend: Backend, signum: signal.Signals
) -> None:
    backend_arguments, open_discovery = backend

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


async def test_a_worker_process_that_cannot_serve_its_address_exits_with_status_1(
    tmp_path: Path,
) -> None:

    namespace = new_namespace()
    async with worker_process(
        tmp_path, "--namespace", namespace, "--address", "127.0.0.1:0"
    ) as first:
        taken = (await first.ready()).address
        async with worker_process(tmp_path, "--namespace", namespace, "--address", taken) as second:
            assert await second.exit_status() == 1
            assert f"cannot serve at {taken}" in second.stderr.read_text()
        first.process.terminate()
        assert await first.exit_status() == 0
