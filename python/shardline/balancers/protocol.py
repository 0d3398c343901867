"""The two protocols between a balancer and the proxy that drives it.

A balancer orders the candidate workers for one task; the proxy does everything else. It names
workers by uid only: the proxy resolves each uid against the live pool when it dispatches, so a
balancer can never send work to a superseded address, and a uid that has left the pool is
skipped. A *call* is one ``WorkerProxy.dispatch``: the balancer offers candidates until one
serves the task or it has none left. Two protocols express that; a balancer implements either.

**select** (synchronous, the faster one): ``select(task, *, context, tried) -> uid | None``.
The proxy calls it for the first candidate and again after each candidate that did not serve.
``tried`` is a read-only mapping of the uids already offered in this call, in the order offered,
to what became of each: the exception its dispatch failed with (on a failure other than
``TransientRpcError`` the proxy has already evicted the worker), or ``None`` when it had left the
pool before the proxy could dispatch to it. ``select`` returns an untried uid, or ``None`` to give
up: the proxy then raises :class:`~shardline.NoWorkersAvailable`, chained to the last failure. A
balancer that knows why it gives up raises ``NoWorkersAvailable`` itself with its reason, which
propagates. Returning a uid already in ``tried`` is a protocol violation the proxy reports as
``RuntimeError``. The proxy calls ``select`` and resolves its answer with no ``await`` between,
so a uid that ``select`` just found pooled is still pooled when the proxy looks it up. Subclass
:class:`SelectLoadBalancer` to implement it: ``delegate`` comes with it.

>>> import uuid
>>> from shardline import LoadBalancerContext, SelectLoadBalancer, WorkerMetadata
>>> class PrimaryFirst(SelectLoadBalancer):
...     '''The earliest admitted worker that has not failed this call.'''
...     needs_load = False  # it never reads context.load
...     def select(self, task, *, context, tried):
...         for uid in context.workers:
...             if uid not in tried:
...                 return uid
...         return None
>>> pool = LoadBalancerContext()
>>> for n in (1, 2):
...     pool.add_worker(WorkerMetadata(uuid.UUID(int=n), f"10.0.0.{n}:5000", n, "1"), f"conn-{n}")
>>> PrimaryFirst().select("task", context=pool, tried={})
UUID('00000000-0000-0000-0000-000000000001')
>>> PrimaryFirst().select("task", context=pool, tried={uuid.UUID(int=1): TimeoutError()})
UUID('00000000-0000-0000-0000-000000000002')

**delegate** (the seed's async-generator protocol): ``delegate(task, *, context)`` returns an
async generator of uids, which the proxy drives:

- ``anext``: the next candidate to try (also after a candidate that had left the pool: nothing is
  reported for it);
- ``athrow(exc)``: the last candidate failed; the generator offers another one or finishes (the
  proxy then raises ``NoWorkersAvailable``, chained to the last failure);
- ``asend(uid)``: the last candidate served the task; the generator must finish, since yielding
  again is a protocol violation the proxy reports as ``RuntimeError``.

>>> import asyncio
>>> class PrimaryFirstGenerator:
...     '''The same balancer, written as an async generator.'''
...     async def delegate(self, task, *, context):
...         for uid in list(context.workers):
...             if uid not in context.workers:  # it left since the call started
...                 continue
...             try:
...                 served = yield uid
...             except Exception:  # it failed: offer the next one
...                 continue
...             if served is not None:
...                 return
>>> async def offers(balancer):
...     candidates = balancer.delegate("task", context=pool)
...     first = await anext(candidates)
...     return [first, await candidates.athrow(TimeoutError())]
>>> [uid.int for uid in asyncio.run(offers(PrimaryFirstGenerator()))]
[1, 2]

Which one the proxy uses: ``select`` when the balancer has a ``select`` method that accepts
``(task, context=..., tried=...)``, else ``delegate``. Every built-in balancer implements
``select``; a plugin written against ``delegate`` alone keeps working unchanged.

**Load.** A balancer that reads ``context.load(uid)`` (dispatches in flight and the latency
average) needs the proxy to count every dispatch and time it; others should not pay for that. A
balancer declares ``needs_load = False`` when it never reads the load; one that does not declare
it is assumed to read it, so a plugin written before the declaration existed still sees correct
values. With ``needs_load = False`` the proxy keeps no load for the pool: ``load`` reports every
worker idle.

**The pool's native first pick.** A balancer whose first choice of a call the pool can make
itself may declare so in the class that defines its ``select``; the proxy then takes a call's
first candidate, its connection and its counts in one Rust call instead of calling
``select``, and after a failure goes on through ``select`` with ``tried``, so a call still
never offers a worker twice. Two declarations exist:

- ``pool_rotation = True``: ``select`` is, on this project's pool, exactly
  ``context.next_in_rotation(tried)`` (the pool's shared round-robin cursor); the first pick
  is ``WorkerPool.dispatch_next``. The built-in :class:`~shardline.RoundRobinLoadBalancer`.
- ``pool_least_loaded = True``: ``select``'s first choice of a call is, on this project's
  pool, ``context.less_loaded_of(a, b)`` at two distinct positions drawn uniformly at random
  (``(0, 0)`` for one worker); the first pick is ``WorkerPool.dispatch_less_loaded``, which
  draws the positions from the pool's own generator, compares and starts the dispatch, so the
  proxy counts and times every such dispatch, as the comparison's load needs. The built-in
  :class:`~shardline.LeastLoadedLoadBalancer` when it was given no ``rng``.

An instance withdraws ``pool_least_loaded`` by setting it to ``False`` on itself (the
least-loaded balancer does when given an ``rng``, whose draws must be the ones used). The
weighted balancer's choice depends on scores it keeps and the affinity one's on the task's
key, which neither pool path expresses. A subclass that overrides ``select`` loses the
declaration unless it repeats it.
"""

from __future__ import annotations

import abc
import inspect
import uuid
from collections.abc import AsyncGenerator, Callable, Mapping
from types import MappingProxyType
from typing import Any, Literal, Protocol, runtime_checkable

from shardline.pool.context import LoadBalancerContextView

__all__ = [
    "NOTHING_TRIED",
    "LoadBalancerLike",
    "NativeFirst",
    "Select",
    "SelectLoadBalancer",
    "Tried",
    "native_first",
    "needs_load",
    "select_of",
]

Tried = Mapping[uuid.UUID, Exception | None]
"""The uids a call offered so far, in order, each with the exception its dispatch raised, or
``None`` when it had left the pool before the dispatch."""

Select = Callable[..., uuid.UUID | None]
"""A bound ``select(task, *, context, tried)``."""

NativeFirst = Literal["pool-rotation", "pool-least-loaded"]
"""Which native first pick a balancer declared (see :func:`native_first`)."""

NOTHING_TRIED: Tried = MappingProxyType({})
"""``tried`` for a call's first candidate (shared, read-only)."""


@runtime_checkable
class LoadBalancerLike(Protocol):
    """Orders the candidate workers for one task; the proxy does everything else.

    ``delegate`` returns an async generator of worker uids that the proxy drives; a balancer
    may also have the faster, synchronous ``select``, which the proxy then uses instead. Both
    protocols, and the optional ``needs_load`` declaration, are described in
    :mod:`shardline.balancers.protocol`.
    """

    def delegate(
        self, task: Any, *, context: LoadBalancerContextView
    ) -> AsyncGenerator[uuid.UUID, uuid.UUID | None]: ...


class SelectLoadBalancer(abc.ABC):
    """The base of a balancer that implements ``select``: it derives ``delegate`` from it.

    A subclass implements :meth:`select` and declares ``needs_load`` (``True`` when it does
    not); the ``delegate`` it inherits offers what ``select`` returns, with the same ``tried``
    the proxy would pass, so the balancer behaves the same whichever protocol drives it.
    """

    @abc.abstractmethod
    def select(
        self, task: Any, *, context: LoadBalancerContextView, tried: Tried
    ) -> uuid.UUID | None:
        """The next candidate for ``task``, not in ``tried``; ``None`` to give up.

        ``tried`` maps each uid this call has already offered to what became of it: the
        exception it raised, or ``None`` when it had left the pool. An exception raised here
        propagates to the caller of ``dispatch``."""

    async def delegate(
        self, task: Any, *, context: LoadBalancerContextView
    ) -> AsyncGenerator[uuid.UUID, uuid.UUID | None]:
        """Yields what :meth:`select` returns; see :mod:`shardline.balancers.protocol`."""
        outcomes: dict[uuid.UUID, Exception | None] = {}
        tried = MappingProxyType(outcomes)
        select = self.select
        while (uid := select(task, context=context, tried=tried)) is not None:
            if uid in outcomes:
                raise RuntimeError(f"balancer {self!r} offered worker {uid} twice in one call")
            try:
                served = yield uid
            except Exception as error:  # the candidate failed
                outcomes[uid] = error
                continue
            if served is not None:
                return
            outcomes[uid] = None  # it had left the pool


def select_of(balancer: object) -> Select | None:
    """``balancer.select`` if it follows the ``select`` protocol, else ``None``.

    Implementation notes:
        The signature is checked, once per proxy, because a balancer written against
        ``delegate`` alone may have an unrelated method of that name.
    """
    select = getattr(balancer, "select", None)
    if not callable(select):
        return None
    try:
        inspect.signature(select).bind(None, context=None, tried=NOTHING_TRIED)
    except TypeError:
        return None
    except ValueError:  # no signature to read (a builtin): trust the name
        pass
    return select  # type: ignore[no-any-return]


def needs_load(balancer: object) -> bool:
    """Whether the proxy must count and time dispatches for ``balancer`` (true unless it
    declares ``needs_load = False``)."""
    return bool(getattr(balancer, "needs_load", True))


def native_first(balancer: object) -> NativeFirst | None:
    """The pool's native first pick ``balancer`` declared for its ``select``:
    ``"pool-rotation"`` (``pool_rotation = True``), ``"pool-least-loaded"``
    (``pool_least_loaded = True``, not withdrawn by the instance), else None.

    Implementation notes:
        Read from the class that defines ``select``, not inherited blindly, so a subclass
        that changes ``select`` does not inherit a promise about the old one; the instance is
        read too for ``pool_least_loaded``, which an instance may withdraw.
    """
    for cls in type(balancer).__mro__:
        if "select" in vars(cls):
            declared = vars(cls)
            if declared.get("pool_rotation") is True:
                return "pool-rotation"
            if (
                declared.get("pool_least_loaded") is True
                and getattr(balancer, "pool_least_loaded", False) is True
            ):
                return "pool-least-loaded"
            return None
    return None
