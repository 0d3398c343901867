"""The two balancer protocols (issue 12): ``select`` beside ``delegate``, which one the proxy
drives, the load it keeps only for the balancers that read it, and the round-robin rotation
against a reference model under concurrent calls and pool changes."""

from __future__ import annotations

import doctest
import random
import uuid
from collections.abc import Awaitable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardline import (
    AffinityLoadBalancer,
    LeastLoadedLoadBalancer,
    LoadBalancerContext,
    LoadBalancerLike,
    NoWorkersAvailable,
    RoundRobinLoadBalancer,
    RpcError,
    SelectLoadBalancer,
    TransientRpcError,
    WeightedRoundRobinLoadBalancer,
    WorkerProxy,
)
from shardline.balancers import protocol
from shardline.balancers.bucket import BucketLoadBalancer
from shardline.balancers.protocol import needs_load, select_of
from support.balancer_driving import PROTOCOLS
from support.delegate_balancers import Gen, InAdmissionOrder
from support.fakes import Harness, Stream, added
from support.observed_load import load_during_and_after
from support.rotation_model import RotationModel
from support.workers import worker

pytestmark = pytest.mark.usefixtures("balancer_protocol")  # the proxy through both protocols


def test_the_protocol_modules_examples_run() -> None:
    assert doctest.testmod(protocol, raise_on_error=False).failed == 0
    assert doctest.testmod(protocol).attempted >= 10


# --- Which protocol the proxy drives ------------------------------------------------------------


class Rotating(InAdmissionOrder):
    """A plugin written against the seed's protocol alone, with an unrelated ``select``."""

    def __init__(self) -> None:
        self.calls = 0

    def select(self, uids: list[uuid.UUID]) -> uuid.UUID:
        return uids[0]

    def delegate(self, task: Any, *, context: Any) -> Gen:
        self.calls += 1
        return super().delegate(task, context=context)


class Both(SelectLoadBalancer):
    """Has both protocols; its ``delegate`` must never be driven by the proxy."""

    needs_load = False

    def __init__(self) -> None:
        self.selects = 0

    def select(self, task: Any, *, context: Any, tried: Any) -> uuid.UUID | None:
        self.selects += 1
        return next((uid for uid in context.workers if uid not in tried), None)

    async def delegate(self, task: Any, *, context: Any) -> Gen:
        raise AssertionError("the proxy drove delegate although select exists")
        yield


def test_select_is_recognised_by_its_signature() -> None:
    assert select_of(RoundRobinLoadBalancer()) is not None
    assert select_of(Both()) is not None
    assert select_of(Rotating()) is None  # a select(uids) of its own
    assert select_of(object()) is None

    class Kwargs:
        def select(self, task: Any, **options: Any) -> None:
            return None

    assert select_of(Kwargs()) is not None


async def test_a_delegate_only_plugin_still_works_failures_and_all() -> None:
    async def scenario() -> list[str]:
        harness = Harness()
        balancer = Rotating()
        proxy = harness.proxy(1, 2, loadbalancer=balancer)
        async with proxy:
            harness.connections[worker(1).address].failure = TransientRpcError("busy")
            served = [await proxy.dispatch("a"), await proxy.dispatch("b")]
        assert balancer.calls == 2
        assert isinstance(balancer, LoadBalancerLike)
        return served

    assert await scenario() == [worker(2).address] * 2


async def test_the_proxy_prefers_select(balancer_protocol: str) -> None:
    balancer = Both()

    async def scenario() -> str:
        proxy = WorkerProxy(
            discovery=Stream(added(1)), connect=Harness().connect, loadbalancer=balancer
        )
        async with proxy:
            return await proxy.dispatch("task")

    if balancer_protocol == "delegate":  # the proxy made to ignore select
        with pytest.raises(AssertionError, match="drove delegate"):
            await scenario()
    else:
        assert await scenario() == worker(1).address
        assert balancer.selects == 1


# --- The proxy's side of each protocol ----------------------------------------------------------


class Recording(SelectLoadBalancer):
    """Offers the given uids in order and records the ``tried`` it was given each time."""

    needs_load = False

    def __init__(self, *uids: uuid.UUID) -> None:
        self.uids = list(uids)
        self.seen: list[dict[uuid.UUID, Any]] = []

    def select(self, task: Any, *, context: Any, tried: Any) -> uuid.UUID | None:
        self.seen.append(dict(tried))
        return self.uids[len(tried)] if len(tried) < len(self.uids) else None


async def test_tried_says_what_became_of_each_candidate_and_giving_up_chains_the_last_failure():
    busy, broken = TransientRpcError("busy"), RpcError("broken")
    gone = worker(9).uid  # never pooled: skipped, not failed
    balancer = Recording(worker(1).uid, gone, worker(2).uid)

    async def scenario() -> list[Any]:
        harness = Harness()
        proxy = harness.proxy(1, 2, loadbalancer=balancer)
        async with proxy:
            harness.connections[worker(1).address].failure = busy
            harness.connections[worker(2).address].failure = broken
            with pytest.raises(NoWorkersAvailable) as raised:
                await proxy.dispatch("task")
            return [raised.value.__cause__, proxy.workers]

    cause, workers = await scenario()
    assert cause is broken
    assert workers == [worker(1)]  # the non-transient failure evicted worker 2
    assert balancer.seen == [
        {},
        {worker(1).uid: busy},
        {worker(1).uid: busy, gone: None},
        {worker(1).uid: busy, gone: None, worker(2).uid: broken},
    ]


async def test_a_delegate_running_out_also_chains_the_last_failure() -> None:
    async def scenario() -> BaseException | None:
        harness = Harness()
        proxy = harness.proxy(1, loadbalancer=Rotating())
        async with proxy:
            harness.connections[worker(1).address].failure = TransientRpcError("busy")
            with pytest.raises(NoWorkersAvailable) as raised:
                await proxy.dispatch("task")
            return raised.value.__cause__

    cause = await scenario()
    assert isinstance(cause, TransientRpcError)


async def test_offering_a_worker_twice_in_one_call_is_a_protocol_violation() -> None:
    class Stubborn(SelectLoadBalancer):
        needs_load = False

        def select(self, task: Any, *, context: Any, tried: Any) -> uuid.UUID | None:
            return worker(1).uid

    async def scenario() -> None:
        harness = Harness()
        proxy = harness.proxy(1, loadbalancer=Stubborn())
        async with proxy:
            harness.connections[worker(1).address].failure = TransientRpcError("busy")
            await proxy.dispatch("task")

    with pytest.raises(RuntimeError, match="twice in one call"):
        await scenario()


# --- Load bookkeeping only for the balancers that read it ---------------------------------------


class Undeclared(SelectLoadBalancer):
    """A select plugin that does not say whether it reads the load."""

    def select(self, task: Any, *, context: Any, tried: Any) -> uuid.UUID | None:
        return None if tried else next(iter(context.workers))  # type: ignore[no-any-return]


class DeclaredIdle(Rotating):
    needs_load = False


@pytest.mark.parametrize(
    ("make", "kept"),
    [
        (RoundRobinLoadBalancer, False),
        (WeightedRoundRobinLoadBalancer, False),
        (AffinityLoadBalancer, False),
        (LeastLoadedLoadBalancer, True),
        (Rotating, True),  # a plugin from before the declaration: the load stays correct
        (Undeclared, True),
        (DeclaredIdle, False),
    ],
)
async def test_the_load_is_kept_only_for_a_balancer_that_needs_it(make: Any, kept: bool) -> None:
    """Without passive health, which needs the load of every worker whatever the balancer."""
    balancer = make()
    assert needs_load(balancer) is kept
    seen, (inflight_after, latency) = await load_during_and_after(balancer, health=None)
    assert seen == [(1, 0.0) if kept else (0, 0.0)]
    assert inflight_after == 0
    assert (latency > 0.0) is kept


def test_the_bucket_balancer_needs_no_load(topology: Any) -> None:
    assert needs_load(BucketLoadBalancer(topology, "default")) is False


# --- The round-robin rotation against a reference model -----------------------------------------


def settled(awaitable: Awaitable[Any]) -> Any:
    """Runs one step of a generator that never awaits: its value, or None when it finished."""
    try:
        awaitable.send(None)  # type: ignore[attr-defined]
    except StopIteration as done:
        return done.value
    except StopAsyncIteration:
        return None
    raise AssertionError("the balancer awaited something")


class Call:
    """One open call of the balancer, through either protocol, with the model's ``tried``."""

    def __init__(self, balancer: RoundRobinLoadBalancer, context: Any, protocol: str) -> None:
        self.balancer, self.context, self.protocol = balancer, context, protocol
        self.tried: dict[uuid.UUID, Any] = {}
        self.gen: Gen | None = None
        self.last: uuid.UUID | None = None

    def next(self, outcome: Exception | None) -> uuid.UUID | None:
        """Reports ``outcome`` for the last candidate (if any) and returns the next one."""
        if self.last is not None:
            self.tried[self.last] = outcome
        if self.protocol == "select":
            self.last = self.balancer.select(None, context=self.context, tried=self.tried)
        elif self.gen is None:
            self.gen = self.balancer.delegate(None, context=self.context)
            self.last = settled(self.gen.__anext__())
        else:
            assert outcome is not None
            self.last = settled(self.gen.athrow(outcome))
        return self.last

    def succeed(self) -> None:
        if self.gen is not None and self.last is not None:
            assert settled(self.gen.asend(self.last)) is None


operations = st.lists(
    st.one_of(
        st.tuples(st.just("call"), st.integers(0, 3), st.sampled_from(["fail", "evict", "serve"])),
        st.tuples(st.sampled_from(["admit", "remove", "refresh"]), st.integers(0, 6)),
    ),
    max_size=60,
)


@pytest.mark.parametrize("driven_through", PROTOCOLS)
@settings(max_examples=300, deadline=None)
@given(initial=st.integers(0, 5), ops=operations)
def test_round_robin_matches_the_model_under_concurrent_calls_and_pool_changes(
    driven_through: str, initial: int, ops: list[tuple[Any, ...]]
) -> None:
    context = LoadBalancerContext()
    balancer, model = RoundRobinLoadBalancer(), RotationModel()
    for n in range(initial):
        context.add_worker(worker(n), f"conn-{n}")
        model.admit(worker(n).uid)
    calls: dict[int, Call] = {}
    pid = random.Random(0)
    for op in ops:
        if op[0] == "admit":
            context.add_worker(worker(op[1]), f"conn-{op[1]}")
            model.admit(worker(op[1]).uid)
        elif op[0] == "remove":
            context.remove_worker(worker(op[1]))
            model.evict(worker(op[1]).uid)
        elif op[0] == "refresh":
            context.update_worker(worker(op[1], pid=pid.randint(2, 99)), "refreshed")
        else:
            _, slot, outcome = op
            call = calls.setdefault(slot, Call(balancer, context, driven_through))
            pool = context.uids()
            failure: Exception | None = TransientRpcError("busy") if call.last else None
            expected = model.select({**call.tried, **({call.last: failure} if call.last else {})})
            offered = call.next(failure)
            assert offered == expected
            if offered is None:
                assert all(uid in call.tried for uid in pool)  # gave up only after all of them
                del calls[slot]
                continue
            assert offered in context
            assert offered not in call.tried
            if outcome == "serve":
                call.succeed()
                del calls[slot]
            elif outcome == "evict":
                context.remove_worker(worker(offered.int))
                model.evict(offered)
