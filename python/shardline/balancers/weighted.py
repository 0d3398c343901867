"""`WeightedRoundRobinLoadBalancer`: smooth weighted round robin (nginx's), across calls."""

from __future__ import annotations

import logging
import math
import numbers
import uuid
from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from typing import Any

from shardline.balancers.explanation import (
    NO_WORKERS,
    Candidate,
    CandidateOrder,
    Excluded,
    ordinal,
)
from shardline.balancers.per_context import PerContext
from shardline.balancers.protocol import SelectLoadBalancer, Tried
from shardline.pool.context import LoadBalancerContextView

__all__ = ["WeightedRoundRobinLoadBalancer"]

logger = logging.getLogger("shardline.balancers")

_MISSING = object()


def _weight(metadata: Any) -> float | None:
    """``metadata.extra["weight"]`` (1 when absent), or None when it is not a usable weight."""
    extra = getattr(metadata, "extra", None)
    weight = extra.get("weight", 1) if extra is not None else 1
    if isinstance(weight, bool) or not isinstance(weight, numbers.Real):
        return None
    if isinstance(weight, int):
        return weight if weight > 0 else None
    value = float(weight)
    return value if math.isfinite(value) and value > 0 else None


@dataclass
class _Scores:
    """One context's smooth-WRR scores, shared by every call on that context."""

    current: dict[uuid.UUID, float] = field(default_factory=dict)
    warned: dict[uuid.UUID, str] = field(default_factory=dict)

    def pick(
        self, candidates: Iterable[tuple[uuid.UUID, Any]], tried: Container[uuid.UUID]
    ) -> uuid.UUID | None:
        """One smooth-WRR step over the untried candidates with a usable weight."""
        best: uuid.UUID | None = None
        best_score = 0.0
        total = 0.0
        present: set[uuid.UUID] = set()
        for uid, metadata in candidates:
            present.add(uid)
            weight = _weight(metadata)
            if weight is None:
                self._warn(uid, metadata)
                self.current.pop(uid, None)
                continue
            self.warned.pop(uid, None)
            if tried and uid in tried:
                continue
            score = self.current.get(uid, 0) + weight
            self.current[uid] = score
            total += weight
            if best is None or score > best_score:  # a tie goes to the earlier-admitted worker
                best, best_score = uid, score
        for gone in [uid for uid in self.current if uid not in present]:
            del self.current[gone]  # a worker that rejoins starts again at 0
        for gone in [uid for uid in self.warned if uid not in present]:
            del self.warned[gone]
        if best is not None:
            self.current[best] -= total
        return best

    def _warn(self, uid: uuid.UUID, metadata: Any) -> None:
        extra = getattr(metadata, "extra", None)
        raw = repr(extra.get("weight", _MISSING) if extra is not None else _MISSING)
        if self.warned.get(uid) != raw:
            self.warned[uid] = raw
            logger.warning(
                "worker %s skipped by the weighted balancer: weight %s is not a positive number",
                uid,
                raw,
            )


def _step(
    current: dict[uuid.UUID, float],
    weighted: Iterable[tuple[uuid.UUID, float]],
    tried: Container[uuid.UUID],
) -> tuple[uuid.UUID | None, float, int]:
    """One smooth-WRR step over the untried ``(uid, weight)``: adds each one's weight to its
    score in ``current``, takes the sum from the winner's; returns the winner, its score
    before the subtraction and how many took part.

    Implementation notes:
        The step of :meth:`_Scores.pick`, which does it inline while it reads the pool, so that
        ``select`` pays for no extra call or list; explanations replay it on a copy of the
        scores. A test checks that the two agree (test_proxy_explain_model.py).
    """
    best: uuid.UUID | None = None
    best_score = 0.0
    total = 0.0
    entrants = 0
    for uid, weight in weighted:
        if tried and uid in tried:
            continue
        score = current.get(uid, 0) + weight
        current[uid] = score
        total += weight
        entrants += 1
        if best is None or score > best_score:  # a tie goes to the earlier-admitted worker
            best, best_score = uid, score
    if best is not None:
        current[best] -= total
    return best, best_score, entrants


class WeightedRoundRobinLoadBalancer(SelectLoadBalancer):
    """Offers the context's workers in smooth weighted round-robin order, across calls.

    A worker's weight is ``metadata.extra["weight"]`` (1 when absent; any positive finite
    ``int`` or real number). Over any run of successful calls each worker serves its share of
    the total weight, interleaved rather than in bursts: weights 5, 1, 1 give ``a a b a c a a``
    per seven calls. A worker whose weight is zero, negative, not finite or not a number (a
    ``bool`` included) is never offered, and a warning is logged on the
    ``shardline.balancers`` logger once per worker and weight value. With equal weights the
    order is plain round robin in admission order.

    A call ends when the task succeeds, or once every eligible pooled worker has been offered,
    so it offers each worker at most once: after a failure it offers the next worker in
    smooth-WRR order among those not yet offered. Concurrent calls on the same context share
    the scores. A worker that has left the pool is skipped; one that joins (or rejoins) starts
    with a score of 0; a refreshed weight applies from the next pick. Works with any context
    that has a ``workers`` mapping.

    Implementation notes:
        nginx's algorithm (``ngx_http_upstream_get_peer``): each pick adds every untried
        candidate's weight to its current score, picks the highest (a tie goes to the earlier
        admitted), and subtracts the sum of those weights from the winner. Each pick reads the
        pool afresh, so it costs O(n) in the pool's size. Scores are kept per context in a
        ``PerContext``: held weakly, dropped when the balancer is pickled.
    """

    needs_load = False

    def __init__(self) -> None:
        self._scores = PerContext(_Scores)

    def select(
        self, task: Any, *, context: LoadBalancerContextView, tried: Tried
    ) -> uuid.UUID | None:
        """The next smooth-WRR pick among the untried; see :mod:`shardline.balancers.protocol`."""
        return self._scores.of(context).pick(_candidates(context), tried)

    def explain_candidates(self, task: Any, *, context: LoadBalancerContextView) -> CandidateOrder:
        """The smooth-WRR order from the scores as they stand, each worker's weight and score,
        and the workers whose weight excludes them; the scores are not changed (see
        :mod:`shardline.balancers.explanation`)."""
        scores = self._scores.peek(context)
        current = dict(scores.current) if scores is not None else {}
        records: dict[uuid.UUID, Any] = {}
        weighted: list[tuple[uuid.UUID, float]] = []
        excluded: list[Excluded] = []
        for uid, metadata in _candidates(context):
            weight = _weight(metadata)
            if weight is None:
                raw = metadata.extra.get("weight")  # only a weight given can be unusable
                excluded.append(Excluded(uid, f"weight {raw!r} is not a positive number", metadata))
                continue
            records[uid] = metadata
            weighted.append((uid, weight))
        weights = dict(weighted)
        candidates: list[Candidate] = []
        offered: set[uuid.UUID] = set()
        while True:
            best, score, entrants = _step(current, weighted, offered)
            if best is None:
                break
            offered.add(best)
            n = len(candidates) + 1
            rank = "next" if n == 1 else ordinal(n)
            among = f"highest of {entrants} untried" if entrants > 1 else "the only one left"
            candidates.append(
                Candidate(
                    best,
                    f"{rank} in smooth weighted round robin: weight {weights[best]:g},"
                    f" score {score:g} ({among})",
                    records[best],
                )
            )
        why_none = None
        if not candidates:
            why_none = "no pooled worker has a usable weight" if excluded else NO_WORKERS
        return CandidateOrder(tuple(candidates), tuple(excluded), why_none)


def _candidates(context: Any) -> Iterable[tuple[uuid.UUID, Any]]:
    """The pooled ``(uid, metadata)`` pairs, in admission order."""
    workers = context.workers
    for uid in list(workers):
        try:
            metadata, _ = workers[uid]
        except KeyError:  # evicted since the snapshot
            continue
        yield uid, metadata
