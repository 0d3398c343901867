"""What measuring dispatch latency costs a dispatch (issue 15): ``WorkerProxy.dispatch`` with
``measure_latency()`` on against the same proxy setup with it off, interleaved.

Two proxies over 8 workers each, whose connection answers at once (``bench_pool.py``'s proxy
dispatch overhead), each with its own pool and balancer on one event loop; one has had
``measure_latency()`` called, as ``shardline.metrics.register`` does for the proxies it is
given. Every round times a block of ``CALLS_PER_ROUND`` dispatches through each, back to back,
the order alternating, and the ratio on / off is taken per round (``ratio`` in ``extra_info``,
with its quartiles; ``ours_ns`` is off, ``theirs_ns`` on). The balancers: the built-in
round-robin (the pool's native path, which reads no clock until latency is measured, and then
times one dispatch in ``DISPATCH_SAMPLE``) and least-loaded (which times every dispatch for its
load anyway). The goal: at most 1.10. Before timing, both proxies must bring back every task,
and after, the measured proxy's histogram must hold what its contract says since it was turned
on: every dispatch, or on the native path exactly one in ``DISPATCH_SAMPLE``.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from typing import Any

import pytest

from shardline import (
    LeastLoadedLoadBalancer,
    RoundRobinLoadBalancer,
    WorkerProxy,
)
from shardline.pool.context import LoadBalancerContext

from .benchkit import CALLS_PER_ROUND, interleaved_summary
from .instant_workers import Immediate, announced

pytest.importorskip("pytest_benchmark")

WORKERS = 8
ROUNDS = 1000
WARMUP = 20
GOAL = 1.10


@pytest.mark.parametrize("balancer", [RoundRobinLoadBalancer, LeastLoadedLoadBalancer])
def test_dispatch_with_latency_measured(
    benchmark: Any, per_call: Callable[..., Any], balancer: Any
) -> None:
    loop = asyncio.new_event_loop()
    proxies = {
        side: WorkerProxy(
            discovery=announced(WORKERS),
            loadbalancer=balancer,
            connect=lambda _: Immediate(),
            quorum=WORKERS,
        )
        for side in ("off", "on")
    }
    for proxy in proxies.values():
        loop.run_until_complete(proxy.start())
    proxies["on"].measure_latency()

    async def check(proxy: WorkerProxy) -> list[Any]:
        return await asyncio.gather(*(proxy.dispatch(task) for task in range(WORKERS * 4)))

    for proxy in proxies.values():
        assert loop.run_until_complete(check(proxy)) == list(range(WORKERS * 4))

    def block(proxy: WorkerProxy) -> int:
        dispatch = proxy.dispatch

        async def dispatches() -> None:
            for task in range(CALLS_PER_ROUND):
                await dispatch(task)

        start = time.perf_counter_ns()
        loop.run_until_complete(dispatches())
        return time.perf_counter_ns() - start

    times: dict[str, list[int]] = {"off": [], "on": []}
    orders = itertools.cycle([("off", "on"), ("on", "off")])

    def round_() -> None:
        for side in next(orders):
            times[side].append(block(proxies[side]))

    benchmark.group = "dispatch, latency measured vs not, interleaved"
    try:
        per_call(round_, 2 * CALLS_PER_ROUND, rounds=ROUNDS, warmup=WARMUP, impl=balancer.__name__)
        stats = proxies["on"].stats()
        assert stats.latency is not None
        # on before the first dispatch; every dispatch went one path
        sampled = stats.dispatched // LoadBalancerContext.DISPATCH_SAMPLE
        timed = sampled if balancer is RoundRobinLoadBalancer else stats.dispatched
        assert stats.latency.count == timed
        assert proxies["off"].stats().latency is None
    finally:
        for proxy in proxies.values():
            loop.run_until_complete(proxy.stop())
        loop.close()
    summary = interleaved_summary(times["off"][WARMUP:], times["on"][WARMUP:], CALLS_PER_ROUND)
    benchmark.extra_info.update(summary, goal=GOAL, met=summary["ratio"] <= GOAL)
