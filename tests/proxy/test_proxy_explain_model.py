"""``WorkerProxy.explain(task)`` against what the proxy then does (issue 15, part 2): for every
built-in balancer and through both protocols (the ``balancer_protocol`` fixture), after any run
of admissions, drops and dispatches, the pooled candidates an explanation lists are, in order,
the workers the next dispatch tries, and explaining changes nothing. Kept apart from
test_proxy_explain.py because the fixture patches the proxy for the whole module."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardline import (
    AffinityLoadBalancer,
    LeastLoadedLoadBalancer,
    NoWorkersAvailable,
    RoundRobinLoadBalancer,
    WeightedRoundRobinLoadBalancer,
    WorkerProxy,
)
from support.explain_fakes import Feed, Workers, offered, record, uid

BALANCERS: dict[str, Callable[[], Any]] = {
    "round-robin": RoundRobinLoadBalancer,
    "weighted": WeightedRoundRobinLoadBalancer,
    "least-loaded": lambda: LeastLoadedLoadBalancer(random.Random(7)),
    "affinity": AffinityLoadBalancer,
}

ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 5), st.sampled_from([1, 1, 2, 5, 0])),
        st.tuples(st.just("drop"), st.integers(1, 5), st.just(0)),
        st.tuples(st.just("dispatch"), st.integers(0, 31), st.sampled_from(["a", "b", "c"])),
    ),
    max_size=25,
)


@pytest.mark.parametrize("name", sorted(BALANCERS))
@settings(max_examples=60, deadline=None)
@given(steps=ops)
def test_the_explanation_is_what_the_next_dispatch_tries(
    balancer_protocol: str, name: str, steps: list[tuple[str, int, Any]]
) -> None:
    balancer = BALANCERS[name]()
    workers = Workers()

    async def scenario() -> None:
        feed = Feed()
        proxy = WorkerProxy(
            discovery=feed.events(), loadbalancer=balancer, connect=workers.connect, quorum=0
        )
        # least-loaded's latency ages with time: pinned, two readings a moment apart agree
        proxy._context._pin_clock(10**12)
        async with proxy:
            for op, n, arg in steps:
                if op == "add":
                    await feed.send("worker-added", record(n, arg))
                    continue
                if op == "drop":
                    await feed.send("worker-dropped", record(n))
                    continue
                failing = {uid(k) for k in range(1, 6) if n >> (k - 1) & 1}
                explanation = proxy.explain(arg)
                assert explanation == proxy.explain(arg)  # explaining changed nothing
                assert explanation.method == "balancer"
                workers.failing, workers.log = failing, []
                try:
                    served = await proxy.dispatch(arg)
                except NoWorkersAvailable:
                    served = None
                assert workers.log == offered(explanation, failing)
                assert served == (workers.log[-1] if served is not None else None)
                if not proxy.workers:
                    assert explanation.candidates == ()
                    assert explanation.why_none == "no worker is pooled"

    asyncio.run(scenario())
