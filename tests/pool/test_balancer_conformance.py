"""shardline.balancer_conformance: the built-in balancers pass the conformance kit, and a
balancer that breaks one property fails the check for it (so no check is one that cannot
fail)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from shardline import (
    AffinityLoadBalancer,
    LeastLoadedLoadBalancer,
    RoundRobinLoadBalancer,
    WeightedRoundRobinLoadBalancer,
)
from shardline import balancer_conformance as kit
from shardline.balancers import SelectLoadBalancer, create_balancer
from shardline.balancers import protocol as kit_protocol
from shardline.pool.context import LoadBalancerContextView
from support.delegate_balancers import Gen, in_turn

BUILT_INS: dict[str, Callable[[], Any]] = {
    "round-robin": RoundRobinLoadBalancer,
    "weighted": WeightedRoundRobinLoadBalancer,
    "least-loaded": LeastLoadedLoadBalancer,
    "affinity": AffinityLoadBalancer,
}


@pytest.mark.parametrize("check", kit.CHECKS, ids=lambda check: check.__name__)
@pytest.mark.parametrize("factory", BUILT_INS.values(), ids=list(BUILT_INS))
def test_built_in_balancers_pass_every_check(
    factory: Callable[[], Any], check: Callable[..., None]
) -> None:
    check(factory)


@pytest.mark.parametrize("name", BUILT_INS)
def test_built_in_balancers_pass_by_their_registered_name(name: str) -> None:
    kit.check_balancer(lambda: create_balancer(name))


def test_a_task_maker_is_used_for_the_tasks() -> None:
    keys: set[object] = set()

    def key(task: dict[str, int]) -> object:
        keys.add(task["user"])
        return task["user"]

    kit.check_balancer(lambda: AffinityLoadBalancer(key=key), make_task=lambda n: {"user": n})
    assert len(keys) > 3


# Balancers that each break one property ------------------------------------------------------


class OffersTheFirstTwice:
    """Offers every worker, then the first one again."""

    def delegate(self, task: Any, *, context: LoadBalancerContextView) -> Gen:
        uids = list(context.workers)
        return in_turn([*uids, *uids[:1]])


class GoesOnAfterSuccess:
    """Ignores a success: offers the next worker anyway."""

    async def delegate(self, task: Any, *, context: LoadBalancerContextView) -> Gen:
        for uid in list(context.workers):
            try:
                yield uid
            except Exception:
                continue


class SwallowsClose:
    """Offers the next worker after any exception, the close of an abandoned call included."""

    async def delegate(self, task: Any, *, context: LoadBalancerContextView) -> Gen:
        for uid in list(context.workers):
            try:
                served = yield uid
            except BaseException:
                continue
            if served is not None:
                return


class TriesOnlyTwo:
    """Gives up after two candidates."""

    def delegate(self, task: Any, *, context: LoadBalancerContextView) -> Gen:
        return in_turn(list(context.workers)[:2])


class ReadsEachCandidate:
    """Reads each candidate's record from the pool before offering it: a worker dropped since
    the call began raises KeyError."""

    def delegate(self, task: Any, *, context: LoadBalancerContextView) -> Gen:
        # a generator: each record is read only as the call reaches its worker
        return in_turn(context.workers[uid][0].uid for uid in list(context.workers))


class SharesItsCandidates:
    """Keeps a call's remaining candidates in the balancer: a call that starts replaces the
    list the calls in progress are taking from."""

    def __init__(self) -> None:
        self._left: list[uuid.UUID] = []

    def delegate(self, task: Any, *, context: LoadBalancerContextView) -> Gen:
        self._left = list(context.workers)
        return in_turn(self._take())

    def _take(self) -> Iterator[uuid.UUID]:
        while self._left:
            yield self._left.pop(0)


class WaitsForever:
    """Waits for something that never happens before its first candidate."""

    async def delegate(self, task: Any, *, context: LoadBalancerContextView) -> Gen:
        await asyncio.Event().wait()
        yield next(iter(context.workers))


BROKEN = [
    (OffersTheFirstTwice, kit.check_no_repeats, "never offers a worker twice", "offered twice"),
    (GoesOnAfterSuccess, kit.check_ends_after_success, "ends once a candidate", "instead of"),
    (SwallowsClose, kit.check_ends_after_success, "ends once a candidate", "closing the call"),
    (TriesOnlyTwo, kit.check_offers_every_worker, "offers every pooled worker", "without"),
    (ReadsEachCandidate, kit.check_workers_leaving, "tolerates workers leaving", "KeyError"),
    (SharesItsCandidates, kit.check_concurrent_calls, "works with concurrent calls", "without"),
]


@pytest.mark.parametrize(
    ("broken", "check", "title", "detail"), BROKEN, ids=[row[0].__name__ for row in BROKEN]
)
def test_a_balancer_breaking_a_property_fails_its_check(
    broken: type, check: Callable[..., None], title: str, detail: str
) -> None:
    with pytest.raises(AssertionError) as failure:
        check(broken)
    message = str(failure.value)
    assert message.startswith(title), message
    assert broken.__name__ in message, message
    assert detail in message, message
    with pytest.raises(AssertionError, match=title):
        kit.check_balancer(broken)


@pytest.mark.parametrize(
    ("broken", "target"),
    [
        (ReadsEachCandidate, kit.check_workers_leaving),
        (SharesItsCandidates, kit.check_concurrent_calls),
    ],
    ids=["ReadsEachCandidate", "SharesItsCandidates"],
)
def test_the_churn_and_concurrency_checks_catch_what_the_others_cannot(
    broken: type, target: Callable[..., None]
) -> None:
    for check in kit.CHECKS:
        if check is not target:
            check(broken)


def test_a_balancer_that_hangs_is_reported_not_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kit, "_STEP_TIMEOUT", 0.05)
    with pytest.raises(AssertionError, match=r"did not answer within 0\.05 s"):
        kit.check_offers_every_worker(WaitsForever)


def test_a_call_that_never_ends_is_reported() -> None:
    class Forever:
        async def delegate(self, task: Any, *, context: LoadBalancerContextView) -> Gen:
            while context.workers:
                for uid in list(context.workers):
                    try:
                        yield uid
                    except Exception:
                        continue

    with pytest.raises(AssertionError, match="the call did not end; it offered"):
        kit.check_offers_every_worker(Forever)


def test_an_empty_pool_must_offer_nobody() -> None:
    stranger = uuid.UUID(int=7)

    class Invents:
        def delegate(self, task: Any, *, context: LoadBalancerContextView) -> Gen:
            return in_turn(list(context.workers) or [stranger])

    with pytest.raises(AssertionError, match=r"an empty pool: offered \[UUID"):
        kit.check_offers_every_worker(Invents)


# Through select ------------------------------------------------------------------------------


class SelectOnly(SelectLoadBalancer):
    """A plugin that implements only the synchronous protocol (delegate derived from it): the
    first untried pooled worker."""

    needs_load = False

    def __repr__(self) -> str:
        return "SelectOnly()"

    def select(
        self, task: Any, *, context: LoadBalancerContextView, tried: kit_protocol.Tried
    ) -> uuid.UUID | None:
        return next((uid for uid in context.workers if uid not in tried), None)


class SelectRepeatsTheFirst(SelectOnly):
    """Through select, offers the first worker again after it failed."""

    def select(
        self, task: Any, *, context: LoadBalancerContextView, tried: kit_protocol.Tried
    ) -> uuid.UUID | None:
        if len(tried) == 1:
            return next(iter(tried))
        return super().select(task, context=context, tried=tried)


class SelectGivesUpAfterTwo(SelectOnly):
    """Through select, gives up once two workers failed."""

    def select(
        self, task: Any, *, context: LoadBalancerContextView, tried: kit_protocol.Tried
    ) -> uuid.UUID | None:
        return None if len(tried) >= 2 else super().select(task, context=context, tried=tried)


def test_a_balancer_implementing_only_select_is_checked_through_both_and_passes() -> None:
    kit.check_balancer(SelectOnly)


@pytest.mark.parametrize(
    ("broken", "check", "title"),
    [
        (SelectRepeatsTheFirst, kit.check_no_repeats, kit.NO_REPEATS),
        (SelectGivesUpAfterTwo, kit.check_offers_every_worker, kit.EVERY_WORKER),
    ],
    ids=["SelectRepeatsTheFirst", "SelectGivesUpAfterTwo"],
)
def test_a_select_breaking_a_property_fails_its_check(
    broken: type, check: Callable[..., None], title: str
) -> None:
    with pytest.raises(AssertionError) as failure:
        check(broken)
    message = str(failure.value)
    assert message.startswith(title), message
    assert "through select" in message, message


class SelectRightDelegateWrong(SelectLoadBalancer):
    """Its select is right, but it overrides delegate with one that repeats: both are run."""

    needs_load = False

    def select(
        self, task: Any, *, context: LoadBalancerContextView, tried: kit_protocol.Tried
    ) -> uuid.UUID | None:
        return next((uid for uid in context.workers if uid not in tried), None)

    async def delegate(self, task: Any, *, context: LoadBalancerContextView) -> Gen:
        first = next(iter(context.workers), None)
        while first is not None:
            yield first


def test_a_balancer_with_both_protocols_is_checked_through_each() -> None:
    with pytest.raises(AssertionError, match="through delegate"):
        kit.check_no_repeats(SelectRightDelegateWrong)


def test_an_object_without_delegate_fails_every_check() -> None:
    for check in kit.CHECKS:
        with pytest.raises(AssertionError, match="has no delegate"):
            check(object)


def test_shardline_testing_is_the_same_kit_under_the_readme_s_first_name() -> None:
    import shardline.testing

    assert shardline.testing.__all__ == kit.__all__
    assert all(getattr(shardline.testing, name) is getattr(kit, name) for name in kit.__all__)
