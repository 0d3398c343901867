"""The connection churn bound (`AcceptGate`'s two token buckets) and the throttled log
(`LogThrottle`) against small reference models, on a clock the test moves: whether the
worker accepts after any sequence of accepts, violations and waits, and which lines come out
of any sequence of log lines and waits. tests/transport/test_msgpack_bounds.py shows both on
a real worker process."""

from __future__ import annotations

import heapq
import itertools
import logging
import socket
from collections.abc import Callable, Coroutine
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardline.transport.limits import WorkerLimits
from shardline.transport.log_throttle import LogThrottle
from shardline.transport.msgpack.churn import _RESUME_SECONDS, _ROUNDING, AcceptGate

# Timers due within this of the clock run: a pause ends when a bucket refills to its mark,
# which floating point may put a hair after the instant the model computes.
_EPSILON = 1e-9


class _Timer:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Clock:
    """The part of an event loop the gate and the throttle use, on a clock moved by
    :meth:`advance`; a task runs at once (the gate's reopening never waits here)."""

    def __init__(self) -> None:
        self.now = 0.0
        self._timers: list[tuple[float, int, _Timer, Callable[..., None], tuple[Any, ...]]] = []
        self._order = itertools.count()

    def time(self) -> float:
        return self.now

    def call_soon(self, callback: Callable[..., None], *args: Any) -> _Timer:
        return self.call_later(0.0, callback, *args)

    def call_later(self, delay: float, callback: Callable[..., None], *args: Any) -> _Timer:
        timer = _Timer()
        heapq.heappush(self._timers, (self.now + delay, next(self._order), timer, callback, args))
        return timer

    def create_task(self, coroutine: Coroutine[Any, Any, None]) -> None:
        with pytest.raises(StopIteration):
            coroutine.send(None)

    def advance(self, seconds: float) -> None:
        end = self.now + seconds
        while self._timers and self._timers[0][0] <= end + _EPSILON:
            when, _, timer, callback, args = heapq.heappop(self._timers)
            self.now = max(self.now, when)
            if not timer.cancelled:
                callback(*args)
        self.now = end


class FakeServer:
    """A server as the gate sees it: its listening sockets, and whether it is closed."""

    def __init__(self, sock: socket.socket) -> None:
        self.sockets = [sock]
        self.closed = False

    def close(self) -> None:
        self.closed = True
        self.sockets[0].close()

    async def wait_closed(self) -> None:
        pass


class BucketModel:
    def __init__(self, depth: int, rate: float) -> None:
        self.depth, self.rate, self.tokens = float(depth), rate, float(depth)

    def refill(self, seconds: float) -> None:
        self.tokens = min(self.depth, self.tokens + seconds * self.rate)

    def take(self) -> bool:
        self.tokens = max(-self.depth, self.tokens - 1)
        return self.tokens < 1 - _ROUNDING

    def enough(self) -> bool:
        mark = max(1.0, min(self.depth, self.rate * _RESUME_SECONDS))
        return self.tokens >= mark - max(_ROUNDING, self.rate * _EPSILON)


def _quiet_log() -> LogThrottle:
    quiet = logging.getLogger("test_churn_model.quiet")
    quiet.disabled = True
    return LogThrottle(quiet, cast(Any, Clock()), 10.0)


# (kind, how many at once) for accepts and violations (a burst can run a bucket into its
# debt's floor), (wait, seconds)
events = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["accepted", "violation"]), st.integers(1, 25)),
        st.tuples(st.just("wait"), st.sampled_from([0.001, 0.01, 0.05, 0.1, 0.3, 1.0, 3.0])),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(
    events=events,
    accept=st.tuples(st.integers(1, 30), st.sampled_from([0.5, 2.0, 7.0, 40.0, 500.0])),
    violation=st.tuples(st.integers(1, 10), st.sampled_from([0.25, 1.0, 5.0, 30.0])),
)
def test_the_gate_accepts_when_the_buckets_model_says_so(
    events: list[tuple[str, float]], accept: tuple[int, float], violation: tuple[int, float]
) -> None:
    # (for accepts and violations, the number is how many come at once)
    limits = WorkerLimits(
        accept_burst=accept[0],
        accept_rate=accept[1],
        violation_burst=violation[0],
        violation_rate=violation[1],
    )
    clock = Clock()
    gate = AcceptGate(cast(Any, clock), limits, _quiet_log())
    reopened: list[FakeServer] = []

    async def reserve(sock: socket.socket) -> Any:
        reopened.append(FakeServer(sock))
        return cast(Any, reopened[-1])

    first = FakeServer(socket.socket())
    gate.attach(cast(Any, first), reserve)
    buckets = {"accepted": BucketModel(*accept), "violation": BucketModel(*violation)}
    paused, pauses, violations = False, 0, 0
    try:
        for kind, seconds in events:
            if kind == "wait":
                clock.advance(seconds)
                for bucket in buckets.values():
                    bucket.refill(seconds)
                if paused and all(bucket.enough() for bucket in buckets.values()):
                    paused = False
            else:
                for _ in range(int(seconds)):
                    if kind == "violation":
                        violations += 1
                        gate.violation()
                    else:
                        gate.accepted()
                    if buckets[kind].take() and not paused:
                        paused, pauses = True, pauses + 1
            clock.advance(0.0)  # (a pause closes its server once the callback returns)
            assert gate.paused == paused
            assert (gate.pauses, gate.violations) == (pauses, violations)
            # accepting: exactly one server open; paused: none
            servers = [first, *reopened]
            assert sum(not server.closed for server in servers) == (0 if paused else 1)
    finally:
        gate.close()
    assert all(server.closed for server in [first, *reopened])


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.said: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.said.append(record.getMessage())


class ThrottleModel:
    """Per kind with an interval open: when it ends (and, for ends at one instant, in which
    order they come), how many lines it counted, and the last one's argument."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.now = 0.0
        self.open: dict[str, list[Any]] = {}  # kind: [end, order, suppressed, last]
        self.order = itertools.count()
        self.said: list[str] = []

    def advance(self, seconds: float) -> None:
        end = self.now + seconds
        while True:
            due = [(held[0], held[1], kind) for kind, held in self.open.items()]
            due = [each for each in due if each[0] <= end + _EPSILON]
            if not due:
                break
            when, _, kind = min(due)
            held = self.open[kind]
            if held[2]:
                self.said.append(self._summary(kind, held))
                held[0], held[1], held[2] = when + self.interval, next(self.order), 0
            else:
                del self.open[kind]
        self.now = end

    def log(self, kind: str, argument: int) -> None:
        held = self.open.get(kind)
        if held is None:
            self.said.append(kind % argument)
            self.open[kind] = [self.now + self.interval, next(self.order), 0, argument]
        else:
            held[2] += 1
            held[3] = argument

    def close(self) -> None:
        for kind, held in self.open.items():
            if held[2]:
                self.said.append(self._summary(kind, held))
        self.open.clear()

    def _summary(self, kind: str, held: list[Any]) -> str:
        return f"... and {held[2]} more like it within {self.interval:g} s, the last: " + (
            kind % held[3]
        )


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("log"), st.sampled_from(["closing %d", "refused %d"])),
            st.tuples(st.just("wait"), st.sampled_from([0.1, 0.5, 1.0, 1.5, 2.5])),
        ),
        max_size=80,
    )
)
def test_the_throttled_log_says_what_its_model_says(steps: list[tuple[str, Any]]) -> None:
    logger = logging.getLogger("test_churn_model.throttled")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    lines = Lines()
    logger.addHandler(lines)
    try:
        clock = Clock()
        throttle = LogThrottle(logger, cast(Any, clock), 1.0)
        model = ThrottleModel(1.0)
        for number, (kind, what) in enumerate(steps):
            if kind == "wait":
                clock.advance(what)
                model.advance(what)
            else:
                throttle.log(logging.WARNING, what, number)
                model.log(what, number)
            assert lines.said == model.said
        throttle.close()
        model.close()
        assert lines.said == model.said
    finally:
        logger.removeHandler(lines)
