"""What the benchmarks over worker processes share: starting and stopping the processes, and
the ways to call them (``bench_transport.py``, ``bench_calls.py``).

A worker process prints one line when it is ready, the discovery record it announced
(``encode_record``); ``start_workers`` waits for that line from each and stops them all
(SIGTERM, then SIGKILL) when its block ends, also when it ends with an error.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc.aio
import pytest

from shardline import WorkerMetadata, WorkerProxy
from shardline.discovery.local import LocalDiscovery
from shardline.discovery.record import decode_record
from shardline.transport import Task
from shardline.transport.grpc.wire import METHOD, grpc_target

READY = 20.0  # seconds a worker process may take to print its ready line
WAIT = 20.0  # seconds a call may take before the benchmark fails
GRPC_WORKER = (sys.executable, "-m", "shardline", "worker", "--transport", "grpc")
MSGPACK_WORKER = (sys.executable, "-m", "shardline", "worker", "--transport", "msgpack")


@dataclass(frozen=True)
class Workers:
    processes: list[subprocess.Popen[bytes]]
    records: list[WorkerMetadata]
    namespace: str
    directory: Path  # LocalDiscovery's directory
    shardline_file: str  # where the worker processes import shardline from

    @property
    def pids(self) -> list[int]:
        return [process.pid for process in self.processes]


def stop(processes: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to each process still running, then SIGKILL to any that has not exited 10 s
    later; waits for all of them."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


def ready_line(process: subprocess.Popen[bytes], stderr: Path) -> bytes:
    """The first line the worker prints, or ``pytest.fail`` with its stderr."""
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(READY):
            pytest.fail(f"worker {process.pid} not ready within {READY} s: {stderr.read_text()}")
    line = process.stdout.readline()
    if not line:
        pytest.fail(f"worker {process.pid} exited before it was ready: {stderr.read_text()}")
    return line


@contextlib.contextmanager
def start_workers(count: int, command: Sequence[str]) -> Iterator[Workers]:
    """``count`` processes of ``command --namespace NS --address 127.0.0.1:0`` (say
    ``GRPC_WORKER``: ``shardline worker``, the demo handlers over gRPC), announced through
    ``LocalDiscovery`` in a temporary directory (their ``XDG_RUNTIME_DIR``, also their working
    directory)."""
    with tempfile.TemporaryDirectory(prefix="shardline-bench-") as folder:
        directory = Path(folder)
        namespace = f"bench-{uuid.uuid4().hex[:12]}"
        env = {**os.environ, "XDG_RUNTIME_DIR": str(directory)}
        probe = subprocess.run(
            [sys.executable, "-c", "import shardline; print(shardline.__file__)"],
            env=env,
            cwd=directory,
            capture_output=True,
            text=True,
        )
        if probe.returncode != 0:
            pytest.fail(f"the worker processes cannot import shardline: {probe.stderr}")
        processes: list[subprocess.Popen[bytes]] = []
        try:
            errors = []
            for n in range(count):
                errors.append(directory / f"worker-{n}.err")
                with errors[-1].open("wb") as stderr:
                    processes.append(
                        subprocess.Popen(
                            [*command, "--namespace", namespace, "--address", "127.0.0.1:0"],
                            stdout=subprocess.PIPE,
                            stderr=stderr,
                            env=env,
                            cwd=directory,
                        )
                    )
            records = [
                decode_record(ready_line(process, error).rstrip(b"\n"))
                for process, error in zip(processes, errors, strict=True)
            ]
            assert [r.pid for r in records] == [p.pid for p in processes]
            assert len({r.address for r in records}) == count
            yield Workers(
                processes, records, namespace, directory / "shardline", probe.stdout.strip()
            )
        finally:
            stop(processes)


# --- ways to make a call --------------------------------------------------------------------


@dataclass(frozen=True)
class Way:
    """One way to reach the workers: ``call(worker, payload)`` echoes ``payload`` and returns
    the result and the seconds the call took (``worker`` is ignored by a way that chooses by
    itself); ``whoami()`` returns the pids that answer one ``whoami`` per worker; ``close()``.
    ``proxy`` is the proxy, for a way through one."""

    call: Callable[[int, Any], Awaitable[tuple[Any, float]]]
    whoami: Callable[[], Awaitable[set[int]]]
    close: Callable[[], Awaitable[None]]
    proxy: WorkerProxy | None = None


async def bare_grpc(workers: Workers) -> Way:
    """A bare ``grpc.aio`` channel per worker calling ``/shardline.Worker/Dispatch``: the
    request's JSON bytes are built before the clock starts and the reply decoded after it
    stops; call ``k`` goes to worker ``k % len(workers)``."""
    channels = [grpc.aio.insecure_channel(grpc_target(r.address)) for r in workers.records]
    stubs = [channel.unary_unary(METHOD) for channel in channels]

    async def call(worker: int, payload: Any) -> tuple[Any, float]:
        request = json.dumps({"handler": "echo", "payload": payload}).encode()
        start = time.perf_counter()
        reply = await stubs[worker % len(stubs)](request, timeout=WAIT)
        elapsed = time.perf_counter() - start
        return json.loads(reply)["result"], elapsed

    async def whoami() -> set[int]:
        request = json.dumps({"handler": "whoami"}).encode()
        return {json.loads(await stub(request, timeout=WAIT))["result"]["pid"] for stub in stubs}

    async def close() -> None:
        for channel in channels:
            await channel.close()

    return Way(call, whoami, close)


async def through_proxy(workers: Workers, connect: Callable[[WorkerMetadata], Any]) -> Way:
    """A ``WorkerProxy`` (round-robin) following the workers through ``LocalDiscovery``, with
    the connections ``connect`` makes; closing it stops the proxy and closes them."""
    discovery = LocalDiscovery(workers.namespace, directory=workers.directory)
    subscription = discovery.subscribe()
    made: list[Any] = []

    def connect_and_keep(metadata: WorkerMetadata) -> Any:
        made.append(connect(metadata))
        return made[-1]

    proxy = WorkerProxy(
        discovery=subscription,
        connect=connect_and_keep,
        quorum=len(workers.records),
        quorum_timeout=WAIT,
    )
    await proxy.start()
    assert {m.uid for m in proxy.workers} == {r.uid for r in workers.records}

    async def call(worker: int, payload: Any) -> tuple[Any, float]:
        start = time.perf_counter()
        result = await proxy.dispatch(Task("echo", payload), timeout=WAIT)
        return result, time.perf_counter() - start

    async def whoami() -> set[int]:
        # one round-robin rotation must reach every worker process
        return {(await proxy.dispatch(Task("whoami"), timeout=WAIT))["pid"] for _ in made}

    async def close() -> None:
        await proxy.stop()
        await subscription.aclose()
        await discovery.aclose()
        for connection in made:
            # the proxy's own rule for the connections it lets go: close() if there is one
            close_connection = getattr(connection, "close", None)
            if callable(close_connection):
                close_connection()

    return Way(call, whoami, close, proxy)
