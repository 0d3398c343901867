"""A reference model of the pool's rotation, which the round-robin balancer (through either
protocol, and its native select) and the pool's own rotation are checked against, and the
steps they are driven through (:func:`operations`, applied by :func:`changed`)."""

from __future__ import annotations

import uuid
from collections.abc import Collection
from typing import Any

from hypothesis import strategies as st

from support.workers import worker


class RotationModel:
    """The documented rotation of a pool: a cursor over the admission order. An admitted worker
    takes the next place (a refresh keeps its place); an evicted one leaves a hole, and holes at
    the end are dropped, and a cursor that stood among them (or past them) goes back to the
    start. A call takes the first pooled worker it has not offered, from the
    cursor on and round to it, and moves the cursor past it; it gives up, leaving the cursor,
    once it has offered every pooled worker."""

    def __init__(self) -> None:
        self.places: list[uuid.UUID | None] = []
        self.cursor = 0

    def admit(self, uid: uuid.UUID) -> None:
        if uid not in self.places:
            self.places.append(uid)

    def evict(self, uid: uuid.UUID) -> None:
        if uid in self.places:
            self.places[self.places.index(uid)] = None
        places = len(self.places)
        while self.places and self.places[-1] is None:
            self.places.pop()
        if len(self.places) < places and self.cursor >= len(self.places):
            self.cursor = 0

    def select(self, tried: Collection[uuid.UUID]) -> uuid.UUID | None:
        start = self.cursor if self.cursor < len(self.places) else 0
        for place in [*range(start, len(self.places)), *range(start)]:
            uid = self.places[place]
            if uid is not None and uid not in tried:
                self.cursor = place + 1
                return uid
        return None


def operations(workers: range) -> st.SearchStrategy[list[tuple[str, int]]]:
    """Up to 80 steps for a pool and its model: ``admit``, ``evict`` or ``refresh`` a worker
    (its ``n`` in ``workers``), or ``pick`` the next in the rotation (with a byte: a bit per
    worker, for the tests that say which were tried)."""
    return st.lists(
        st.one_of(
            st.tuples(
                st.sampled_from(["admit", "evict", "refresh"]), st.integers(workers[0], workers[-1])
            ),
            st.tuples(st.just("pick"), st.integers(0, 255)),
        ),
        max_size=80,
    )


def changed(pool: Any, model: RotationModel, kind: str, n: int) -> bool:
    """Applies an ``admit``, ``evict`` or ``refresh`` (a new record, the same place) of worker
    ``n`` to ``pool`` and ``model`` alike; False, changing nothing, for a ``pick``."""
    if kind == "admit":
        pool.add_worker(worker(n), f"conn-{n}")
        model.admit(worker(n).uid)
    elif kind == "evict":
        pool.remove_worker(worker(n))
        model.evict(worker(n).uid)
    elif kind == "refresh":
        pool.update_worker(worker(n, pid=n + 1), f"conn-{n}-b")
    else:
        return False
    return True
