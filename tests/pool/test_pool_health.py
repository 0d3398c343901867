"""The pool's passive health (issue 25, bullet 3), one rule at a time: each ejection reason,
the probe, ejection times, the share cap, refresh and eviction, the events, the balancers
that read the pool, and the pool with health never configured.

The pool's clock is pinned (``_pin_clock``), so every time below is exact."""

from __future__ import annotations

import dataclasses
import random
import uuid
from typing import Any

import pytest

from shardline import (
    AffinityLoadBalancer,
    LeastLoadedLoadBalancer,
    LoadBalancerContext,
    RoundRobinLoadBalancer,
    WeightedRoundRobinLoadBalancer,
    WorkerPool,
)
from shardline.pool import HealthPolicy, WorkerHealth
from support.workers import worker

T0 = 10**12
MS = 1_000_000
S = 1_000_000_000
SUCCESS, FAILURE, DEADLINE, NEUTRAL = (
    WorkerPool.OUTCOME_SUCCESS,
    WorkerPool.OUTCOME_FAILURE,
    WorkerPool.OUTCOME_DEADLINE,
    WorkerPool.OUTCOME_NEUTRAL,
)


class Clock:
    """The pool's pinned clock, moved by the test."""

    def __init__(self, pool: WorkerPool) -> None:
        self.pool, self.now = pool, T0
        pool._pin_clock(T0)

    def advance(self, ns: int) -> None:
        self.now += ns
        self.pool._pin_clock(self.now)


def health_pool(n: int = 4, **policy: Any) -> tuple[LoadBalancerContext, Clock]:
    pool = LoadBalancerContext()
    for k in range(1, n + 1):
        pool.add_worker(worker(k), f"conn-{k}")
    clock = Clock(pool)
    pool.configure_health(HealthPolicy(**policy))
    return pool, clock


def uid(n: int) -> uuid.UUID:
    return worker(n).uid


def call(pool: WorkerPool, clock: Clock, n: int, outcome: int, took: int = MS) -> bool:
    """One dispatch to worker n that takes ``took`` ns and ends with ``outcome``."""
    _, _, started = pool.start_dispatch(uid(n))
    clock.advance(took)
    return pool.finish_dispatch(uid(n), started, outcome)


def hidden(pool: WorkerPool, n: int) -> bool:
    """Whether worker n is hidden from every read a balancer makes that has no side effect,
    checked one by one (``start_dispatch`` and ``begin_dispatch`` are checked where a test
    means to start a dispatch)."""
    u = uid(n)
    views = [
        u not in pool.workers,
        u not in list(pool.workers),
        u not in pool.workers,
        all(record.uid != u for record, _ in pool.workers.values()),
        all(key != u for key, _ in pool.workers.items()),
        pool.workers.get(u) is None,
        u not in pool.uids(),
        u not in pool.rotation_order(),
    ]
    for read in (pool.entry, pool.workers.__getitem__):
        try:
            read(u)
        except KeyError:
            views.append(True)
        else:
            views.append(False)
    assert len(set(views)) == 1, views
    if views[0]:
        assert pool.load(u) == (0, 0.0)
        for start in (pool.start_dispatch, pool.begin_dispatch):
            with pytest.raises(KeyError):
                start(u)
    return views[0]


def test_consecutive_failures_eject_and_hide_the_worker_from_every_read() -> None:
    pool, clock = health_pool()
    for _ in range(4):
        assert call(pool, clock, 1, FAILURE) is False
    assert not hidden(pool, 1)
    assert call(pool, clock, 1, DEADLINE) is True  # deadline misses count as failures
    assert hidden(pool, 1)
    assert len(pool.workers) == 3
    assert len(pool) == 4
    assert uid(1) in pool
    assert pool.pooled(uid(1)) == (worker(1), "conn-1")
    assert [member[0] for member in pool.members()] == [uid(k) for k in range(1, 5)]
    health = pool.health(uid(1))
    assert health == WorkerHealth(
        state="ejected",
        consecutive_failures=5,
        in_flight=0,
        latency=pytest.approx(0.001),  # type: ignore[arg-type]
        success_rate=pytest.approx(0.9**5),  # type: ignore[arg-type]
        times_ejected=1,
        ejected_for=1.0,
        reason="failures",
    )
    assert pool.health_counts() == (1, 0, 1)
    events = pool.drain_health_events()
    assert events == [(uid(1), worker(1), "ejected", "failures", 1.0)]
    assert pool.drain_health_events() == []


def test_a_success_between_failures_resets_the_run() -> None:
    pool, clock = health_pool(success_rate=0.0)  # the run alone
    for outcome in [FAILURE] * 4 + [SUCCESS] + [FAILURE] * 4:
        call(pool, clock, 1, outcome)
    assert pool.health(uid(1)).state == "healthy"  # type: ignore[union-attr]
    call(pool, clock, 1, FAILURE)
    assert pool.health(uid(1)).reason == "failures"  # type: ignore[union-attr]


def test_failing_every_other_call_is_ejected_on_the_success_rate_within_10_failures() -> None:
    pool, clock = health_pool()
    failures = 0
    while pool.health(uid(1)).state == "healthy":  # type: ignore[union-attr]
        call(pool, clock, 1, FAILURE)
        failures += 1
        if pool.health(uid(1)).state == "healthy":  # type: ignore[union-attr]
            call(pool, clock, 1, SUCCESS)
    assert failures == 7
    assert pool.health(uid(1)).reason == "success-rate"  # type: ignore[union-attr]


def test_a_stuck_worker_is_ejected_by_another_workers_finish_before_its_calls_end() -> None:
    pool, clock = health_pool()
    for n in range(1, 5):
        call(pool, clock, n, SUCCESS, took=MS)  # a latency estimate of 1 ms each
    _, _, stuck_started = pool.start_dispatch(uid(1))
    # 8 x 1 ms is under the 20 ms floor: not stuck at 20 ms
    clock.advance(19 * MS)
    call(pool, clock, 2, SUCCESS, took=MS)
    assert not hidden(pool, 1)
    # stuck past it, caught by the next finish once the scan is due (every 10 ms)
    clock.advance(9 * MS)
    assert call(pool, clock, 2, SUCCESS, took=0) is False
    assert not hidden(pool, 1)
    clock.advance(1 * MS)
    assert call(pool, clock, 2, SUCCESS, took=0) is True
    assert hidden(pool, 1)
    assert pool.health(uid(1)).reason == "stuck"  # type: ignore[union-attr]
    assert pool.health(uid(1)).in_flight == 1  # type: ignore[union-attr]
    # its call ends late: no signal beyond the deadline, and it stays ejected
    pool.finish_dispatch(uid(1), stuck_started, DEADLINE)
    assert hidden(pool, 1)


def test_a_stuck_worker_is_ejected_when_handed_out() -> None:
    pool, clock = health_pool()
    call(pool, clock, 1, SUCCESS, took=MS)
    pool.start_dispatch(uid(1))
    clock.advance(21 * MS)
    with pytest.raises(KeyError):
        pool.start_dispatch(uid(1))
    assert pool.health(uid(1)).reason == "stuck"  # type: ignore[union-attr]
    # and dispatch_next passes over it to the next worker
    pool.add_worker(worker(5), "conn-5")
    call(pool, clock, 5, SUCCESS)
    pool.start_dispatch(uid(5))
    clock.advance(21 * MS)
    picks = {pool.dispatch_next(None, True)[0] for _ in range(6)}  # type: ignore[index]
    assert picks == {uid(2), uid(3), uid(4)} or uid(5) in picks  # cap: one ejected at a time
    assert uid(1) not in picks


def test_a_worker_idle_for_long_is_not_stuck_when_a_call_starts() -> None:
    pool, clock = health_pool()
    call(pool, clock, 1, SUCCESS, took=MS)
    clock.advance(10 * S)
    pool.start_dispatch(uid(1))
    pool.begin_dispatch(uid(2))
    clock.advance(5 * MS)
    call(pool, clock, 3, SUCCESS)
    assert not hidden(pool, 1)
    assert not hidden(pool, 2)


def test_a_latency_outlier_is_ejected_at_most_every_100_ms() -> None:
    pool, clock = health_pool()
    for n in (1, 2, 3):
        call(pool, clock, n, SUCCESS, took=MS)
    # the outlier check ran at the first finish, with one estimate; the next is due at 101 ms
    call(pool, clock, 4, SUCCESS, took=40 * MS)
    assert pool.load(uid(4))[1] > 5 * 0.001
    assert not hidden(pool, 4)
    clock.advance(100 * MS)
    call(pool, clock, 1, SUCCESS, took=0)
    assert hidden(pool, 4)
    assert pool.health(uid(4)).reason == "latency"  # type: ignore[union-attr]


def test_a_slow_worker_under_the_floor_is_no_outlier() -> None:
    pool, clock = health_pool()
    for n in (1, 2, 3):
        call(pool, clock, n, SUCCESS, took=MS)
    call(pool, clock, 4, SUCCESS, took=15 * MS)  # 15 x the median, but under 20 ms
    clock.advance(200 * MS)
    call(pool, clock, 1, SUCCESS, took=0)
    assert not hidden(pool, 4)


def test_no_latency_outlier_among_fewer_than_three_estimates() -> None:
    pool, clock = health_pool()
    call(pool, clock, 1, SUCCESS, took=MS)
    clock.advance(200 * MS)
    call(pool, clock, 2, SUCCESS, took=50 * MS)
    clock.advance(200 * MS)
    call(pool, clock, 1, SUCCESS, took=MS)
    assert not hidden(pool, 2)


def test_the_probe_readmits_and_a_failed_probe_ejects_for_longer() -> None:
    pool, clock = health_pool(base_ejection=1.0, max_ejection=2.5)
    for _ in range(5):
        call(pool, clock, 1, FAILURE)
    clock.advance(S - MS)
    assert pool.health(uid(1)).state == "ejected"  # type: ignore[union-attr]
    assert pool.health(uid(1)).ejected_for == pytest.approx(0.001)  # type: ignore[union-attr]
    clock.advance(MS)
    assert pool.health(uid(1)).state == "probation"  # type: ignore[union-attr]
    assert not hidden(pool, 1)
    _, _, probe = pool.start_dispatch(uid(1))
    assert pool.health(uid(1)).state == "probing"  # type: ignore[union-attr]
    assert hidden(pool, 1)  # one probe at a time
    clock.advance(MS)
    assert pool.finish_dispatch(uid(1), probe, FAILURE) is True
    assert pool.health(uid(1)).ejected_for == 2.0  # type: ignore[union-attr]
    clock.advance(2 * S)
    _, _, probe = pool.start_dispatch(uid(1))
    pool.finish_dispatch(uid(1), probe, DEADLINE)
    assert pool.health(uid(1)).ejected_for == 2.5  # capped at max_ejection  # type: ignore[union-attr]
    clock.advance(3 * S)
    # a neutral outcome leaves it on probation; the next dispatch is a new probe
    _, _, probe = pool.start_dispatch(uid(1))
    pool.finish_dispatch(uid(1), probe, NEUTRAL)
    assert pool.health(uid(1)).state == "probation"  # type: ignore[union-attr]
    picked = pool.dispatch_next([uid(2), uid(3), uid(4)], True)
    assert picked is not None
    assert picked[0] == uid(1)
    assert pool.health(uid(1)).state == "probing"  # type: ignore[union-attr]
    pool.finish_dispatch(uid(1), picked[3], SUCCESS)
    health = pool.health(uid(1))
    assert (health.state, health.consecutive_failures, health.success_rate) == (  # type: ignore[union-attr]
        "healthy",
        0,
        1.0,
    )
    assert pool.health_counts() == (3, 1, 0)
    kinds = [(kind, reason, seconds) for _, _, kind, reason, seconds in pool.drain_health_events()]
    assert kinds == [
        ("ejected", "failures", 1.0),
        ("ejected", "failures", 2.0),
        ("ejected", "failures", 2.5),
        ("readmitted", "", 0.0),
    ]


def test_an_old_calls_outcome_does_not_decide_the_probe() -> None:
    pool, clock = health_pool(stuck_floor=10.0)  # the old call in flight is not stuck
    _, _, old = pool.start_dispatch(uid(1))
    for _ in range(5):
        call(pool, clock, 1, FAILURE)
    clock.advance(S)
    _, _, probe = pool.start_dispatch(uid(1))
    pool.finish_dispatch(uid(1), old, SUCCESS)
    assert pool.health(uid(1)).state == "probing"  # type: ignore[union-attr]
    pool.finish_dispatch(uid(1), probe, SUCCESS)
    assert pool.health(uid(1)).state == "healthy"  # type: ignore[union-attr]


def test_times_ejected_decays_by_one_per_max_ejection_healthy() -> None:
    pool, clock = health_pool(base_ejection=1.0, max_ejection=4.0)
    for round_ in range(2):
        for _ in range(5):
            call(pool, clock, 1, FAILURE)
        clock.advance((round_ + 1) * S)
        call(pool, clock, 1, SUCCESS)  # the probe
    assert pool.health(uid(1)).times_ejected == 2  # type: ignore[union-attr]
    clock.advance(4 * S)
    assert pool.health(uid(1)).times_ejected == 1  # type: ignore[union-attr]
    for _ in range(5):
        call(pool, clock, 1, FAILURE)
    assert pool.health(uid(1)).ejected_for == 2.0  # type: ignore[union-attr]


def test_never_more_than_the_share_ejected_and_always_one() -> None:
    pool, clock = health_pool(n=4, max_ejected_share=0.1)
    for n in (1, 2):
        for _ in range(5):
            call(pool, clock, n, FAILURE)
    assert hidden(pool, 1)
    assert not hidden(pool, 2)
    assert pool.health(uid(2)).state == "healthy"  # type: ignore[union-attr]
    assert pool.health_counts()[2] == 1
    pool20, clock20 = health_pool(n=20, max_ejected_share=0.1)
    for n in (1, 2, 3):
        for _ in range(5):
            call(pool20, clock20, n, FAILURE)
    assert [hidden(pool20, n) for n in (1, 2, 3)] == [True, True, False]


def test_refresh_keeps_health_and_eviction_forgets_it() -> None:
    pool, clock = health_pool()
    for _ in range(5):
        call(pool, clock, 1, FAILURE)
    pool.add_worker(dataclasses.replace(worker(1), version="2"), "new-conn")
    assert pool.update_worker(dataclasses.replace(worker(1), version="3"), "newer-conn")
    assert hidden(pool, 1)
    assert pool.health(uid(1)).times_ejected == 1  # type: ignore[union-attr]
    assert pool.pooled(uid(1)) == (dataclasses.replace(worker(1), version="3"), "newer-conn")
    pool.remove_worker(worker(1))
    assert pool.health(uid(1)) is None
    assert pool.pooled(uid(1)) is None
    assert pool.health_counts() == (1, 0, 0)
    pool.add_worker(worker(1), "back")
    assert not hidden(pool, 1)
    assert pool.health(uid(1)).state == "healthy"  # type: ignore[union-attr]
    assert pool.health(uid(1)).times_ejected == 0  # type: ignore[union-attr]
    # the slot freed by the eviction serves another ejection
    for _ in range(5):
        call(pool, clock, 2, FAILURE)
    assert hidden(pool, 2)


@pytest.mark.parametrize(
    "balancer",
    [
        RoundRobinLoadBalancer(),
        LeastLoadedLoadBalancer(random.Random(7)),
        WeightedRoundRobinLoadBalancer(),
        AffinityLoadBalancer(),
    ],
    ids=type,
)
def test_no_balancer_is_offered_an_ejected_worker(balancer: Any) -> None:
    pool, clock = health_pool(n=5, max_ejected_share=0.4)
    for n in (2, 4):
        for _ in range(5):
            call(pool, clock, n, FAILURE)
    offered = set()
    for key in range(200):
        tried: dict[uuid.UUID, None] = {}
        while (pick := balancer.select(f"task-{key}", context=pool, tried=tried)) is not None:
            offered.add(pick)
            tried[pick] = None
        assert set(tried) == {uid(1), uid(3), uid(5)}
    assert offered == {uid(1), uid(3), uid(5)}
    clock.advance(S)  # on probation: offered again
    assert balancer.select("task", context=pool, tried={uid(1): None, uid(3): None, uid(5): None})


def test_less_loaded_of_positions_count_ejected_workers() -> None:
    pool, clock = health_pool(n=3)
    for _ in range(5):
        call(pool, clock, 2, FAILURE)
    # position 1 is the ejected worker 2: it stands for the next visible one, worker 3
    assert pool.less_loaded_of(1, 1) == uid(3)
    assert pool.less_loaded_of(0, 1) == uid(1)
    assert pool.less_loaded_of(3, 0) is None


def test_deadline_and_neutral_outcomes_leave_the_latency_alone() -> None:
    pool, clock = health_pool()
    call(pool, clock, 1, SUCCESS, took=2 * MS)
    call(pool, clock, 1, DEADLINE, took=500 * MS)
    call(pool, clock, 1, NEUTRAL, took=500 * MS)
    assert pool.load(uid(1)) == (0, pytest.approx(0.002))
    assert pool.health(uid(1)).consecutive_failures == 1  # type: ignore[union-attr]


def test_without_health_nothing_is_ejected_or_reported() -> None:
    pool = WorkerPool()
    pool.add_worker(worker(1), "conn-1")
    for _ in range(50):
        _, _, started = pool.start_dispatch(uid(1))
        assert pool.finish_dispatch(uid(1), started, FAILURE) is False
    assert pool.health(uid(1)) is None
    assert pool.health_counts() == (0, 0, 0)
    assert pool.drain_health_events() == []
    assert list(pool.workers) == [uid(1)]


def test_configuring_again_replaces_the_policy_and_keeps_the_state() -> None:
    pool, clock = health_pool()
    for _ in range(3):
        call(pool, clock, 1, FAILURE)
    pool.configure_health(HealthPolicy(failures=4))
    call(pool, clock, 1, FAILURE)
    assert hidden(pool, 1)


def test_bad_outcomes_and_policies_are_refused_naming_the_value() -> None:
    pool, _ = health_pool()
    _, _, started = pool.start_dispatch(uid(1))
    with pytest.raises(ValueError, match="not 4"):
        pool.finish_dispatch(uid(1), started, 4)
    with pytest.raises(TypeError, match="HealthPolicy, not dict"):
        pool.configure_health({"failures": 5})  # type: ignore[arg-type]
    for name, value in [
        ("failures", 0),
        ("failures", 2.5),
        ("success_rate", 1.5),
        ("stuck_multiple", 0.5),
        ("stuck_floor", 0.0),
        ("base_ejection", -1.0),
        ("max_ejection", 0.5),
        ("max_ejected_share", -0.1),
        ("latency_outlier", 1.0),
        ("stuck_floor", float("nan")),
    ]:
        with pytest.raises(ValueError, match=rf"HealthPolicy\.{name} must be .*not {value!r}"):
            HealthPolicy(**{name: value})
    with pytest.raises(ValueError, match="pinned clock"):
        pool._pin_clock(0)


def test_the_health_events_hold_the_worker_as_it_was() -> None:
    pool, clock = health_pool()
    for _ in range(5):
        call(pool, clock, 1, FAILURE)
    pool.remove_worker(worker(1))
    ((event_uid, metadata, kind, reason, seconds),) = pool.drain_health_events()
    assert (event_uid, metadata, kind, reason, seconds) == (
        uid(1),
        worker(1),
        "ejected",
        "failures",
        1.0,
    )
