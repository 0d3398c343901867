"""A WorkerProxy used before it was started says so (as LocalPool does), rather than reporting
an empty pool as ``NoWorkersAvailable``; once started, an empty pool is still that."""

from __future__ import annotations

import pytest

from shardline import (
    LeastLoadedLoadBalancer,
    NoWorkersAvailable,
    RoundRobinLoadBalancer,
    WorkerProxy,
)
from shardline.proxy import BalancerSpec
from shardline.transport import Task
from support.fakes import Harness, Stream, added, settle

pytestmark = pytest.mark.usefixtures("balancer_protocol")  # each test through both protocols

# round robin takes the pool's native rotation; least loaded goes through select
BALANCERS = [RoundRobinLoadBalancer, LeastLoadedLoadBalancer]
NOT_STARTED = r"WorkerProxy was not started: dispatch inside `async with proxy:`"


@pytest.mark.parametrize("balancer", BALANCERS, ids=lambda b: b.__name__)
async def test_a_dispatch_before_the_proxy_started_says_it_was_not_started(
    balancer: BalancerSpec,
) -> None:
    proxy = WorkerProxy(
        discovery=Stream(added(1)), connect=Harness().connect, loadbalancer=balancer
    )
    with pytest.raises(RuntimeError, match=NOT_STARTED) as raised:
        await proxy.dispatch(Task("echo"))
    assert not isinstance(raised.value, NoWorkersAvailable)
    assert proxy.stats().exhausted == 0


async def test_a_stream_before_the_proxy_started_says_it_was_not_started() -> None:
    proxy = WorkerProxy(discovery=Stream(added(1)), connect=Harness().connect)
    with pytest.raises(RuntimeError, match=NOT_STARTED):
        async for _ in proxy.stream(Task("count", 1)):
            pass


@pytest.mark.parametrize("balancer", BALANCERS, ids=lambda b: b.__name__)
async def test_once_started_an_empty_pool_is_no_workers_available(balancer: BalancerSpec) -> None:
    async with WorkerProxy(
        discovery=Stream(), connect=Harness().connect, quorum=0, loadbalancer=balancer
    ) as proxy:
        with pytest.raises(NoWorkersAvailable, match="none was offered"):
            await proxy.dispatch(Task("echo"))
    assert proxy.stats().exhausted == 1


async def test_the_same_proxy_dispatches_once_started() -> None:
    harness = Harness()
    proxy = harness.proxy(1)
    with pytest.raises(RuntimeError, match=NOT_STARTED):
        await proxy.dispatch(Task("echo"))
    async with proxy:
        await settle()
        assert await proxy.dispatch(Task("echo")) == proxy.workers[0].address
