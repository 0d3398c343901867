"""`LeastLoadedLoadBalancer`: the cheaper of two workers drawn at random."""

from __future__ import annotations

import copy
import random
import uuid
from collections.abc import Callable
from typing import Any

from shardline._core import WorkerPool
from shardline.balancers.explanation import (
    NO_WORKERS,
    Candidate,
    CandidateOrder,
    ordinal,
    pooled_record,
)
from shardline.balancers.protocol import SelectLoadBalancer, Tried, native_first
from shardline.pool.context import LoadBalancerContextView

__all__ = ["LeastLoadedLoadBalancer"]


class LeastLoadedLoadBalancer(SelectLoadBalancer):
    """Offers, of two pooled workers drawn at random, the one a new dispatch expects to wait
    on least, ``latency x (dispatches in flight + 1)`` (ties: fewer in flight), then does the
    same among the workers left.

    Load comes from the context's ``load(uid)``. The pool's (which the proxy keeps) is a
    worker's latency average moved toward the pool's mean latency the longer ago it was last
    measured (halfway after 0.1 s), and the pool's mean for a worker never measured: a worker
    that was slow is offered again once its average is old, and a new worker is weighed as an
    average one until its first dispatch ends. A context without ``load`` is treated as all
    idle, which makes this a random choice. A call offers each pooled worker at most once and
    ends once it has offered them all (a worker that joins mid-call may be among the draws).
    ``rng`` makes the draws reproducible: given one, every draw is the generator's. Without
    one, on this project's pool (a :class:`~shardline.WorkerPool`), a call's first draw is
    the pool's own (it declares ``pool_least_loaded``, so :class:`~shardline.WorkerProxy`
    takes the first candidate from ``WorkerPool.dispatch_less_loaded``; see
    :mod:`shardline.balancers.protocol`), the same comparison at positions drawn as uniformly.
    It declares ``needs_load``, so the proxy counts and times every dispatch for it.

    Implementation notes:
        "Power of two choices": comparing two random candidates keeps the most loaded workers
        away from new work almost as well as scanning them all, without every caller piling
        onto the single least loaded one between two load updates. The cost multiplies
        (Finagle's and Tower's peak-EWMA balancers do the same): comparing dispatches in
        flight first, a worker 10x slower than the rest was offered whenever it had no more
        in flight than its rival, and held a caller 10x as long each time (it kept 0.72-0.79
        of what the 3 healthy workers alone serve, ``benches/RESULTS.md``); by cost it is
        offered only when its rival has about 10x its queue. Least-loaded rarely sends to a
        worker it rates slow, so that worker's average is rarely re-measured; the pool's
        ``load`` therefore ages it toward the mean (see ``weighed_latency`` in
        ``rust/core/src/pool/load.rs``), and the next dispatch it gets measures it again. The
        proxy times every dispatch for this balancer (``start_dispatch``/``finish_dispatch``),
        not one in 32 as the native round-robin path's token dispatches do, so every other
        worker's average is as fresh as its last call. On a ``WorkerPool`` a call's first
        candidate is one call into the pool (``less_loaded_of`` the two drawn positions, the
        same comparison), O(1) while no eviction left a hole in its admission order; every
        other candidate, and any other context, lists the untried workers, O(n).

        The native first pick: the proxy's per-call cost on the Python path (a ``select``
        frame, two ``randrange``, ``less_loaded_of``, ``start_dispatch``) was what bounded
        least-loaded in the gray scenario (0.86-0.89 of the three healthy workers'
        throughput in earlier sessions, against a goal of 0.9); ``dispatch_less_loaded``
        makes the draw, the comparison and the dispatch's start one call, 0.45x the
        instructions a dispatch (``benches/RESULTS.md``). Its positions come from a wyrand
        generator in the pool (``rust/core/src/pool/draws.rs``), one per pool, shared by its
        callers: a Python ``random.Random`` cannot be stepped from Rust without calling back
        into Python. A given ``rng`` therefore withdraws the declaration (its draws are the
        contract), and :meth:`explain_candidates` reads the pool's next draw
        (``next_draw``) for the first candidate when the proxy would take it natively.
    """

    needs_load = True
    pool_least_loaded = True

    def __init__(self, rng: random.Random | None = None) -> None:
        if rng is not None:
            self.pool_least_loaded = False  # the given generator makes every draw
        self._rng = rng or random.Random()

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._rng = random.Random()  # a fresh generator: the copy draws natively again

    def select(
        self, task: Any, *, context: LoadBalancerContextView, tried: Tried
    ) -> uuid.UUID | None:
        """The less loaded of two untried pooled workers drawn at random; see
        :mod:`shardline.balancers.protocol`."""
        if not tried and isinstance(context, WorkerPool):
            count = len(context)
            if count == 0:
                return None
            chosen: uuid.UUID | None = context.less_loaded_of(
                *(_two_of(self._rng, count) if count > 1 else (0, 0))
            )
            return chosen
        load: Callable[[uuid.UUID], tuple[int, float]] = getattr(context, "load", _idle)
        left = list(context.workers)
        if tried:
            left = [uid for uid in left if uid not in tried]
        if len(left) <= 1:
            return left[0] if left else None
        a, b = _two_of(self._rng, len(left))
        return left[a] if _cost(load(left[a])) <= _cost(load(left[b])) else left[b]

    def explain_candidates(self, task: Any, *, context: LoadBalancerContextView) -> CandidateOrder:
        """The draws a call would make now, each pair and the load that decided it (see
        :mod:`shardline.balancers.explanation`).

        The draws come from a copy of the random generator, so the first candidate is the one
        the next call picks unless another call draws first; the generator itself does not
        move. Where the proxy takes the first candidate natively (no ``rng`` given, on a
        ``WorkerPool``), the first pair is the pool's next draw (``next_draw``), read without
        moving the pool's generator, and a note says so. A generator that cannot be copied
        (``random.SystemRandom``) makes the draws unpredictable: the workers are then listed
        by load, and a note says so.
        """
        load: Callable[[uuid.UUID], tuple[int, float]] = getattr(context, "load", _idle)
        left = list(context.workers)
        if not left:
            return CandidateOrder((), why_none=NO_WORKERS)
        loads = {uid: load(uid) for uid in left}
        costs = {uid: _cost(loads[uid]) for uid in left}

        def shown(uid: uuid.UUID) -> str:
            in_flight, latency = loads[uid]
            return f"{in_flight} in flight, {latency * 1000:.3g} ms latency"

        try:
            rng = copy.deepcopy(self._rng)
        except (NotImplementedError, TypeError) as error:
            ranked = sorted(left, key=lambda uid: costs[uid])
            return CandidateOrder(
                tuple(
                    Candidate(uid, f"by load: {shown(uid)}", pooled_record(context, uid))
                    for uid in ranked
                ),
                notes=(f"the draws cannot be predicted ({error!r}): listed by load",),
            )
        candidates: list[Candidate] = []
        notes: tuple[str, ...] = ()
        pair = self._native_pair(context)
        if pair is not None:
            notes = ("the first pair is the pool's next draw (the proxy's native first pick)",)
        while left:
            rank = "next" if not candidates else ordinal(len(candidates) + 1)
            if len(left) == 1:
                uid, why = left[0], f"{rank}: the only one left ({shown(left[0])})"
            else:
                if pair is None:
                    a, b = _two_of(rng, len(left))
                    first, second = left[a], left[b]
                else:
                    (first, second), pair = pair, None
                if costs[first] > costs[second]:
                    first, second = second, first
                uid, rival = first, second
                why = (
                    f"{rank}: drawn twice (an ejected worker's position stands for the next"
                    f" one): {shown(uid)}"
                    if uid == rival
                    else f"{rank}: drawn with {rival}, as cheap or cheaper:"
                    f" {shown(uid)} against {shown(rival)}"
                )
            candidates.append(Candidate(uid, why, pooled_record(context, uid)))
            left.remove(uid)
        return CandidateOrder(tuple(candidates), notes=notes)

    def _native_pair(self, context: LoadBalancerContextView) -> tuple[uuid.UUID, uuid.UUID] | None:
        """The two workers (perhaps one twice) the pool's next native draw compares, when the
        proxy would take this balancer's first candidate natively; else None."""
        if native_first(self) != "pool-least-loaded" or not isinstance(context, WorkerPool):
            return None
        # each position as the pool resolves it (an ejected worker's: the next visible one)
        first, second = (context.less_loaded_of(n, n) for n in context.next_draw())
        return None if first is None or second is None else (first, second)


def _two_of(rng: random.Random, count: int) -> tuple[int, int]:
    """Two distinct positions of ``count`` (at least 2), drawn uniformly: two ``randrange``
    calls, a third of what ``rng.sample`` costs (0.48 against 1.41 µs here)."""
    first = rng.randrange(count)
    second = rng.randrange(count - 1)
    return first, second + (second >= first)


def _cost(load: tuple[int, float]) -> tuple[float, int]:
    """What a new dispatch expects to wait on a worker with ``load`` (dispatches in flight,
    latency), then fewer in flight: the order ``less_loaded_of`` compares in, to the bit."""
    in_flight, latency = load
    return latency * (in_flight + 1), in_flight


def _idle(uid: uuid.UUID) -> tuple[int, float]:
    return 0, 0.0
