"""WorkerProxy with passive health (the default): a worker failing in a row is ejected, no
balancer is offered it (the built-in ones and plugins, through either protocol, with no change
to their code), it comes back after its ejection time and one successful probe, and every step
is logged, counted and explained. The pool's clock is pinned (``_pin_clock``), so ejection
times pass when the test says. The rules themselves are tested on the pool in
tests/pool/test_pool_health*.py; the same on real processes in
tests/transport/test_sick_workers.py."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import pytest

from shardline import (
    AffinityLoadBalancer,
    LeastLoadedLoadBalancer,
    NoWorkersAvailable,
    RoundRobinLoadBalancer,
    TransientRpcError,
    WeightedRoundRobinLoadBalancer,
    WorkerError,
    WorkerMetadata,
    WorkerProxy,
)
from shardline.pool.health import HealthPolicy
from support.delegate_balancers import InAdmissionOrder
from support.fakes import Stream, added, settle
from support.workers import worker

SECOND = 1_000_000_000
T0 = 1_000 * SECOND


class Switchable:
    """A connection that fails (before sending) while its worker is marked sick."""

    def __init__(self, metadata: WorkerMetadata, sick: set[str], served: list[str]) -> None:
        self.address = metadata.address
        self.sick = sick
        self.served = served

    async def dispatch(self, task: Any, *, timeout: float | None = None) -> str:
        if self.address in self.sick:
            raise TransientRpcError("refused", reason="cannot-connect", address=self.address)
        if task == "raise":
            raise WorkerError("ValueError", "bad", handler="h", address=self.address)
        self.served.append(self.address)
        return self.address


BALANCERS: list[Callable[[], Any]] = [
    RoundRobinLoadBalancer,
    WeightedRoundRobinLoadBalancer,
    LeastLoadedLoadBalancer,
    AffinityLoadBalancer,
    InAdmissionOrder,
]


async def fleet(
    balancer: Callable[[], Any], sick: set[str], served: list[str], workers: int = 10
) -> WorkerProxy:
    proxy = WorkerProxy(
        discovery=Stream(*(added(n) for n in range(1, workers + 1))),
        loadbalancer=balancer,
        connect=lambda metadata: Switchable(metadata, sick, served),
        quorum=workers,
        retry_budget=None,
    )
    proxy._context._pin_clock(T0)
    await proxy.start()
    await settle()
    return proxy


@pytest.mark.parametrize("balancer", BALANCERS, ids=lambda b: b.__name__)
async def test_no_balancer_is_offered_an_ejected_worker(
    balancer: Callable[[], Any], caplog: pytest.LogCaptureFixture
) -> None:
    sick = {worker(1).address}
    served: list[str] = []
    proxy = await fleet(balancer, sick, served)
    caplog.set_level(logging.INFO, "shardline.proxy")
    while proxy.stats().ejections == 0:
        await proxy.dispatch(f"task-{len(served)}")  # the others serve; worker 1 fails
    health = proxy.health(worker(1).uid)
    assert health is not None
    assert (health.state, health.reason) == ("ejected", "failures")
    assert health.consecutive_failures == HealthPolicy().failures
    assert f"worker {worker(1).uid} at {worker(1).address} ejected for 1 s" in caplog.text
    failures = proxy.stats().transient
    for n in range(200):
        await proxy.dispatch(f"more-{n}")
    assert proxy.stats().transient == failures  # never offered again while ejected
    assert proxy.stats().ejected == 1
    assert worker(1) in proxy.workers  # ejected, still pooled
    excluded = {e.uid: e.why for e in proxy.explain("task").excluded}
    assert "ejected by passive health (failures)" in excluded[worker(1).uid]
    await proxy.stop()


async def test_an_ejected_worker_returns_after_its_time_and_one_successful_probe(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sick = {worker(1).address}
    served: list[str] = []
    proxy = await fleet(RoundRobinLoadBalancer, sick, served)
    caplog.set_level(logging.INFO, "shardline.proxy")
    while proxy.stats().ejections == 0:
        await proxy.dispatch("task")
    sick.clear()  # it recovered, but stays out until its ejection has passed
    for _ in range(30):
        await proxy.dispatch("task")
    assert worker(1).address not in served
    proxy._context._pin_clock(T0 + SECOND)  # its first ejection: 1 s
    state = proxy.health(worker(1).uid)
    assert state is not None
    assert state.state == "probation"
    for _ in range(30):
        await proxy.dispatch("task")
    assert worker(1).address in served  # the probe, then its turns as before
    assert (proxy.stats().readmissions, proxy.stats().ejected) == (1, 0)
    assert f"worker {worker(1).uid} at {worker(1).address} re-admitted" in caplog.text
    await proxy.stop()


async def test_a_failed_probe_ejects_the_worker_for_longer() -> None:
    sick = {worker(1).address}
    proxy = await fleet(RoundRobinLoadBalancer, sick, [])
    while proxy.stats().ejections == 0:
        await proxy.dispatch("task")
    proxy._context._pin_clock(T0 + SECOND)
    while proxy.stats().ejections == 1:  # the probe fails: ejected again
        await proxy.dispatch("task")
    health = proxy.health(worker(1).uid)
    assert health is not None
    assert (health.state, health.times_ejected) == ("ejected", 2)
    assert health.ejected_for == pytest.approx(2.0)
    await proxy.stop()


async def test_a_handlers_error_is_a_healthy_answer() -> None:
    proxy = await fleet(RoundRobinLoadBalancer, set(), [], workers=2)
    for _ in range(50):
        with pytest.raises(WorkerError):
            await proxy.dispatch("raise")
    assert proxy.stats().ejections == 0
    await proxy.stop()


async def test_no_more_than_the_share_of_the_pool_is_ejected() -> None:
    sick = {worker(n).address for n in (1, 2, 3)}
    proxy = await fleet(RoundRobinLoadBalancer, sick, [], workers=10)
    for n in range(300):
        with contextlib.suppress(NoWorkersAvailable):
            await proxy.dispatch(f"task-{n}")
    assert proxy.stats().ejected == 1  # 10% of 10 workers
    await proxy.stop()


async def test_without_health_nothing_is_ejected() -> None:
    sick = {worker(1).address}
    proxy = WorkerProxy(
        discovery=Stream(added(1), added(2)),
        connect=lambda metadata: Switchable(metadata, sick, []),
        quorum=2,
        health=None,
        retry_budget=None,
    )
    async with proxy:
        for _ in range(100):
            await proxy.dispatch("task")
        assert proxy.stats().transient == 100  # each call tried it first, and again
        assert proxy.stats().ejections == 0
        assert proxy.health(worker(1).uid) is None


async def test_round_robins_token_dispatches_end_with_their_calls() -> None:
    """The native path's token dispatches (every worker healthy and fast): a call that raised,
    whose error the caller keeps (and with it the proxy's frame, through the traceback), is
    not left in flight; answers and handler errors count as successes."""
    proxy = await fleet(RoundRobinLoadBalancer, set(), [], workers=2)
    kept: list[WorkerError] = []
    for n in range(300):
        try:
            await proxy.dispatch("raise" if n % 3 else "task")
        except WorkerError as error:
            kept.append(error)
    assert len(kept) == 200
    for uid in (worker(1).uid, worker(2).uid):
        health = proxy.health(uid)
        assert health is not None
        assert (health.in_flight, health.consecutive_failures, health.success_rate) == (0, 0, 1.0)
        assert proxy._context.load(uid)[0] == 0
    await proxy.stop()


async def test_round_robins_token_dispatches_report_their_failures() -> None:
    """A worker whose calls fail (it refuses connections) on the native path is ejected after
    ``failures`` of them in a row, as it would be were its dispatches timed."""
    sick: set[str] = set()
    proxy = await fleet(RoundRobinLoadBalancer, sick, [], workers=4)
    for n in range(100):  # fast and healthy: token dispatches
        await proxy.dispatch(f"warm-{n}")
    sick.add(worker(1).address)
    while proxy.stats().ejections == 0:
        await proxy.dispatch("task")
    health = proxy.health(worker(1).uid)
    assert health is not None
    assert (health.state, health.reason, health.in_flight) == ("ejected", "failures", 0)
    assert health.consecutive_failures == HealthPolicy().failures
    await proxy.stop()
