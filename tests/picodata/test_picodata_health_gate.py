"""The Picodata client reports an instance's queries to its health registry only while the
instance is watched (``Client._report_start`` / ``Client._finish``); against a reference
registry told every query, the instance goes through the same states (Hypothesis)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from shardline.picodata import connect
from shardline.picodata.client import HEALTH_POLICY
from shardline.pool import HealthPolicy, WorkerPool

SUCCESS, FAILURE, DEADLINE, NEUTRAL = (
    WorkerPool.OUTCOME_SUCCESS,
    WorkerPool.OUTCOME_FAILURE,
    WorkerPool.OUTCOME_DEADLINE,
    WorkerPool.OUTCOME_NEUTRAL,
)
START_NS = 10**12


@dataclass
class FakePool:
    """What the client's health code reads of an ``InstancePool``."""

    uid: uuid.UUID = field(default_factory=uuid.uuid4)
    uuid: str = "instance"
    label: str = "instance"
    address: str = "127.0.0.1:1"
    watched: bool = False


# a query's outcome as the client classifies it; or time passing, in ms
steps = st.lists(
    st.one_of(
        st.sampled_from([SUCCESS, FAILURE, DEADLINE, NEUTRAL]),
        st.integers(min_value=1, max_value=40_000).map(lambda ms: ("advance", ms)),
    ),
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(steps=steps, success_rate_rule=st.booleans())
def test_the_watched_gate_keeps_the_registrys_states(
    steps: list[int | tuple[str, int]], success_rate_rule: bool
) -> None:
    # without the success-rate rule both sides must agree exactly; with it, the gate's rate
    # may be lower by at most 0.001, which can move a decision taken at the threshold
    policy = (
        HEALTH_POLICY
        if success_rate_rule
        else HealthPolicy(success_rate=0.0, stuck_floor=1e9, latency_outlier=1e9)
    )
    client = connect("postgresql://u@127.0.0.1:1/db", tier="default")
    registry = client._health
    registry.configure_health(policy)
    reference = WorkerPool()
    reference.configure_health(policy)
    pool = FakePool()
    # a second instance: the share cap (10%, always one) lets this one be ejected
    other = FakePool()
    for side in (registry, reference):
        side.add_worker(pool, pool)
        side.add_worker(other, other)
    now = START_NS
    for step in steps:
        if isinstance(step, tuple):
            now += step[1] * 1_000_000
            continue
        for side in (registry, reference):
            side._pin_clock(now)
        # the client: the hot path for an instance not watched, else the slow path
        started = client._report_start(pool) if pool.watched else 0
        if step != SUCCESS or started:
            client._finish(pool, started, step)
        # the reference: every query handed to the instance, reported
        try:
            reference_started = reference.start_dispatch(pool.uid)[2]
        except KeyError:
            reference_started = 0
        if reference_started:
            reference.finish_dispatch(pool.uid, reference_started, step)
        mine, theirs = registry.health(pool.uid), reference.health(pool.uid)
        assert mine is not None
        assert theirs is not None
        if not pool.watched:  # what the hot path relies on
            assert mine.state == "healthy"
            assert mine.consecutive_failures == 0
            assert mine.success_rate >= 0.999
        assert theirs.success_rate - 0.001 <= mine.success_rate <= theirs.success_rate
        if "success-rate" in (mine.reason, theirs.reason):
            return  # a decision at the threshold: the sides may part from here on
        assert (mine.state, mine.consecutive_failures, mine.times_ejected) == (
            theirs.state,
            theirs.consecutive_failures,
            theirs.times_ejected,
        )
        assert registry.health_counts() == reference.health_counts()
