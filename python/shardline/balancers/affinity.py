"""`AffinityLoadBalancer`: a task key keeps its worker (rendezvous hashing)."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from shardline.balancers.explanation import (
    NO_WORKERS,
    Candidate,
    CandidateOrder,
    ordinal,
    pooled_record,
)
from shardline.balancers.protocol import SelectLoadBalancer, Tried
from shardline.pool.context import LoadBalancerContextView

__all__ = ["AffinityLoadBalancer"]


def _key_bytes(key: object) -> bytes:
    """The bytes a key hashes as: bytes as is, ``str`` as UTF-8, anything else via ``str()``."""
    if isinstance(key, bytes | bytearray | memoryview):
        return bytes(key)
    text = key if isinstance(key, str) else str(key)
    return text.encode("utf-8", "surrogatepass")


def _score(prefix: hashlib.blake2b, uid: uuid.UUID) -> int:
    """The 64-bit rendezvous score of ``uid`` for the key hashed into ``prefix``."""
    hasher = prefix.copy()
    hasher.update(uid.bytes)
    return int.from_bytes(hasher.digest(), "big")


class AffinityLoadBalancer(SelectLoadBalancer):
    """Offers workers in an order fixed by the task's key, so a key keeps its worker.

    ``key(task)`` names the task's affinity key (default ``str``): ``bytes`` are used as they
    are, a ``str`` as its UTF-8 encoding, and any other value as its ``str()``, which must
    therefore be stable across processes (ints, UUIDs and tuples of them are; an object whose
    ``str`` shows its ``id`` is not). Each pooled worker gets a score for the key, the same in
    every process and run, and a call offers the workers in descending score order. Hence the
    same key goes to the same worker for as long as that worker is pooled; when a worker
    joins, only the keys for which it scores highest (about 1/n of them) move, all to it; when
    a worker leaves, only its keys move, each to its own runner-up. Keys spread evenly.

    A call ends when the task succeeds or once every pooled worker has been offered, so it
    offers each worker at most once; after a failure it offers the next worker by score. A
    worker that leaves mid-call is skipped; one that joins mid-call takes its place by score
    among the workers not offered yet. The balancer holds no state. Works with any context
    that has a ``workers`` mapping.

    Implementation notes:
        Rendezvous (highest-random-weight) hashing: the score of a worker is the 64-bit
        BLAKE2b digest (``digest_size=8``, big-endian) of the key's bytes followed by the 16
        bytes of the worker's uid, never Python's per-process salted ``hash()``; a tie (a
        64-bit collision) goes to the greater uid. Each candidate hashes the key once and scores
        every untried pooled worker from a copy of that state, O(n) in the pool's size (the
        first candidate needs no sort).
    """

    needs_load = False

    def __init__(self, key: Callable[[Any], object] = str) -> None:
        self._key = key

    def __repr__(self) -> str:
        return f"{type(self).__name__}(key={self._key!r})"

    def order(self, task: Any, uids: Sequence[uuid.UUID]) -> list[uuid.UUID]:
        """``uids`` in the order a call for ``task`` offers them: by descending score."""
        prefix = hashlib.blake2b(_key_bytes(self._key(task)), digest_size=8)
        return sorted(uids, key=lambda uid: (_score(prefix, uid), uid.int), reverse=True)

    def select(
        self, task: Any, *, context: LoadBalancerContextView, tried: Tried
    ) -> uuid.UUID | None:
        """The untried pooled worker with the highest score for ``task``'s key; see
        :mod:`shardline.balancers.protocol`."""
        uids = list(context.workers)
        prefix = hashlib.blake2b(_key_bytes(self._key(task)), digest_size=8)
        best: uuid.UUID | None = None
        best_score = -1
        for uid in uids:
            if tried and uid in tried:
                continue
            score = _score(prefix, uid)
            if score > best_score or (best is not None and score == best_score and uid > best):
                best, best_score = uid, score
        return best

    def explain_candidates(self, task: Any, *, context: LoadBalancerContextView) -> CandidateOrder:
        """The pooled workers by descending score for the task's key, with each score (see
        :mod:`shardline.balancers.explanation`)."""
        key = self._key(task)
        prefix = hashlib.blake2b(_key_bytes(key), digest_size=8)
        order = self.order(task, list(context.workers))
        candidates = []
        for n, uid in enumerate(order, 1):
            score = f"score {_score(prefix, uid):#018x} for key {key!r}"
            why = (
                f"affinity: the highest {score} (the key stays here while it is pooled)"
                if n == 1
                else f"affinity: {ordinal(n)} highest {score}"
            )
            candidates.append(Candidate(uid, why, pooled_record(context, uid)))
        return CandidateOrder(tuple(candidates), why_none=None if candidates else NO_WORKERS)
