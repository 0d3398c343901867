"""LocalPool's arguments for the proxy it makes and the workers it starts: the balancer, the
default deadline and the frame limit, each seen in what real worker processes do."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from shardline import DeadlineExceeded, InvalidArgumentType, SelectLoadBalancer, WorkerError
from shardline.balancers.protocol import Tried
from shardline.pool import LoadBalancerContextView
from shardline.transport import TRANSPORTS, LocalPool, Task

SPEC = "local_pool_handlers:HANDLERS"  # beside this file
LIMIT = 64 * 1024

pytestmark = pytest.mark.async_timeout(30.0)


class Lowest(SelectLoadBalancer):
    """Always the worker with the lowest uid: round robin would spread the calls."""

    needs_load = False

    def select(
        self, task: Any, *, context: LoadBalancerContextView, tried: Tried
    ) -> uuid.UUID | None:
        left = [uid for uid in context.workers if uid not in tried]
        return min(left, default=None)


@pytest.mark.integration  # worker processes
async def test_the_pool_dispatches_through_the_balancer_it_is_given() -> None:
    async with LocalPool(SPEC, workers=2, loadbalancer=Lowest) as pool:
        served = {await pool.dispatch(Task("whoami"), timeout=5.0) for _ in range(10)}
        lowest = min(pool.workers, key=lambda metadata: metadata.uid)
    assert served == {lowest.pid}


@pytest.mark.integration  # worker processes
async def test_the_pools_timeout_is_the_default_deadline_of_a_dispatch() -> None:
    async with LocalPool(SPEC, workers=1, timeout=0.3) as pool:
        with pytest.raises(DeadlineExceeded) as raised:
            await pool.dispatch(Task("block"))
    assert raised.value.timeout == 0.3


@pytest.mark.integration  # worker processes
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_frame_limit_bounds_requests_and_answers_both_ways(transport: str) -> None:
    async with LocalPool(SPEC, workers=1, transport=transport, max_frame_bytes=LIMIT) as pool:
        assert await pool.dispatch(Task("blob", LIMIT // 2), timeout=5.0) == "x" * (LIMIT // 2)
        # the proxy's connection refuses to send a request over the limit
        with pytest.raises(ValueError, match=f"over the limit of {LIMIT}"):
            await pool.dispatch(Task("echo", "y" * 2 * LIMIT), timeout=5.0)
        # the worker refuses to send an answer over it
        with pytest.raises(WorkerError, match=f"over the limit of {LIMIT}"):
            await pool.dispatch(Task("blob", 2 * LIMIT), timeout=5.0)
        # neither failure is the worker's: it stays pooled and serves
        assert len(pool.workers) == 1
        assert await pool.dispatch(Task("blob", 10), timeout=5.0) == "x" * 10


@pytest.mark.integration  # worker processes
async def test_the_default_frame_limit_carries_what_the_small_one_refuses() -> None:
    async with LocalPool(SPEC, workers=1) as pool:
        assert await pool.dispatch(Task("blob", 2 * LIMIT), timeout=5.0) == "x" * 2 * LIMIT


@pytest.mark.parametrize("bad", [0, -1])
def test_a_frame_limit_below_one_byte_is_a_value_error(bad: int) -> None:
    with pytest.raises(ValueError, match=f"max_frame_bytes must be an int >= 1, not {bad}"):
        LocalPool(SPEC, max_frame_bytes=bad)


@pytest.mark.parametrize("bad", ["65536", 65536.0, True])
def test_a_frame_limit_that_is_no_int_is_also_a_type_error(bad: Any) -> None:
    with pytest.raises(InvalidArgumentType, match="max_frame_bytes must be an int") as raised:
        LocalPool(SPEC, max_frame_bytes=bad)
    assert isinstance(raised.value, TypeError)
