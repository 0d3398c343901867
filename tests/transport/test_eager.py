"""`start_eagerly`: a coroutine runs now up to its first wait, and as a task only if it waits."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest

from shardline.transport.eager import Rest, start_eagerly

seen: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="unset")


async def test_a_coroutine_that_does_not_wait_runs_to_its_end_at_once_and_makes_no_task() -> None:

    steps: list[str] = []

    async def answer() -> None:
        steps.append("ran")

    tasks_before = len(asyncio.all_tasks())
    assert start_eagerly(asyncio.get_running_loop(), answer()) is None
    assert steps == ["ran"]
    assert len(asyncio.all_tasks()) == tasks_before


async def test_a_coroutine_that_waits_goes_on_as_a_task_from_where_it_waits() -> None:

    steps: list[str] = []
    gate: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def answer() -> None:
        steps.append("first step")
        steps.append(await gate)
        await asyncio.sleep(0)  # a bare yield to the loop, too
        steps.append(await asyncio.to_thread(lambda: threading.current_thread().name))

    task = start_eagerly(asyncio.get_running_loop(), answer())
    assert task is not None
    assert steps == ["first step"]
    gate.set_result("after the wait")
    await task
    assert steps[:2] == ["first step", "after the wait"]
    assert len(steps) == 3
    assert steps[2] != threading.current_thread().name  # it went on after a thread's answer


async def test_cancelling_the_task_cancels_the_coroutine_where_it_waits() -> None:

    steps: list[str] = []

    async def answer() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            steps.append("cancelled at the wait")
            raise

    task = start_eagerly(asyncio.get_running_loop(), answer())
    assert task is not None
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert steps == ["cancelled at the wait"]
    assert task.cancelled()


async def test_a_coroutine_may_answer_its_cancellation_and_end_normally() -> None:

    async def answer() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.sleep(0)  # it may still wait while it winds up

    task = start_eagerly(asyncio.get_running_loop(), answer())
    assert task is not None
    await asyncio.sleep(0)
    task.cancel()
    await task
    assert not task.cancelled()


async def test_errors_end_the_first_step_or_the_task_as_they_would_a_task() -> None:

    async def fails_at_once() -> None:
        raise ValueError("at once")

    with pytest.raises(ValueError, match="at once"):
        start_eagerly(asyncio.get_running_loop(), fails_at_once())

    async def fails_later() -> None:
        await asyncio.sleep(0)
        raise ValueError("later")

    task = start_eagerly(asyncio.get_running_loop(), fails_later())
    assert task is not None
    with pytest.raises(ValueError, match="later"):
        await task


async def test_the_coroutine_runs_in_one_copy_of_the_callers_context_that_it_cannot_change():

    seen.set("caller")
    observed: list[str] = []

    async def answer(name: str) -> None:
        observed.append(seen.get())
        seen.set(name)
        await asyncio.sleep(0)
        observed.append(seen.get())

    tasks = [start_eagerly(asyncio.get_running_loop(), answer(name)) for name in "ab"]
    assert seen.get() == "caller"
    await asyncio.gather(*(task for task in tasks if task is not None))
    assert observed == ["caller", "caller", "a", "b"]
    assert seen.get() == "caller"


async def test_rest_carries_a_started_coroutine_on_and_returns_what_it_returns() -> None:

    gate = asyncio.get_running_loop().create_future()

    async def answer() -> str:
        return f"after {await gate}"

    coroutine = answer()
    waiting_on = coroutine.send(None)
    assert waiting_on is gate

    async def carry_on() -> str:
        result: str = await Rest(coroutine, waiting_on)
        return result

    task = asyncio.get_running_loop().create_task(carry_on())
    await asyncio.sleep(0)
    assert not task.done()
    gate.set_result("the gate")
    assert await task == "after the gate"
