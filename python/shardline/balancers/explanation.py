"""Why a dispatch would go where it goes: the candidates a balancer would offer a task now.

:meth:`shardline.WorkerProxy.explain` answers with a :class:`DispatchExplanation`. A balancer
explains itself through the optional ``explain_candidates(task, *, context)`` method, which
returns a :class:`CandidateOrder` and must change nothing: no cursor moves, no score changes, no
refresh is asked for. Every built-in balancer has one. A balancer without it (a plugin) is
driven as the proxy would drive it, but on a *copy* of itself (``copy.deepcopy``) over a
read-only view of the pool, each candidate supposed to fail transiently so that the next one is
shown; if no copy can be made the explanation says so and shows no candidates, rather than
drive the balancer itself.

>>> import uuid
>>> from shardline import LoadBalancerContext, RoundRobinLoadBalancer, WorkerMetadata
>>> pool = LoadBalancerContext()
>>> for n in (1, 2):
...     pool.add_worker(WorkerMetadata(uuid.UUID(int=n), f"10.0.0.{n}:5000", n, "1"), None)
>>> order = RoundRobinLoadBalancer().explain_candidates("task", context=pool)
>>> [(candidate.address, candidate.why) for candidate in order.candidates]
[('10.0.0.1:5000', "next in the pool's rotation"), ('10.0.0.2:5000', "2nd in the pool's rotation")]
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import uuid
from collections.abc import Callable, Coroutine, Generator, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Literal

from shardline.errors import NoWorkersAvailable, TransientRpcError

__all__ = [
    "Candidate",
    "CandidateOrder",
    "DispatchExplanation",
    "DispatchProtocol",
    "Excluded",
    "explain_dispatch",
    "ordinal",
]

DispatchProtocol = Literal["pool-rotation", "pool-least-loaded", "select", "delegate"]
Method = Literal["balancer", "copy", "unexplained"]

_PROTOCOLS: Final[dict[str, str]] = {
    "pool-rotation": "the pool's rotation (native fast path), then select after a failure",
    "pool-least-loaded": (
        "the pool's least-loaded draw (native fast path), then select after a failure"
    ),
    "select": "select",
    "delegate": "delegate (async generator)",
}


def ordinal(n: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``4th``, … ``11th``, ``21st``."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


@dataclass(frozen=True, slots=True)
class Candidate:
    """One worker a balancer would offer, in the order it would offer them, and why.

    ``metadata`` is the pooled record (``WorkerMetadata``), or ``None`` when the uid is not
    pooled: a balancer may name such a worker (a keyed balancer names the master whatever the
    pool holds), and the proxy skips it.
    """

    uid: uuid.UUID
    why: str
    metadata: Any = None

    @property
    def pooled(self) -> bool:
        """Whether the uid is pooled (the proxy would dispatch to it rather than skip it)."""
        return self.metadata is not None

    @property
    def address(self) -> str | None:
        """The pooled record's address, ``None`` when not pooled or it has none."""
        return getattr(self.metadata, "address", None)


@dataclass(frozen=True, slots=True)
class Excluded:
    """A pooled worker the balancer would never offer this task, and why."""

    uid: uuid.UUID
    why: str
    metadata: Any = None

    @property
    def address(self) -> str | None:
        """The pooled record's address, ``None`` when it has none."""
        return getattr(self.metadata, "address", None)


@dataclass(frozen=True, slots=True)
class CandidateOrder:
    """A balancer's account of the candidates it would offer a task now (the answer of
    ``explain_candidates``).

    ``candidates`` in the order a call would offer them when each one before failed
    transiently; ``excluded``, pooled workers it would not offer; ``why_none``, when there are
    no candidates, why (no worker pooled, no route for the key…); ``notes``, anything else an
    operator should know (a write offered the master only, a choice that is random…).
    """

    candidates: tuple[Candidate, ...]
    excluded: tuple[Excluded, ...] = ()
    why_none: str | None = None
    notes: tuple[str, ...] = ()


def pooled_record(context: Any, uid: uuid.UUID) -> Any:
    """The record pooled under ``uid`` in ``context``, ``None`` when it is not pooled."""
    entry = context.workers.get(uid)
    return entry[0] if entry is not None else None


NO_WORKERS: Final = "no worker is pooled"


@dataclass(frozen=True, slots=True)
class DispatchExplanation:
    """What :meth:`shardline.WorkerProxy.explain` says of a task: the candidates the proxy's
    balancer would offer it now, and why, without dispatching.

    - ``balancer``: the balancer's ``repr``; ``balancer_class``: its module and class name.
    - ``protocol``: how the proxy drives it: ``"pool-rotation"`` or ``"pool-least-loaded"``
      (a native fast path for the first candidate, then ``select``), ``"select"`` or
      ``"delegate"``.
    - ``method``: where the answer comes from: ``"balancer"`` (its own ``explain_candidates``,
      exact as of now), ``"copy"`` (a plugin driven on a copy of itself over a read-only view
      of the pool; exact for a balancer whose choices depend only on itself and the pool) or
      ``"unexplained"`` (no copy could be made; no candidates are shown, ``notes`` says why).
    - ``pooled``: how many workers the pool holds.
    - ``candidates``, ``excluded``, ``why_none``, ``notes``: as in :class:`CandidateOrder`.

    ``first`` is the uid the next dispatch would try first (the first pooled candidate), if no
    other call or discovery event comes in between. ``str()`` is a few lines for an operator.
    """

    balancer: str
    balancer_class: str
    protocol: DispatchProtocol
    method: Method
    pooled: int
    candidates: tuple[Candidate, ...]
    excluded: tuple[Excluded, ...] = ()
    why_none: str | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def first(self) -> uuid.UUID | None:
        """The uid the next dispatch would try first, ``None`` when it would find nobody."""
        for candidate in self.candidates:
            if candidate.pooled:
                return candidate.uid
        return None

    def __str__(self) -> str:
        # a default repr (<… object at 0x…>) says nothing the class name does not
        named = "" if self.balancer.startswith("<") else f" {self.balancer}"
        lines = [
            f"balancer {self.balancer_class}{named} via {_PROTOCOLS[self.protocol]};"
            f" {self.pooled} pooled"
        ]
        if self.method == "copy":
            lines[0] += "; candidates as a copy of it offers them"
        for n, candidate in enumerate(self.candidates, 1):
            where = candidate.address if candidate.pooled else "not pooled: skipped"
            lines.append(f"  {n}. {candidate.uid} ({where}): {candidate.why}")
        if not self.candidates:
            lines.append(f"  no candidates: {self.why_none or 'the balancer offers none'}")
        for excluded in self.excluded:
            lines.append(f"  excluded {excluded.uid} ({excluded.address}): {excluded.why}")
        lines.extend(f"  note: {note}" for note in self.notes)
        return "\n".join(lines)


# What an explanation supposes of each candidate it shows, so the balancer offers the next.
SUPPOSED_FAILURE: Final = TransientRpcError(
    "supposed to fail, so that the next candidate is shown (nothing was dispatched)"
)


def explain_of(balancer: object) -> Callable[..., CandidateOrder] | None:
    """``balancer.explain_candidates`` if it accepts ``(task, context=...)``, else ``None``."""
    explain = getattr(balancer, "explain_candidates", None)
    if not callable(explain):
        return None
    try:
        inspect.signature(explain).bind(None, context=None)
    except TypeError:
        return None
    except ValueError:  # no signature to read: trust the name
        pass
    return explain  # type: ignore[no-any-return]


def explain_dispatch(
    balancer: Any,
    task: Any,
    context: Any,
    *,
    protocol: DispatchProtocol,
    select: Callable[..., uuid.UUID | None] | None,
) -> DispatchExplanation:
    """The :class:`DispatchExplanation` of ``task`` for ``balancer`` on ``context`` (the pool),
    driven through ``protocol`` (``select`` is its ``select`` when it has one)."""
    cls = type(balancer)
    explain = explain_of(balancer)
    method: Method
    if explain is not None:
        order = explain(task, context=context)
        method = "balancer"
    else:
        order, method = _explain_on_copy(balancer, task, context, select is not None)
    why_none = order.why_none
    if not order.candidates and why_none is None and len(context) == 0:
        why_none = NO_WORKERS
    return DispatchExplanation(
        balancer=repr(balancer),
        balancer_class=f"{cls.__module__}.{cls.__qualname__}",
        protocol=protocol,
        method=method,
        pooled=len(context),
        candidates=order.candidates,
        excluded=order.excluded,
        why_none=why_none,
        notes=order.notes,
    )


class ReadOnlyPool:
    """What a copied plugin balancer is given instead of the pool: the live ``workers`` and
    ``load`` of the real one, and a ``next_in_rotation`` that reads the pool's rotation
    without moving it. Nothing that writes is there.

    Implementation notes:
        ``next_in_rotation(tried)`` is the first uid of ``rotation_order()`` not in
        ``tried``: within one call the real rotation, moved past each pick, gives the same.
        Weak-referenceable, because balancers keep their per-pool state weakly.
    """

    __slots__ = ("__weakref__", "_pool")

    def __init__(self, pool: Any) -> None:
        self._pool = pool

    @property
    def workers(self) -> Any:
        return self._pool.workers

    def load(self, uid: uuid.UUID) -> tuple[int, float]:
        return self._pool.load(uid)  # type: ignore[no-any-return]

    def next_in_rotation(self, tried: Any = None) -> uuid.UUID | None:
        for uid in self._pool.rotation_order():
            if not tried or uid not in tried:
                return uid  # type: ignore[no-any-return]
        return None

    def rotation_order(self) -> list[uuid.UUID]:
        return self._pool.rotation_order()  # type: ignore[no-any-return]

    def uids(self) -> list[uuid.UUID]:
        return self._pool.uids()  # type: ignore[no-any-return]

    def __len__(self) -> int:
        return len(self._pool)

    def __contains__(self, uid: object) -> bool:
        return uid in self._pool


class _Suspended(Exception):
    """The copied balancer's delegate awaited something real: it cannot be driven here."""


def _step(awaitable: Coroutine[Any, Any, Any] | Generator[Any, Any, Any] | Any) -> Any:
    """Runs one step of a delegate generator (``anext`` / ``athrow``) to its answer without an
    event loop; raises ``StopAsyncIteration`` at its end and ``_Suspended`` if it awaits."""
    try:
        awaitable.send(None)
    except StopIteration as answer:
        return answer.value
    awaitable.close()
    raise _Suspended


def _explain_on_copy(
    balancer: Any, task: Any, context: Any, has_select: bool
) -> tuple[CandidateOrder, Method]:
    """A plugin's candidates, offered by a deep copy of it over a :class:`ReadOnlyPool`.

    Implementation notes:
        The copy's memo maps the pool to the read-only view, so state the plugin keeps per
        pool (a ``PerContext``, a dict keyed by the pool) is copied onto the view and the copy
        picks up where the plugin stands. Each shown candidate is supposed to have failed
        transiently (``tried`` for ``select``, ``athrow`` for ``delegate``); a candidate not
        pooled is reported as skipped, as the proxy does. At most ``len(pool) + 16`` are shown.
    """
    view = ReadOnlyPool(context)
    name = type(balancer).__qualname__
    try:
        clone = copy.deepcopy(balancer, {id(context): view})
    except Exception as error:
        return (
            CandidateOrder(
                (),
                why_none="not explainable",
                notes=(
                    f"plugin {name} has no explain_candidates and cannot be copied ({error!r});"
                    " driving it on the real pool could change its state, so it was not driven",
                ),
            ),
            "unexplained",
        )
    limit = len(context) + 16
    notes = [
        f"plugin {name} has no explain_candidates: these are the candidates a copy of it"
        " offers on a read-only view of the pool now, each supposed to fail transiently; state"
        " it keeps outside itself is not copied, and randomness or time may change its choice"
    ]
    offered: dict[uuid.UUID, Exception | None] = {}
    candidates: list[Candidate] = []
    why_none: str | None = None

    def shown(uid: uuid.UUID) -> None:
        record = pooled_record(context, uid)
        candidates.append(Candidate(uid, f"{ordinal(len(candidates) + 1)} offer", record))
        offered[uid] = SUPPOSED_FAILURE if record is not None else None

    try:
        if has_select:
            tried = MappingProxyType(offered)
            while len(candidates) < limit:
                uid = clone.select(task, context=view, tried=tried)
                if uid is None:
                    break
                if uid in offered:
                    notes.append(f"it offered {uid} twice (the proxy would raise RuntimeError)")
                    break
                shown(uid)
        else:
            generator = clone.delegate(task, context=view)
            try:
                uid = _step(anext(generator))
                while True:
                    if uid in offered:
                        notes.append(f"it offered {uid} twice")
                        break
                    shown(uid)
                    if len(candidates) >= limit:
                        break
                    failure = offered[uid]
                    uid = _step(
                        generator.athrow(failure) if failure is not None else anext(generator)
                    )
            except StopAsyncIteration:
                pass
            finally:
                with contextlib.suppress(_Suspended, StopAsyncIteration):
                    _step(generator.aclose())
    except _Suspended:
        notes.append("its delegate awaited something: candidates shown up to there")
    except NoWorkersAvailable as error:
        why_none = str(error)
    if len(candidates) >= limit:
        notes.append(f"only the first {limit} are shown")
    return CandidateOrder(tuple(candidates), why_none=why_none, notes=tuple(notes)), "copy"


def each_pooled(context: Any) -> Sequence[tuple[uuid.UUID, Any]]:
    """The pooled ``(uid, metadata)`` pairs, in admission order (a snapshot)."""
    workers = context.workers
    pairs = []
    for uid in list(workers):
        entry = workers.get(uid)
        if entry is not None:
            pairs.append((uid, entry[0]))
    return pairs
