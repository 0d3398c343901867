"""``shardline worker --handlers MODULE:ATTRIBUTE``: real worker processes (the installed
console script, run from ``tests/`` so the module is found there as ``python -m`` would find
it) serving ``support.remote_error_handlers``, over each transport and discovery backend; bad
values refused before anything starts."""

from __future__ import annotations

import os
import signal
import sys
import uuid
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest

from shardline import WorkerProxy
from shardline.errors import WorkerError
from shardline.transport import Task, connect
from support.discovery_contract import kinds, take
from support.paths import TESTS
from support.transport_servers import WAIT, new_namespace
from support.worker_processes import Backend, WorkerProcess, worker_process

pytestmark = [
    pytest.mark.integration,
    pytest.mark.async_timeout(WAIT),
]  # each async test, start to finish

SPEC = "support.remote_error_handlers:HANDLERS"
SHARDLINE = Path(sys.executable).with_name("shardline")  # the console script


def console_worker(
    directory: Path, *arguments: str, cwd: Path = TESTS
) -> AbstractAsyncContextManager[WorkerProcess]:
    """``shardline worker ARGUMENTS`` run by the console script from ``cwd``, with its
    LocalDiscovery under ``directory``; killed on the way out if it is still running."""
    # only the current directory may make the module found
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return worker_process(
        directory, *arguments, command=(str(SHARDLINE),), cwd=cwd, environment=environment
    )


@pytest.mark.parametrize("transport", ["msgpack", "grpc"])
async def test_the_worker_serves_the_handlers_it_is_given_and_no_others(
    tmp_path: Path, backend: Backend, transport: str
) -> None:
    backend_arguments, open_discovery = backend

    namespace, uid = new_namespace(), uuid.uuid4()
    arguments = (
        *("--handlers", SPEC, "--namespace", namespace, "--address", "127.0.0.1:0"),
        *("--transport", transport, "--uid", str(uid), *backend_arguments),
    )
    async with console_worker(tmp_path, *arguments) as worker:
        record = await worker.ready()
        assert record.uid == uid
        assert record.address.startswith("grpc://" if transport == "grpc" else "msgpack+tcp://")
        discovery = open_discovery(namespace)
        try:
            watcher = discovery.subscribe()
            assert kinds(await take(watcher, 1)) == [("worker-added", uid, record.address)]
            async with WorkerProxy(discovery=discovery.subscribe(), connect=connect) as proxy:
                assert await proxy.dispatch(Task("echo", {"n": [1, 2]})) == {"n": [1, 2]}
                assert await proxy.dispatch(Task("whoami")) == worker.process.pid
                with pytest.raises(ValueError, match="invalid literal for int"):
                    await proxy.dispatch(Task("parse", "x"))
                # the demo's handlers are not served beside them
                with pytest.raises(WorkerError) as unknown:
                    await proxy.dispatch(Task("sleep", 0.01))
                assert unknown.value.remote_type == "shardline.UnknownHandler"
                assert "bad-input, deep, echo, lookup, parse, refuse, whoami, wrapped" in str(
                    unknown.value
                )
            worker.process.send_signal(signal.SIGTERM)
            assert kinds(await take(watcher, 1)) == [("worker-dropped", uid, record.address)]
            assert await worker.exit_status() == 0
        finally:
            await discovery.aclose()


BROKEN_MODULE = "import json\nimport missing_dependency_of_the_handlers\n"


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("support.remote_error_handlers", ["must be 'module:attribute'", "'support.remote_"]),
        ("support.remote_error_handlers:", ["must be 'module:attribute'"]),
        (
            "no_such_handlers_module:HANDLERS",
            [
                "'no_such_handlers_module:HANDLERS'",
                "importing 'no_such_handlers_module' raised ModuleNotFoundError",
                "No module named 'no_such_handlers_module'",
            ],
        ),
        (
            "broken_handlers:HANDLERS",
            [
                "importing 'broken_handlers' raised ModuleNotFoundError",
                "No module named 'missing_dependency_of_the_handlers'",
                "broken_handlers.py:2)",
            ],
        ),
        (
            "support.remote_error_handlers:NO_SUCH",
            ["AttributeError: module 'support.remote_error_handlers' has no attribute 'NO_SUCH'"],
        ),
        (
            "support.remote_error_handlers:HANDLERS.inner",
            ["AttributeError: 'support.remote_error_handlers.HANDLERS' has no attribute 'inner'"],
        ),
        (
            "support.remote_error_handlers:echo",
            ["'support.remote_error_handlers:echo' are a function, not a mapping"],
        ),
        ("support.remote_error_handlers:EMPTY", ["are an empty mapping: nothing to serve"]),
        (
            "support.remote_error_handlers:NOT_CALLABLE",
            ["map 'answer' to 42", "handlers callable"],
        ),
    ],
)
async def test_a_handlers_value_that_does_not_load_is_a_usage_error_saying_why(
    tmp_path: Path, spec: str, said: list[str]
) -> None:
    # the module that fails as it is imported, in a folder of its own with `support/`
    folder = tmp_path / "cwd"
    folder.mkdir()
    (folder / "broken_handlers.py").write_text(BROKEN_MODULE)
    (folder / "support").symlink_to(TESTS / "support")

    arguments = ("--handlers", spec, "--namespace", new_namespace(), "--address", "127.0.0.1:0")
    async with console_worker(tmp_path, *arguments, cwd=folder) as worker:
        assert await worker.exit_status() == 2
        assert worker.process.stdout is not None
        assert await worker.process.stdout.read() == b""  # never ready: no record printed
    (line,) = worker.stderr.read_text().splitlines()
    assert line.startswith("shardline worker: error: argument --handlers: ")
    for words in said:
        assert words in line
