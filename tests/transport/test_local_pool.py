"""LocalPool: real worker processes serving the handlers of ``local_pool_handlers.py``, started,
replaced, and stopped on every way out, including a SIGKILL of the process that started them."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any, TypeVar

import pytest

import shardline
from shardline.errors import DeadlineExceeded, WorkerStartError
from shardline.transport import LocalPool, Task
from support.waiting import until

T = TypeVar("T")

SPEC = "local_pool_handlers:HANDLERS"
BOUND = 20.0  # for every scenario, start to finish

pytestmark = [pytest.mark.integration, pytest.mark.async_timeout(BOUND)]
LOGGER = "shardline.transport.local.pool"
HERE = Path(__file__).parent  # local_pool_handlers.py is beside this file


def alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie (an orphan's zombie may wait for a
    reaper that never comes, in a container)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    if sys.platform != "linux":
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def started_pids(caplog: pytest.LogCaptureFixture) -> list[int]:
    """The pids of the workers the pools logged as started."""
    found = (re.search(r"started worker pid (\d+)", r.getMessage()) for r in caplog.records)
    return [int(match.group(1)) for match in found if match]


async def whoami(pool: LocalPool, times: int, *, idempotent: bool = False) -> set[int]:
    task = Task("whoami", idempotent=idempotent)
    return {await pool.dispatch(task, timeout=5.0) for _ in range(times)}


@pytest.fixture(autouse=True)
def _logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)


@pytest.mark.parametrize("transport", ["msgpack", "grpc"])
async def test_dispatch_reaches_every_worker_and_leaving_the_block_stops_them(
    monkeypatch: pytest.MonkeyPatch, transport: str
) -> None:
    # a short directory of its own: pytest's tmp_path can be too long for a socket's path
    tmp_path = Path(tempfile.mkdtemp(prefix="lp-"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    async def scenario() -> list[int]:
        async with shardline.LocalPool(SPEC, workers=2, transport=transport) as pool:
            pids = pool.pids
            assert len(pids) == 2
            scheme = "msgpack+unix:///" if transport == "msgpack" else "grpc://127.0.0.1:"
            assert all(m.address.startswith(scheme) for m in pool.workers)
            assert sorted(m.pid for m in pool.workers) == sorted(pids)
            assert list(tmp_path.iterdir()), "the pool's discovery directory"
            payload = {"n": [1, "two", None]}
            assert await pool.dispatch(Task("echo", payload), timeout=5.0) == payload
            assert await whoami(pool, 6) == set(pids)
        assert pool.pids == []
        with pytest.raises(RuntimeError, match="not running"):
            await pool.dispatch(Task("echo"))
        with pytest.raises(RuntimeError, match="entered once"):
            await pool.__aenter__()
        return pids

    pids = await scenario()
    assert not [pid for pid in pids if alive(pid)]
    assert list(tmp_path.iterdir()) == []
    tmp_path.rmdir()


async def test_a_killed_worker_is_replaced_and_dispatch_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:

    async with LocalPool(SPEC, workers=2) as pool:
        victim, survivor = pool.pids
        loop = asyncio.get_running_loop()
        killed_at = loop.time()
        os.kill(victim, signal.SIGKILL)
        # dispatch right away: a call to the dead worker fails over to the other one. The
        # victim dies when the kernel next runs it, so on a loaded machine a request may still
        # be written to its socket first: only an idempotent task is sent again after that
        assert await whoami(pool, 4, idempotent=True) <= {survivor, *pool.pids}
        await until(lambda: victim not in {m.pid for m in pool.workers}, "withdrawal")
        # withdrawn by the pool: LocalDiscovery's liveness (a 5 s timeout, heartbeats every
        # 1 s) could not drop it before 4 s
        assert loop.time() - killed_at < 3.0
        await until(
            lambda: len(pool.workers) == 2 and victim not in {m.pid for m in pool.workers},
            "replacement joining",
        )
        (replacement,) = {m.pid for m in pool.workers} - {survivor}
        assert sorted(pool.pids) == sorted([survivor, replacement])
        assert await whoami(pool, 6) == {survivor, replacement}
    died = [r for r in caplog.records if r.levelno == logging.WARNING and "exited" in r.message]
    assert len(died) == 1
    assert f"status {-signal.SIGKILL}" in died[0].message
    assert any("replaced by pid" in r.message for r in caplog.records)


async def test_replacements_stop_beyond_the_restart_rate_and_the_survivors_serve(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        async with LocalPool(SPEC, workers=2, max_restarts=1, restart_window=60.0) as pool:
            first, second = pool.pids
            os.kill(first, signal.SIGKILL)
            await until(
                lambda: len(pool.workers) == 2 and first not in {m.pid for m in pool.workers},
                "replacement joining",
            )
            (replacement,) = {m.pid for m in pool.workers} - {second}
            os.kill(second, signal.SIGKILL)
            await until(
                lambda: any(r.levelno == logging.ERROR for r in caplog.records),
                "ERROR about the restart rate",
            )
            # decided with the ERROR: no process was started for the second death
            assert pool.pids == [replacement]
            await until(lambda: [m.pid for m in pool.workers] == [replacement], "withdrawal")
            assert await whoami(pool, 4) == {replacement}

    await scenario()
    (error,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "max_restarts=1" in error.message
    assert "no longer replaced" in error.message


async def test_cancelling_the_task_in_the_block_stops_every_worker_even_if_cancelled_again():
    async def scenario() -> list[int]:
        pids: list[int] = []
        running = asyncio.Event()

        async def body() -> None:
            async with LocalPool(SPEC, workers=2) as pool:
                pids.extend(pool.pids)
                running.set()
                await asyncio.Event().wait()

        task = asyncio.create_task(body())
        await running.wait()
        # cancelled again and again while it stops its workers: they are all stopped anyway
        while not task.done():
            task.cancel()
            await asyncio.sleep(0.01)
        with pytest.raises(asyncio.CancelledError):
            await task
        return pids

    pids = await scenario()
    assert len(pids) == 2
    assert not [pid for pid in pids if alive(pid)]


async def test_cancelling_the_start_stops_the_workers_started(
    caplog: pytest.LogCaptureFixture,
) -> None:

    pool = LocalPool("local_pool_handlers:NEVER_READY", workers=2, start_timeout=60.0)
    task = asyncio.create_task(pool.__aenter__())
    await until(lambda: len(started_pids(caplog)) == 2, "two workers started")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    pids = started_pids(caplog)
    assert not [pid for pid in pids if alive(pid)]


async def test_a_worker_still_running_after_the_grace_is_killed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> list[int]:
        async with LocalPool(SPEC, workers=1, stop_grace=0.5) as pool:
            pids = pool.pids
            with pytest.raises(DeadlineExceeded):
                await pool.dispatch(Task("block"), timeout=0.2)
        return pids

    (pid,) = await scenario()
    assert not alive(pid)
    assert any(f"worker pid {pid} still running" in r.message for r in caplog.records)


PARENT = """
import asyncio, json
from shardline.transport import LocalPool

async def main():
    async with LocalPool("local_pool_handlers:HANDLERS", workers=2) as pool:
        print(json.dumps(pool.pids), flush=True)
        await asyncio.Event().wait()

asyncio.run(main())
"""


async def test_a_sigkill_of_the_parent_leaves_no_worker_running(tmp_path: Path) -> None:

    with (tmp_path / "parent.err").open("wb") as errors:
        parent = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            PARENT,
            cwd=HERE,
            stdout=asyncio.subprocess.PIPE,
            stderr=errors,
            # the pool's temporary directory, which a SIGKILLed parent leaves behind
            env={**os.environ, "TMPDIR": str(tmp_path)},
        )
    try:
        assert parent.stdout is not None
        line = await asyncio.wait_for(parent.stdout.readline(), 15.0)
        assert line, f"the parent exited: {(tmp_path / 'parent.err').read_text()}"
        pids = json.loads(line)
        assert len(pids) == 2
        assert all(alive(pid) for pid in pids)
        parent.kill()
        await parent.wait()
        await until(lambda: not any(alive(pid) for pid in pids), "worker left", seconds=10.0)
    finally:
        if parent.returncode is None:
            parent.kill()
            await parent.wait()


@pytest.mark.parametrize(
    ("spec", "cause"),
    [
        ("local_pool_no_such_module:HANDLERS", "ModuleNotFoundError"),
        ("local_pool_handlers:NO_SUCH_HANDLERS", "AttributeError"),
        ("local_pool_handlers:echo", "not a mapping"),
    ],
)
async def test_handlers_that_cannot_be_loaded_fail_the_start_naming_the_spec_and_the_error(
    caplog: pytest.LogCaptureFixture, spec: str, cause: str
) -> None:

    with pytest.raises(WorkerStartError) as failure:
        async with LocalPool(spec, workers=2):
            raise AssertionError("the pool started")
    message = str(failure.value)
    assert repr(spec) in message
    assert cause in message
    assert "status 2" in message
    pids = started_pids(caplog)
    assert len(pids) == 2
    assert not [pid for pid in pids if alive(pid)]


async def test_workers_that_do_not_join_in_time_fail_the_start_and_are_stopped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        pool = LocalPool("local_pool_handlers:NEVER_READY", workers=2, start_timeout=1.0)
        with pytest.raises(TimeoutError, match=r"0 of the 2 workers joined within 1 s") as failure:
            async with pool:
                raise AssertionError("the pool started")
        assert "start_timeout" in str(failure.value)
        for pid in started_pids(caplog):
            assert f"pid {pid} (still running)" in str(failure.value)

    await scenario()
    pids = started_pids(caplog)
    assert len(pids) == 2
    assert not [pid for pid in pids if alive(pid)]


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"workers": 0}, "workers"),
        ({"workers": -1}, "workers"),
        ({"workers": True}, "workers"),
        ({"workers": 2.0}, "workers"),
        ({"handlers": "local_pool_handlers"}, "handlers"),
        ({"handlers": "local_pool_handlers:"}, "handlers"),
        ({"handlers": "a-b:HANDLERS"}, "handlers"),
        ({"handlers": b"local_pool_handlers:HANDLERS"}, "handlers"),
        ({"transport": "carrier-pigeon"}, "transport"),
        ({"start_timeout": 0}, "start_timeout"),
        ({"stop_grace": -1.0}, "stop_grace"),
        ({"restart_window": float("nan")}, "restart_window"),
        ({"max_restarts": -1}, "max_restarts"),
    ],
)
def test_bad_arguments_are_refused_naming_them(arguments: dict[str, Any], named: str) -> None:
    options: dict[str, Any] = {"handlers": SPEC, **arguments}
    with pytest.raises(ValueError, match=named):
        LocalPool(**options)


def test_workers_default_to_the_cpu_count() -> None:
    assert f"workers={os.cpu_count()}," in repr(LocalPool(SPEC))
