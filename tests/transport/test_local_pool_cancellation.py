"""Entering a LocalPool, cancelled at any turn of the loop around its last worker joining,
ends cancelled: the block never runs for a task already cancelled (``docs/architecture.md``: a
loop must also be stoppable)."""

from __future__ import annotations

import asyncio
import tempfile

import pytest

from shardline.transport import LocalPool
from support.cancellation import stops_when_cancelled

SPEC = "local_pool_handlers:HANDLERS"  # beside this file

pytestmark = [pytest.mark.integration, pytest.mark.async_timeout(60)]


@pytest.mark.parametrize("turns", range(6))
async def test_a_start_cancelled_as_the_worker_joins_ends_cancelled(
    monkeypatch: pytest.MonkeyPatch, turns: int
) -> None:
    # a short directory of its own: pytest's tmp_path can be too long for a socket's path
    monkeypatch.setattr(tempfile, "tempdir", tempfile.mkdtemp(prefix="lp-"))
    pool = LocalPool(SPEC, workers=1, transport="msgpack")
    cancelled_inside: list[int] = []  # the block's task's cancellations pending, as it ran

    async def enter() -> None:
        async with pool:
            task = asyncio.current_task()
            assert task is not None
            cancelled_inside.append(task.cancelling())

    entering = asyncio.create_task(enter())
    while not pool.workers:
        await asyncio.sleep(0)  # turn by turn: the join is seen in the turn it is applied
    # stopping the worker started waits for it to exit: no bound in turns
    assert await stops_when_cancelled(entering, turns, bound=None)
    assert not any(cancelled_inside)
    assert not pool.pids  # the worker started was stopped
