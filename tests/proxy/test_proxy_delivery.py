"""WorkerProxy's delivery guarantee (at most once unless idempotent), its one deadline per
call, its retry budget and hedging, over in-process connections whose failures the tests
choose. The same rules on real worker processes are in tests/transport/test_sick_workers.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from shardline import (
    DeadlineExceeded,
    NoWorkersAvailable,
    OutcomeUnknown,
    RpcError,
    ShardlineError,
    TransientRpcError,
    WorkerMetadata,
    WorkerProxy,
)
from shardline import proxy as proxy_module
from shardline.proxy import DEFAULT_TIMEOUT
from shardline.retry_budget import RetryBudget
from shardline.transport.task import Task
from support.fakes import Stream, added, settle

TASK = Task("work", 1)


class Scripted:
    """A connection whose answers the test scripts per worker: a value, an exception to raise,
    or ``HANG`` (wait until cancelled, or the timeout given, then raise a deadline error)."""

    def __init__(self, metadata: WorkerMetadata, script: dict[str, list[Any]], log: list[Any]):
        self.address = metadata.address
        self.script = script
        self.log = log

    async def dispatch(self, task: Any, *, timeout: float | None = None) -> Any:
        self.log.append((self.address, timeout))
        answers = self.script.get(self.address) or [self.address]
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if answer is HANG:
            try:
                # hangs on purpose, up to the attempt's deadline: a worker that never answers
                await asyncio.sleep(3600 if timeout is None else timeout)
            except asyncio.CancelledError:
                self.log.append((self.address, "cancelled"))
                raise
            raise TransientRpcError("deadline", reason="deadline", address=self.address, sent=True)
        if isinstance(answer, BaseException):
            raise answer
        return answer


HANG = object()


def address(n: int) -> str:
    return f"127.0.0.1:{5000 + n}"


async def proxy_of(
    workers: int, script: dict[str, list[Any]], log: list[Any], **options: Any
) -> WorkerProxy:
    stream = Stream(*(added(n) for n in range(1, workers + 1)))
    proxy = WorkerProxy(
        discovery=stream,
        connect=lambda metadata: Scripted(metadata, script, log),
        quorum=workers,
        **options,
    )
    await proxy.start()
    await settle()
    return proxy


def lost(n: int) -> TransientRpcError:
    return TransientRpcError("lost", reason="connection-lost", address=address(n), sent=True)


def refused(n: int) -> TransientRpcError:
    return TransientRpcError("refused", reason="cannot-connect", address=address(n))


async def test_a_task_that_reached_a_worker_is_not_sent_again() -> None:
    log: list[Any] = []
    proxy = await proxy_of(3, {address(1): [lost(1)]}, log)
    with pytest.raises(OutcomeUnknown) as raised:
        await proxy.dispatch(TASK)
    assert [where for where, _ in log] == [address(1)]
    error = raised.value
    assert isinstance(error, RpcError)
    assert error.sent
    assert error.reason == "connection-lost"
    assert error.address == address(1)
    assert "may have run" in str(error)
    assert isinstance(error.__cause__, TransientRpcError)
    assert proxy.stats().outcomes_unknown == 1
    await proxy.stop()


@pytest.mark.parametrize("how", ["task", "dispatch"])
async def test_an_idempotent_task_goes_to_the_next_worker(how: str) -> None:
    log: list[Any] = []
    proxy = await proxy_of(3, {address(1): [lost(1)]}, log, hedging=False)
    if how == "task":
        result = await proxy.dispatch(Task("work", 1, idempotent=True))
    else:
        result = await proxy.dispatch(TASK, idempotent=True)
    assert result == address(2)
    assert [where for where, _ in log] == [address(1), address(2)]
    await proxy.stop()


async def test_a_failure_before_sending_goes_to_the_next_worker() -> None:
    log: list[Any] = []
    proxy = await proxy_of(3, {address(1): [refused(1)]}, log)
    assert await proxy.dispatch(TASK) == address(2)
    await proxy.stop()


async def test_a_deadline_is_a_timeout_error_naming_the_worker() -> None:
    log: list[Any] = []
    proxy = await proxy_of(2, {address(1): [HANG]}, log)
    with pytest.raises(DeadlineExceeded) as raised:
        await proxy.dispatch(TASK, timeout=0.05)
    error = raised.value
    assert isinstance(error, TimeoutError)
    assert isinstance(error, ShardlineError)
    assert error.timeout == 0.05
    assert error.may_have_run
    assert error.address == address(1)
    assert [(uid.int, where, reason) for uid, where, reason in error.tried] == [
        (1, address(1), "deadline")
    ]
    assert "may have run" in str(error)
    assert address(1) in str(error)
    assert [where for where, _ in log] == [address(1)]  # never sent elsewhere
    assert proxy.stats().deadlines == 1
    await proxy.stop()


def first_refusing(
    monkeypatch: pytest.MonkeyPatch, took: Callable[[str], float], log: list[Any]
) -> WorkerProxy:
    """A proxy of workers 1 and 2, worker 1 refusing the call, on a clock of the test's: each
    attempt takes ``took(address)`` seconds of it."""
    now = [100.0]
    monkeypatch.setattr(proxy_module, "_monotonic", lambda: now[0])

    class Slow(Scripted):
        async def dispatch(self, task: Any, *, timeout: float | None = None) -> Any:
            now[0] += took(self.address)
            return await super().dispatch(task, timeout=timeout)

    return WorkerProxy(
        discovery=Stream(added(1), added(2)),
        connect=lambda metadata: Slow(metadata, {address(1): [refused(1)]}, log),
        quorum=2,
    )


async def test_every_attempt_runs_inside_the_one_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The second attempt is given what remains of the call's deadline, not a new one."""
    log: list[Any] = []
    # the first attempt takes 0.3 s, then fails before sending
    proxy = first_refusing(monkeypatch, lambda where: 0.3 if where == address(1) else 0.0, log)
    async with proxy:
        assert await proxy.dispatch(TASK, timeout=1.0) == address(2)
    assert log[0] == (address(1), 1.0)
    assert log[1][0] == address(2)
    assert log[1][1] == pytest.approx(0.7)


async def test_the_deadline_passing_between_attempts_ends_the_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log: list[Any] = []
    proxy = first_refusing(monkeypatch, lambda where: 2.0, log)
    async with proxy:
        with pytest.raises(DeadlineExceeded) as raised:
            await proxy.dispatch(TASK, timeout=1.0)
    assert [where for where, _ in log] == [address(1)]
    assert not raised.value.may_have_run
    assert raised.value.address is None
    assert [reason for _, _, reason in raised.value.tried] == ["cannot-connect"]


async def test_a_call_without_timeout_has_the_proxys_default() -> None:
    log: list[Any] = []
    proxy = await proxy_of(1, {}, log)
    await proxy.dispatch(TASK)
    other = await proxy_of(1, {}, log, timeout=7.5)
    await other.dispatch(TASK)
    assert [timeout for _, timeout in log] == [DEFAULT_TIMEOUT, 7.5]
    assert 0 < DEFAULT_TIMEOUT < float("inf")
    await proxy.stop()
    await other.stop()


@pytest.mark.parametrize("timeout", [0, -1.0, float("nan")])
async def test_a_timeout_that_is_not_positive_is_refused(timeout: float) -> None:
    proxy = await proxy_of(1, {}, [])
    with pytest.raises(ValueError, match="timeout"):
        await proxy.dispatch(TASK, timeout=timeout)
    await proxy.stop()


async def test_retries_stop_when_the_budget_is_spent() -> None:
    log: list[Any] = []
    script: dict[str, list[Any]] = {address(n): [refused(n)] for n in (1, 2, 3, 4)}
    budget = RetryBudget(ratio=0.0, per_second=0.1, window=20.0)  # two retries, then none
    proxy = await proxy_of(4, script, log, retry_budget=budget, health=None)
    with pytest.raises(NoWorkersAvailable, match="retry budget"):
        await proxy.dispatch(TASK)
    assert len(log) == 3  # the first attempt and two retries
    assert (proxy.stats().retries, proxy.stats().retries_refused) == (2, 1)
    with pytest.raises(NoWorkersAvailable, match="retry budget"):
        await proxy.dispatch(TASK)
    assert len(log) == 4  # the budget is spent: one attempt, no retry
    await proxy.stop()


async def test_a_slow_idempotent_task_is_hedged_and_the_loser_cancelled() -> None:
    log: list[Any] = []
    proxy = await proxy_of(2, {address(1): [HANG]}, log)
    result = await proxy.dispatch(Task("work", 1, idempotent=True), timeout=5.0)
    assert result == address(2)
    assert (address(1), "cancelled") in log
    assert proxy.stats().hedges == 1
    await proxy.stop()


async def test_a_task_that_is_not_idempotent_is_never_hedged() -> None:
    log: list[Any] = []
    proxy = await proxy_of(2, {address(1): [HANG]}, log)
    with pytest.raises(DeadlineExceeded):
        await proxy.dispatch(TASK, timeout=0.2)
    assert [where for where, _ in log] == [address(1)]
    assert proxy.stats().hedges == 0
    await proxy.stop()
