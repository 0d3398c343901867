"""The pool's passive health (issue 25, bullet 3) against a reference model of its rules.

A Hypothesis state machine admits, refreshes and evicts workers, starts dispatches (through
``start_dispatch``, ``dispatch_next`` counted or not, ``begin_dispatch``), finishes them with
every outcome (a token dispatch by letting its token go, and reporting any outcome but a
success), moves the pool's pinned clock, and after every step compares each read a
balancer makes (the ``workers`` view and its keys, values and items, ``uids``, ``entry``,
``load``, ``rotation_order``, ``less_loaded_of``), the pool's membership (``len``, ``in``,
``pooled``, ``members``), every worker's ``health``, ``health_counts`` and the events queue
with the model's.
"""

from __future__ import annotations

import dataclasses
import math
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from shardline import WorkerMetadata, WorkerPool
from shardline.pool.health import HealthPolicy
from support.least_loaded_model import POOL_WEIGHT, blend, cost, weighed_latency
from support.rotation_model import RotationModel
from support.workers import worker

SUCCESS, FAILURE, DEADLINE, NEUTRAL = 0, 1, 2, 3
START = 10**12
MS = 1_000_000


@dataclass
class Worker:
    """One pooled worker as the model keeps it."""

    record: WorkerMetadata
    state: str = (
        "healthy"  # "healthy", "ejected" (until `at`), "probing" (its probe started at `at`)
    )
    at: int = 0
    consecutive: int = 0
    success: float = 1.0
    times: int = 0
    reason: str = ""
    progress: int = 0
    healthy_since: int = 0
    inflight: int = 0
    latency: float | None = None
    sampled: int = 0  # when the last latency sample came
    # token dispatches: in flight, handed out, reported as not succeeding, counted as successes
    tokens: int = 0
    token_handed: int = 0
    token_missed: int = 0
    token_counted: int = 0
    # whether a check last saw it with nothing in flight
    idle: bool = True
    # native dispatches to it while every worker was healthy, uncounted: which are timed
    turns: int = 0
    # which entry of the uid this is: a token dispatch ends on the entry that handed it out
    incarnation: int = 0


@dataclass
class Model:
    """The health rules as ``docs/architecture.md`` ("Passive health") states them."""

    policy: HealthPolicy
    now: int = START
    workers: dict[uuid.UUID, Worker] = field(default_factory=dict)
    rotation: RotationModel = field(default_factory=RotationModel)
    unhealthy: int = 0
    last_scan: int = 0
    last_outlier: int = 0
    ejections: int = 0
    readmissions: int = 0
    mean: float | None = None  # the pool's mean latency
    events: list[tuple[uuid.UUID, str, str, float]] = field(default_factory=list)

    # -- reads

    def visible(self, w: Worker) -> bool:
        if w.state == "healthy":
            return True
        return w.state == "ejected" and self.now >= w.at

    def order(self) -> list[uuid.UUID]:
        """Pooled uids in admission order."""
        return [uid for uid in self.rotation.places if uid is not None]

    def shown(self) -> list[uuid.UUID]:
        return [uid for uid in self.order() if self.visible(self.workers[uid])]

    def rotation_order(self) -> list[uuid.UUID]:
        places = self.rotation.places
        start = self.rotation.cursor if self.rotation.cursor < len(places) else 0
        ordered = [places[i] for i in [*range(start, len(places)), *range(start)]]
        return [uid for uid in ordered if uid is not None and self.visible(self.workers[uid])]

    def load(self, w: Worker) -> tuple[int, float]:
        return (w.inflight + w.tokens, weighed_latency(w.latency, w.sampled, self.now, self.mean))

    def times_ejected(self, w: Worker) -> int:
        if w.state != "healthy" or w.times == 0:
            return w.times
        decay = max(0, self.now - w.healthy_since) // max(int(self.policy.max_ejection * 1e9), 1)
        return max(0, w.times - decay)

    def health(self, w: Worker) -> tuple[Any, ...]:
        if w.state == "healthy":
            state = "healthy"
        elif w.state == "probing":
            state = "probing"
        else:
            state = "probation" if self.now >= w.at else "ejected"
        left = (w.at - self.now) * 1e-9 if state == "ejected" else 0.0
        return (
            state,
            w.consecutive,
            w.inflight + w.tokens,
            0.0 if w.latency is None else w.latency,
            w.success,
            self.times_ejected(w),
            left,
            w.reason,
        )

    def less_loaded_of(self, first: int, second: int) -> uuid.UUID | None:
        order = self.order()
        if first >= len(order) or second >= len(order):
            return None

        def visible_from(position: int) -> uuid.UUID | None:
            for step in range(len(order)):
                uid = order[(position + step) % len(order)]
                if self.visible(self.workers[uid]):
                    return uid
            return None

        a, b = visible_from(first), visible_from(second)
        if a is None or b is None:
            return None
        return a if cost(self.load(self.workers[a])) <= cost(self.load(self.workers[b])) else b

    # -- transitions

    def stuck(self, w: Worker) -> bool:
        if w.inflight + w.tokens == 0 or w.latency is None:
            return False
        threshold = max(self.policy.stuck_floor, self.policy.stuck_multiple * w.latency)
        return max(0, self.now - w.progress) * 1e-9 > threshold

    def eject(self, uid: uuid.UUID, reason: str) -> bool:
        w = self.workers[uid]
        if w.state == "healthy":
            cap = max(1, math.floor(self.policy.max_ejected_share * len(self.workers)))
            if self.unhealthy >= cap:
                event("over the cap")
                return False
            self.unhealthy += 1
        elif w.state != "probing":
            return False
        times = self.times_ejected(w) + 1
        seconds = min(self.policy.base_ejection * times, self.policy.max_ejection)
        w.state, w.at = "ejected", self.now + int(seconds * 1e9)
        w.times, w.reason = times, reason
        self.ejections += 1
        event(f"ejected: {reason}")
        self.events.append((uid, "ejected", reason, seconds))
        return True

    def check_stuck(self, uid: uuid.UUID) -> bool:
        w = self.workers[uid]
        if w.state == "ejected":
            return False
        if w.inflight + w.tokens == 0:
            w.idle = True
            return False
        if w.idle:
            # busy since the last check saw it idle: that is its progress
            w.idle, w.progress = False, self.now
            return False
        return self.stuck(w) and self.eject(uid, "stuck")

    def hand_out(self, uid: uuid.UUID, probe: bool) -> bool:
        w = self.workers[uid]
        if probe and w.state == "ejected":  # visible, so on probation
            event("probe")
            w.state, w.at = "probing", self.now
        self.settle(uid)
        return not self.check_stuck(uid)

    def begin(self, w: Worker) -> None:
        if w.inflight + w.tokens == 0:
            w.progress, w.idle = self.now, False
        w.inflight += 1

    def settle(self, uid: uuid.UUID) -> None:
        """Counts the token dispatches that succeeded since the last count."""
        w = self.workers[uid]
        done = max(0, w.token_handed - w.tokens - w.token_missed)
        if done > w.token_counted:
            event("token successes counted")
            count, w.token_counted = done - w.token_counted, done
            self.succeeded(uid, count, probe=False)

    def succeeded(self, uid: uuid.UUID, count: int, probe: bool) -> None:
        w = self.workers[uid]
        w.progress = self.now
        w.consecutive = 0
        w.success = 1.0 - (1.0 - w.success) * 0.9**count
        unstuck = w.state == "ejected" and w.reason == "stuck"
        if unstuck:
            w.times = max(0, w.times - 1)
        if probe or unstuck:
            w.state, w.at = "healthy", 0
            w.success, w.healthy_since = 1.0, self.now
            self.unhealthy -= 1
            self.readmissions += 1
            event("readmitted")
            self.events.append((uid, "readmitted", "", 0.0))

    def end(self, w: Worker, seconds: float) -> None:
        w.inflight = max(0, w.inflight - 1)
        w.latency = seconds if w.latency is None else w.latency + 0.2 * (seconds - w.latency)
        w.sampled = self.now
        self.mean = blend(self.mean, seconds, POOL_WEIGHT)

    def average(self, w: Worker, sample: float) -> float:
        w.success = w.success + 0.1 * (sample - w.success)
        return w.success

    def finish(self, uid: uuid.UUID, started: int, outcome: int) -> None:
        w = self.workers.get(uid)
        if w is None:
            return
        seconds = max(0, self.now - started) * 1e-9
        timed = started != 0
        if not timed:
            if outcome != SUCCESS:
                w.token_missed += 1
        elif outcome in (SUCCESS, FAILURE):
            self.end(w, seconds)
        else:
            w.inflight = max(0, w.inflight - 1)
        self.settle(uid)
        probe = w.state == "probing" and w.at == started
        if outcome == SUCCESS:
            if timed:
                self.succeeded(uid, 1, probe)
        elif outcome in (FAILURE, DEADLINE):
            w.consecutive += 1
            success = self.average(w, 0.0)
            if probe:
                self.eject(uid, "failures")
            elif w.state == "healthy":
                if w.consecutive >= self.policy.failures:
                    self.eject(uid, "failures")
                elif success < self.policy.success_rate:
                    self.eject(uid, "success-rate")
        elif probe:
            w.state, w.at = "ejected", self.now
        self.check_all()

    def check_all(self) -> None:
        if self.now - self.last_scan >= int(self.policy.stuck_floor * 1e9) // 2:
            self.last_scan = self.now
            for uid in self.order():
                self.settle(uid)
                self.check_stuck(uid)
        if self.now - self.last_outlier >= 100 * MS:
            self.last_outlier = self.now
            estimated = [
                (uid, w.latency)
                for uid in self.order()
                if self.visible(w := self.workers[uid]) and w.latency is not None
            ]
            if len(estimated) < 3:
                return
            latencies = sorted(latency for _, latency in estimated)
            half = len(latencies) // 2
            middle = (
                latencies[half]
                if len(latencies) % 2
                else (latencies[half - 1] + latencies[half]) / 2.0
            )
            bound = self.policy.latency_outlier * middle
            for uid, latency in estimated:
                if (
                    latency > bound
                    and latency > self.policy.stuck_floor
                    and self.workers[uid].state == "healthy"
                ):
                    self.eject(uid, "latency")

    def remove(self, uid: uuid.UUID) -> None:
        if self.workers.pop(uid).state != "healthy":
            self.unhealthy -= 1
        self.rotation.evict(uid)


policies = st.builds(
    HealthPolicy,
    failures=st.integers(1, 4),
    success_rate=st.sampled_from([0.0, 0.6, 0.85]),
    stuck_multiple=st.sampled_from([1.0, 8.0]),
    stuck_floor=st.sampled_from([0.004, 0.02]),
    base_ejection=st.sampled_from([0.05, 1.0]),
    max_ejection=st.sampled_from([1.0, 3.0]),
    max_ejected_share=st.sampled_from([0.0, 0.34, 0.5, 1.0]),
    latency_outlier=st.sampled_from([2.0, 5.0]),
)


class HealthMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pool = WorkerPool()
        self.pool._pin_clock(START)
        self.model: Model
        self.admitted = 0
        self.records: dict[uuid.UUID, WorkerMetadata] = {}
        # dispatches that report an outcome: (uid, started)
        self.calls: list[tuple[uuid.UUID, int]] = []
        # token dispatches in flight: (uid, the entry's incarnation, the token)
        self.tokens: list[tuple[uuid.UUID, int, object]] = []
        self.incarnations = 0

    @initialize(policy=policies, n=st.integers(0, 5))
    def configure(self, policy: HealthPolicy, n: int) -> None:
        self.model = Model(policy)
        for _ in range(n):
            self.admit()
        self.pool.configure_health(policy)

    # -- membership

    @rule()
    def admit(self) -> None:
        self.admitted += 1
        record = worker(self.admitted)
        self.records[record.uid] = record
        self.pool.add_worker(record, f"conn-{self.admitted}")
        self.model.workers[record.uid] = self.new_worker(record)
        self.model.rotation.admit(record.uid)

    def new_worker(self, record: WorkerMetadata) -> Worker:
        self.incarnations += 1
        return Worker(record, incarnation=self.incarnations)

    @precondition(lambda self: self.model.workers)
    @rule(data=st.data(), through_update=st.booleans())
    def refresh(self, data: st.DataObject, through_update: bool) -> None:
        uid = data.draw(st.sampled_from(self.model.order()))
        record = dataclasses.replace(self.model.workers[uid].record, version="2")
        if through_update:
            assert self.pool.update_worker(record, "refreshed")
        else:
            self.pool.add_worker(record, "refreshed")
        self.model.workers[uid].record = record

    @precondition(lambda self: self.model.workers)
    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        uid = data.draw(st.sampled_from(self.model.order()))
        self.pool.remove_worker(self.model.workers[uid].record)
        self.model.remove(uid)

    @precondition(lambda self: len(self.records) > len(self.model.workers))
    @rule(data=st.data())
    def readmit(self, data: st.DataObject) -> None:
        """A worker evicted earlier comes back: a new entry, its health from scratch."""
        uid = data.draw(st.sampled_from(sorted(set(self.records) - set(self.model.workers))))
        self.pool.add_worker(self.records[uid], "back")
        self.model.workers[uid] = self.new_worker(self.records[uid])
        self.model.rotation.admit(uid)

    # -- dispatches

    def start_on(self, uid: uuid.UUID) -> int | None:
        """``start_dispatch(uid)`` as the model expects it; the call's start, or None."""
        model = self.model
        w = model.workers.get(uid)
        expected = w is not None and model.visible(w) and model.hand_out(uid, probe=True)
        if not expected:
            with pytest.raises(KeyError):
                self.pool.start_dispatch(uid)
            return None
        assert w is not None
        model.begin(w)
        metadata, _, started = self.pool.start_dispatch(uid)
        assert metadata is w.record
        assert started == model.now
        return int(started)

    def finish_on(self, uid: uuid.UUID, started: int, outcome: int) -> None:
        pending = self.pool.finish_dispatch(uid, started, outcome)
        self.model.finish(uid, started, outcome)
        assert pending == bool(self.model.events)

    @precondition(lambda self: self.records)
    @rule(data=st.data())
    def start(self, data: st.DataObject) -> None:
        started = self.start_on(uid := data.draw(st.sampled_from(sorted(self.records))))
        if started is not None:
            self.calls.append((uid, started))

    @precondition(lambda self: self.records)
    @rule(
        data=st.data(),
        outcome=st.sampled_from([SUCCESS, FAILURE, DEADLINE, NEUTRAL]),
        n=st.integers(1, 6),
        ms=st.sampled_from([0, 1, 5]),
    )
    def burst(self, data: st.DataObject, outcome: int, n: int, ms: int) -> None:
        """``n`` dispatches to one worker in turn, each ending with ``outcome`` after ``ms``."""
        uid = data.draw(st.sampled_from(sorted(self.records)))
        for _ in range(n):
            started = self.start_on(uid)
            if started is None:
                return
            self.advance(ms)
            self.finish_on(uid, started, outcome)

    @rule(count=st.booleans(), data=st.data())
    def dispatch_next(self, count: bool, data: st.DataObject) -> None:
        tried = data.draw(st.sets(st.sampled_from(sorted(self.records)))) if self.records else set()
        self.dispatch_one(count, tried)

    @rule(n=st.integers(1, 3 * WorkerPool.HEALTH_TIMED_EVERY), ending=st.integers(0, 3))
    def dispatch_many(self, n: int, ending: int) -> None:
        """``n`` uncounted ``dispatch_next`` in a row, as the proxy makes them, most of them
        token dispatches; after each, the oldest token dispatch in flight beyond ``ending``
        ends with a success."""
        for _ in range(n):
            self.dispatch_one(False, set())
            while len(self.tokens) > ending:
                self.end_token_at(0, SUCCESS)

    def dispatch_one(self, count: bool, tried: set[uuid.UUID]) -> None:
        model = self.model
        expected = None
        while True:
            hidden = {uid for uid in model.workers if not model.visible(model.workers[uid])}
            pick = model.rotation.select(tried | hidden)
            if pick is None:
                break
            w = model.workers[pick]
            policy = model.policy
            timed = (
                count
                or w.state != "healthy"
                or w.latency is None
                or policy.stuck_multiple * w.latency > policy.stuck_floor
            )
            if not timed:
                w.turns += 1
                timed = w.turns % WorkerPool.HEALTH_TIMED_EVERY == 0
            if not timed or model.hand_out(pick, probe=True):
                expected = pick
                break
        picked = self.pool.dispatch_next(tried, count)
        if expected is None:
            assert picked is None
            return
        assert picked is not None
        uid, metadata, _, started, token = picked
        del picked
        assert uid == expected
        w = model.workers[uid]
        assert metadata is w.record
        if timed:
            model.begin(w)
            assert started == model.now
            assert token is None
            self.calls.append((uid, started))
        else:
            event("token dispatch")
            assert started == 0
            assert token is not None
            w.tokens += 1
            w.token_handed += 1
            self.tokens.append((uid, w.incarnation, token))
        del token

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), outcome=st.sampled_from([SUCCESS, FAILURE, DEADLINE, NEUTRAL]))
    def end_token(self, data: st.DataObject, outcome: int) -> None:
        """A token dispatch ends: its caller lets the token go, then reports any outcome but a
        success (``finish_dispatch(uid, 0, outcome)``), as the proxy does."""
        self.end_token_at(data.draw(st.integers(0, len(self.tokens) - 1)), outcome)

    def end_token_at(self, index: int, outcome: int) -> None:
        # the popped entry, and with it the token, is let go here: nothing else holds it
        uid, incarnation = self.tokens.pop(index)[:2]
        w = self.model.workers.get(uid)
        if w is None or w.incarnation != incarnation:
            return  # its entry left: the token goes with it
        w.tokens -= 1
        if outcome != SUCCESS:
            self.finish_on(uid, 0, outcome)

    @precondition(lambda self: self.records)
    @rule(data=st.data())
    def next_in_rotation(self, data: st.DataObject) -> None:
        model = self.model
        tried = data.draw(st.sets(st.sampled_from(sorted(self.records))))
        hidden = {uid for uid in model.workers if not model.visible(model.workers[uid])}
        assert self.pool.next_in_rotation(tried) == model.rotation.select(tried | hidden)

    @precondition(lambda self: self.records)
    @rule(data=st.data(), milliseconds=st.sampled_from([0.0, 1.0, 30.0]))
    def begin_and_end(self, data: st.DataObject, milliseconds: float) -> None:
        """``begin_dispatch`` / ``end_dispatch``: counted, timed by the caller, no outcome."""
        uid = data.draw(st.sampled_from(sorted(self.records)))
        w = self.model.workers.get(uid)
        if w is None or not self.model.visible(w):
            with pytest.raises(KeyError):
                self.pool.begin_dispatch(uid)
            return
        assert self.pool.begin_dispatch(uid)[0] is w.record
        self.model.begin(w)
        self.pool.end_dispatch(uid, milliseconds / 1000)
        self.model.end(w, milliseconds / 1000)

    @precondition(lambda self: self.calls)
    @rule(data=st.data(), outcome=st.sampled_from([SUCCESS, FAILURE, DEADLINE, NEUTRAL]))
    def finish(self, data: st.DataObject, outcome: int) -> None:
        uid, started = self.calls.pop(data.draw(st.integers(0, len(self.calls) - 1)))
        self.finish_on(uid, started, outcome)

    @rule(ms=st.sampled_from([1, 3, 12, 50, 150, 1000, 3000]))
    def advance(self, ms: int) -> None:
        self.model.now += ms * MS
        self.pool._pin_clock(self.model.now)

    @rule()
    def drain(self) -> None:
        drained = self.pool.drain_health_events()
        expected, self.model.events = self.model.events, []
        assert [
            (uid, kind, reason, seconds) for uid, _, kind, reason, seconds in drained
        ] == expected
        for uid, metadata, *_ in drained:
            assert metadata.uid == uid

    @rule(policy=policies)
    def reconfigure(self, policy: HealthPolicy) -> None:
        self.pool.configure_health(policy)
        self.model.policy = policy
        self.model.last_scan = self.model.last_outlier = 0

    # -- reads, after every step

    @invariant()
    def balancer_reads_show_the_visible_workers(self) -> None:
        if not hasattr(self, "model"):
            return
        model, pool = self.model, self.pool
        shown = model.shown()
        view = pool.workers
        assert len(view) == len(shown)
        assert list(view) == shown
        assert pool.uids() == shown
        assert list(view.keys()) == shown
        assert [metadata for metadata, _ in view.values()] == [
            model.workers[uid].record for uid in shown
        ]
        assert [uid for uid, _ in view.items()] == shown
        assert pool.rotation_order() == model.rotation_order()
        for uid in self.records:
            w = model.workers.get(uid)
            seen = w is not None and model.visible(w)
            assert (uid in view) == seen
            assert (view.get(uid) is not None) == seen
            if seen:
                assert w is not None
                assert view[uid][0] is w.record
                assert pool.entry(uid)[0] is w.record
                assert pool.load(uid) == model.load(w)
            else:
                with pytest.raises(KeyError):
                    view[uid]
                with pytest.raises(KeyError):
                    pool.entry(uid)
                assert pool.load(uid) == (0, 0.0)
        members = len(model.workers)
        for first in range(members + 1):
            for second in range(members + 1):
                assert pool.less_loaded_of(first, second) == model.less_loaded_of(first, second)

    @invariant()
    def membership_counts_every_worker(self) -> None:
        if not hasattr(self, "model"):
            return
        model, pool = self.model, self.pool
        order = model.order()
        assert len(pool) == len(order)
        assert [uid for uid, _, _ in pool.members()] == order
        for uid in self.records:
            w = model.workers.get(uid)
            assert (uid in pool) == (w is not None)
            pooled = pool.pooled(uid)
            assert (pooled is None) == (w is None)
            if w is not None:
                assert pooled is not None
                assert pooled[0] is w.record

    @invariant()
    def health_as_modelled(self) -> None:
        if not hasattr(self, "model"):
            return
        model = self.model
        for uid, w in model.workers.items():
            health = self.pool.health(uid)
            model.settle(uid)  # a read counts the token dispatches that succeeded
            assert health is not None
            seen, expected = dataclasses.astuple(health), model.health(w)
            # the success rate moved by k successes at once is 1 - (1 - r) * 0.9**k, rounded
            # as each side's power rounds
            assert math.isclose(seen[4], expected[4], rel_tol=1e-12), uid
            assert seen[:4] + seen[5:] == expected[:4] + expected[5:], uid
        unhealthy = sum(w.state != "healthy" for w in model.workers.values())
        assert unhealthy == model.unhealthy
        assert self.pool.health_counts() == (model.ejections, model.readmissions, unhealthy)


TestHealthAgainstModel = HealthMachine.TestCase
TestHealthAgainstModel.settings = settings(max_examples=200, stateful_step_count=60, deadline=None)
