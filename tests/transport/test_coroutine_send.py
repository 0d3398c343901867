"""``coroutine_send`` (the Rust core): one step of a coroutine, as ``coroutine.send`` takes it,
with its return told apart from a wait without a ``StopIteration``."""

from __future__ import annotations

import asyncio
import contextvars
import types
from collections.abc import Generator
from typing import Any

import pytest

from shardline._core import coroutine_send


@types.coroutine
def suspend(value: Any) -> Generator[Any, Any, Any]:
    return (yield value)


async def returns(value: Any) -> Any:
    return value


async def waits_then_returns(first: Any) -> Any:
    received = await suspend(first)
    return ("got", received)


def test_a_coroutine_that_returns_at_once_gives_its_value() -> None:
    result = object()
    assert coroutine_send(returns(result), None) == (True, result)


def test_a_coroutine_that_waits_gives_what_it_yielded_then_what_it_returns() -> None:
    coroutine = waits_then_returns("a future")
    assert coroutine_send(coroutine, None) == (False, "a future")
    assert coroutine_send(coroutine, 42) == (True, ("got", 42))


def test_an_exception_propagates_as_it_is() -> None:
    error = ValueError("from the handler")

    async def raises() -> None:
        raise error

    with pytest.raises(ValueError, match="from the handler") as raised:
        coroutine_send(raises(), None)
    assert raised.value is error
    with pytest.raises(asyncio.CancelledError):
        coroutine_send(_cancelled(), None)


async def _cancelled() -> None:
    raise asyncio.CancelledError


def test_a_stop_iteration_inside_is_a_runtime_error_as_for_send() -> None:
    async def stops() -> None:
        raise StopIteration(1)

    with pytest.raises(RuntimeError, match="raised StopIteration"):
        coroutine_send(stops(), None)


def test_it_steps_the_coroutine_in_the_context_it_is_run_in() -> None:
    variable: contextvars.ContextVar[str] = contextvars.ContextVar("variable", default="outside")

    async def sets_and_reads() -> str:
        variable.set("inside")
        return variable.get()

    context = contextvars.copy_context()
    assert context.run(coroutine_send, sets_and_reads(), None) == (True, "inside")
    assert variable.get() == "outside"
    assert context[variable] == "inside"


def test_a_finished_coroutine_cannot_be_stepped_again() -> None:
    coroutine = returns(1)
    coroutine_send(coroutine, None)
    with pytest.raises(RuntimeError, match="cannot reuse already awaited coroutine"):
        coroutine_send(coroutine, None)
