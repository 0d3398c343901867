"""``Deadlines`` against a reference model: every item expires once its deadline has passed
unless it ended first, never before, never twice, whatever the order of adds, ends and time."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardline.transport.deadlines import Deadlines


class FakeLoop:
    """``time()`` and ``call_at()``, with time moved by the test: due timers run in order."""

    def __init__(self) -> None:
        self.now = 0.0
        self._timers: list[tuple[float, int, FakeTimer]] = []
        self._order = itertools.count()

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], None]) -> FakeTimer:
        timer = FakeTimer(callback)
        heapq.heappush(self._timers, (when, next(self._order), timer))
        return timer

    def advance(self, seconds: float) -> None:
        target = self.now + seconds
        while self._timers and self._timers[0][0] <= target:
            when, _, timer = heapq.heappop(self._timers)
            self.now = max(self.now, when)
            if not timer.cancelled:
                timer.callback()
        self.now = target

    @property
    def armed(self) -> int:
        return sum(1 for _, _, timer in self._timers if not timer.cancelled)


class FakeTimer:
    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


steps = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.floats(0, 10)),
        st.tuples(st.just("end"), st.integers(0, 200)),
        st.tuples(st.just("advance"), st.floats(0, 5)),
    ),
    max_size=300,
)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_items_expire_once_after_their_deadline_unless_they_ended(history: list[Any]) -> None:
    loop = FakeLoop()
    ended: set[int] = set()
    expired: list[int] = []
    deadlines: Deadlines[int] = Deadlines(loop, expired.append, ended.__contains__)  # type: ignore[arg-type]
    due: dict[int, float] = {}  # the model: item -> its deadline, while pending
    for kind, value in history:
        if kind == "add":
            item = len(due) + len(ended) + len(expired)
            due[item] = loop.now + value
            deadlines.add(loop.now + value, item)
        elif kind == "end":
            if due:
                item = sorted(due)[value % len(due)]
                del due[item]
                ended.add(item)
        else:
            before = set(expired)
            loop.advance(value)
            newly = [item for item in expired if item not in before]
            should = {item for item, when in due.items() if when <= loop.now}
            assert set(newly) == should
            assert len(newly) == len(set(newly))
            for item in should:
                del due[item]
        assert loop.armed <= 1
        assert not (set(expired) & ended)
    deadlines.close()
    loop.advance(100)
    assert set(expired).isdisjoint(due)


@pytest.mark.parametrize("pending", [0, 1, 500])
def test_the_entries_kept_stay_within_a_constant_factor_of_the_pending_calls(
    pending: int,
) -> None:
    loop = FakeLoop()
    ended: set[int] = set()
    deadlines: Deadlines[int] = Deadlines(loop, lambda item: None, ended.__contains__)  # type: ignore[arg-type]
    for item in range(pending):
        deadlines.add(30.0, -1 - item)  # calls that stay in flight throughout
    most = 0
    for item in range(100_000):
        deadlines.add(20.0, item)  # every other call ends long before its deadline
        ended.add(item)
        most = max(most, len(deadlines._added) + len(deadlines._heap))
    assert most <= 3 * pending + 2 * 64


def test_calls_that_end_before_the_next_sweep_never_reach_the_heap() -> None:
    """At one call in flight, only the call in flight at the last sweep is in the heap."""
    loop = FakeLoop()
    ended: set[int] = set()
    deadlines: Deadlines[int] = Deadlines(loop, lambda item: None, ended.__contains__)  # type: ignore[arg-type]
    for item in range(1_000):
        deadlines.add(20.0, item)
        assert len(deadlines._heap) <= 1
        ended.add(item)
