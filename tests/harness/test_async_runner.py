"""The suite's async runner (tests/support/async_runner.py, called by conftest.py's hook): each
test on a fresh loop, with its arguments, bounded by its ``async_timeout``."""

from __future__ import annotations

import asyncio
import time

import pytest

from support.async_runner import run_async_test


def test_each_test_runs_with_its_arguments_on_a_loop_of_its_own() -> None:
    seen: list[tuple[asyncio.AbstractEventLoop, int]] = []

    async def test(n: int) -> None:
        seen.append((asyncio.get_running_loop(), n))

    run_async_test(test, {"n": 1}, None)
    run_async_test(test, {"n": 2}, None)
    (first, one), (second, two) = seen
    assert (one, two) == (1, 2)
    assert first is not second
    assert first.is_closed()
    assert second.is_closed()


def test_a_test_still_running_after_its_seconds_fails_with_timeout_error() -> None:
    async def test() -> None:
        await asyncio.sleep(60)

    began = time.monotonic()
    with pytest.raises(TimeoutError):
        run_async_test(test, {}, 0.05)
    assert time.monotonic() - began < 30


def test_a_test_within_its_seconds_or_unbounded_passes_and_its_failure_is_raised() -> None:
    async def quick() -> None:
        await asyncio.sleep(0)

    run_async_test(quick, {}, 30)
    run_async_test(quick, {}, None)

    async def failing() -> None:
        raise AssertionError("the test's own failure")

    with pytest.raises(AssertionError, match="the test's own failure"):
        run_async_test(failing, {}, 30)


@pytest.mark.async_timeout(30)
async def test_an_async_test_is_run_by_the_hook_inside_a_running_loop() -> None:
    assert asyncio.get_running_loop().is_running()
