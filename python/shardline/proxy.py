"""`WorkerProxy`: dispatches tasks through the pool, choosing workers with a balancer."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterable, Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType, TracebackType
from typing import Any, Final, Protocol, cast, get_args

from shardline._tasks import cancel_and_wait
from shardline.balancers.explanation import (
    DispatchExplanation,
    DispatchProtocol,
    explain_dispatch,
)
from shardline.balancers.protocol import (
    NOTHING_TRIED,
    LoadBalancerLike,
    Tried,
    needs_load,
    pool_rotation,
    select_of,
)
from shardline.balancers.registry import create_balancer
from shardline.balancers.round_robin import RoundRobinLoadBalancer
from shardline.errors import NoWorkersAvailable, RpcError, RpcReason, TransientRpcError
from shardline.pool.context import LoadBalancerContext
from shardline.workers import DiscoveryEvent, WorkerMetadata

__all__ = ["EVICTION_REASONS", "Connection", "DispatchLatency", "ProxyStats", "WorkerProxy"]

logger = logging.getLogger("shardline.proxy")


class Connection(Protocol):
    """How the proxy reaches one worker."""

    async def dispatch(self, task: Any, *, timeout: float | None = None) -> Any: ...


EVICTION_REASONS = ("broken", "dropped", "unconnectable")
"""Why a worker left the pool: ``broken`` (its dispatch raised an ``RpcError`` that is not
transient), ``dropped`` (discovery said ``worker-dropped``), ``unconnectable`` (``connect``
raised on its new record)."""


@dataclass(frozen=True, slots=True)
class DispatchLatency:
    """The latencies of a proxy's dispatches to workers since
    :meth:`WorkerProxy.measure_latency`, as a histogram.

    ``bounds`` are the buckets' upper bounds in seconds (fixed: 25 µs to 10 s); ``counts[i]``
    is the number of timed dispatches that took more than ``bounds[i - 1]`` and at most
    ``bounds[i]`` seconds, and the last count (one more than there are bounds) those that took
    longer than every bound. ``sum`` is their total in seconds. Each timed dispatch to a worker
    is one sample, whatever its outcome, so a call that tried two workers is two.

    Which dispatches are timed: every one, except the first attempts of a balancer that
    declares ``pool_rotation`` and ``needs_load = False`` (the built-in round-robin), which
    the pool hands out natively; of those, one in ``LoadBalancerContext.DISPATCH_SAMPLE`` (8)
    is timed, the pool's 8th, 16th… such dispatch since it was made. So on that path
    :attr:`count` is about an eighth of the dispatches, while :attr:`ProxyStats.dispatched`
    stays exact; the buckets and the mean (``sum / count``) describe the dispatches as a
    whole, since which ones are sampled does not depend on how long they take.
    """

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float

    @property
    def count(self) -> int:
        """How many dispatches were timed."""
        return sum(self.counts)


@dataclass(frozen=True, slots=True)
class ProxyStats:
    """What a :class:`WorkerProxy` counted since it was made (:meth:`WorkerProxy.stats`).

    ``balancer`` is the balancer's class name. Dispatches are counted per worker tried:
    ``dispatched`` is how many the proxy started (each attempt of a call on one worker),
    ``transient`` how many of them raised a ``TransientRpcError`` (the worker stays, the
    balancer offers another), ``broken`` another ``RpcError`` (the worker was evicted, the
    balancer offers another), ``errors`` any other exception, cancellation included (it
    propagated to the caller); the others returned a result or are still running.
    ``exhausted`` counts the calls that raised ``NoWorkersAvailable`` because the balancer
    offered no worker more (not those a balancer raises itself, such as a keyed one finding no
    route). ``workers`` is the pool's size now; ``admissions``, ``refreshes`` (a pooled
    worker's connection replaced after ``worker-added`` or ``worker-updated``) and
    ``not_admitted`` (a ``worker-added`` refused at the lease, or whose record ``connect``
    raised on) count discovery's effects, and ``evictions`` the workers that left the pool by
    reason (every one of ``EVICTION_REASONS``, 0 until it happens: ``unconnectable`` is a
    pooled worker whose new record ``connect`` raised on, so its old address, superseded, is
    not used either). ``rpc_failures`` counts the dispatches that raised an ``RpcError``
    (``transient`` and ``broken`` together) by its ``reason`` (every
    :data:`~shardline.errors.RpcReason`, 0 until it happens; an error without a known reason
    counts as ``unspecified``). ``latency`` is the dispatch latency histogram,
    None until :meth:`WorkerProxy.measure_latency` was called; on the round-robin native path
    it times a sample, one dispatch in 8 (see :class:`DispatchLatency`).
    """

    balancer: str
    dispatched: int
    transient: int
    broken: int
    errors: int
    exhausted: int
    workers: int
    admissions: int
    refreshes: int
    not_admitted: int
    evictions: Mapping[str, int]
    rpc_failures: Mapping[str, int]
    latency: DispatchLatency | None


BalancerSpec = str | LoadBalancerLike | type[LoadBalancerLike] | Callable[[], LoadBalancerLike]


def _balancer_of(spec: BalancerSpec) -> LoadBalancerLike:
    """A name resolved in the registry; an instance as is; a class or a zero-argument factory
    called."""
    if isinstance(spec, str):
        return create_balancer(spec)
    if isinstance(spec, LoadBalancerLike) and not isinstance(spec, type):
        return spec
    return spec()


class WorkerProxy:
    """Dispatches tasks to a pool of workers that discovery keeps current.

    ``discovery`` is an async iterable of :class:`DiscoveryEvent`. ``worker-added`` admits a
    worker while fewer than ``lease`` distinct workers are pooled (``None``: no cap) and
    refreshes one already admitted; ``worker-updated`` refreshes only a worker already admitted
    (it never admits); ``worker-dropped`` evicts and frees a slot. ``connect(metadata)`` makes
    the connection for a record, on admission and on every refresh. A connection the pool lets
    go (replaced by a refresh, or its worker evicted) is closed with its ``close()`` method, if
    it has one; dispatches already in flight through it must be allowed to finish.

    ``loadbalancer`` is a balancer, a class or factory taking no arguments, or a name
    registered in the ``shardline.balancers`` entry-point group (see
    :mod:`shardline.balancers.registry`; an unknown name raises
    :class:`~shardline.InvalidArgument` listing the known ones). The proxy drives it through
    ``select`` when it has one, else through ``delegate``, and counts and times dispatches
    (``context.load``) only if it does not declare ``needs_load = False`` (once
    ``measure_latency()`` was called, such a balancer's dispatches are timed, but not counted
    in flight where the pool hands them out natively); a balancer declaring
    ``pool_rotation`` (the built-in round-robin) has its first candidate taken from the pool's
    rotation in one native call (see :mod:`shardline.balancers.protocol`).

    ``start()`` (or ``async with``) begins following discovery and waits until ``quorum``
    workers are pooled, raising ``TimeoutError`` after ``quorum_timeout`` seconds and leaving no
    background task behind (with the discovery's ``last_failure`` in its message when the
    discovery has one, as :class:`~shardline.discovery.TopologyDiscovery` does).
    ``dispatch(task)`` asks the balancer for candidates and resolves each uid against the live
    pool when it dispatches, so a stale selection can never reach a superseded address:

    - a uid no longer pooled is skipped, and nothing is reported to the balancer;
    - ``TransientRpcError``: the worker stays; the balancer is told, and offers the next;
    - any other ``RpcError``: the worker is evicted, then the balancer is told;
    - any other exception, cancellation included, propagates and leaves the pool alone;
    - a balancer out of candidates: ``NoWorkersAvailable`` naming the candidates the call
      tried and how each failed, chained to the last failure (a balancer that knows why, such
      as a keyed one finding no route, raises it itself with its reason, which propagates);
    - a balancer offering a worker twice in one call, or another one after a success:
      ``RuntimeError``.

    Logs on ``shardline.proxy``: INFO when a worker is admitted, refreshed, evicted (with the
    error that evicted it), dropped by discovery or not admitted because the pool is at its
    lease; never a line per dispatch.

    ``stats()`` counts all of this (:class:`ProxyStats`); ``measure_latency()`` adds a
    histogram of the dispatch latencies to it, which costs each timed dispatch two clock
    readings (on the round-robin native path, one dispatch in 8 is timed).
    """

    def __init__(
        self,
        *,
        discovery: AsyncIterable[DiscoveryEvent],
        loadbalancer: BalancerSpec = RoundRobinLoadBalancer,
        connect: Callable[[WorkerMetadata], Connection],
        lease: int | None = None,
        quorum: int = 1,
        quorum_timeout: float = 60.0,
    ) -> None:
        if lease is not None and lease < 1:
            raise ValueError(f"lease must be at least 1 (or None for no cap), got {lease}")
        if quorum < 0:
            raise ValueError(f"quorum must not be negative, got {quorum}")
        if lease is not None and quorum > lease:
            raise ValueError(f"quorum {quorum} can never be reached with lease {lease}")
        if quorum_timeout <= 0:
            raise ValueError(f"quorum_timeout must be positive, got {quorum_timeout}")
        self._discovery = discovery
        self._balancer = _balancer_of(loadbalancer)
        self._select = select_of(self._balancer)
        self._load = needs_load(self._balancer)
        # whether the select and delegate paths time their dispatches: the balancer's load, or
        # latency measured (the native path samples in the pool instead)
        self._timed = self._load
        # the first candidate from the pool's own rotation, only where select would name it
        self._pool_rotation = self._select is not None and pool_rotation(self._balancer)
        self._connect = connect
        self._lease = lease
        self._quorum = quorum
        self._quorum_timeout = quorum_timeout
        self._context = LoadBalancerContext()
        # counted here for the paths written in Python; the pool counts its native path
        self._dispatched = 0
        self._transient = 0
        self._broken = 0
        self._errors = 0
        self._exhausted = 0
        self._admissions = 0
        self._refreshes = 0
        self._not_admitted = 0
        self._evictions = dict.fromkeys(EVICTION_REASONS, 0)
        self._rpc_failures = dict.fromkeys(get_args(RpcReason), 0)
        self._quorum_reached = asyncio.Event()
        self._sentinel: asyncio.Task[None] | None = None

    @property
    def workers(self) -> list[WorkerMetadata]:
        """The records of the pooled workers, in admission order."""
        return [metadata for metadata, _ in self._context.workers.values()]

    def stats(self) -> ProxyStats:
        """The proxy's counts now (see :class:`ProxyStats`).

        Implementation notes:
            Read on the call: the pool's native counts (dispatches of the round-robin fast
            path, the latency histogram) from Rust, the rest from the proxy's own integers,
            which the paths written in Python add to where they already branch.
        """
        native, latency = self._context.dispatch_counts()
        return ProxyStats(
            balancer=type(self._balancer).__name__,
            dispatched=native + self._dispatched,
            transient=self._transient,
            broken=self._broken,
            errors=self._errors,
            exhausted=self._exhausted,
            workers=len(self._context),
            admissions=self._admissions,
            refreshes=self._refreshes,
            not_admitted=self._not_admitted,
            evictions=MappingProxyType(dict(self._evictions)),
            rpc_failures=MappingProxyType(dict(self._rpc_failures)),
            latency=None
            if latency is None
            else DispatchLatency(
                bounds=tuple(LoadBalancerContext.DISPATCH_BUCKETS),
                counts=tuple(latency[0]),
                sum=latency[1],
            ),
        )

    def measure_latency(self) -> None:
        """From now on, times dispatches to workers into :attr:`ProxyStats.latency`
        (:func:`shardline.metrics.register` calls it for the proxies it is given): every one,
        except on the round-robin native path, where one in 8 is timed (the pool's 8th, 16th…
        native dispatch; see :class:`DispatchLatency`). There is no turning it off; calling it
        again changes nothing.

        Implementation notes:
            The pool reads its clock when a dispatch starts and ends, in Rust (the same
            readings a load-aware balancer's load is made of), and counts the latency into
            fixed buckets; until this is called, a balancer that does not need the load has
            no clock read at all. Timing every native dispatch cost that path 44% (counting
            it in flight, two clock readings and a second call into the pool); sampled,
            ``dispatch_next`` picks the dispatch from its tally and returns a nonzero
            ``started`` only for it, so an unsampled dispatch costs one integer test, and a
            sampled one is never counted in flight (``observe_dispatch`` only records its
            latency). Balancers that need the load still count and time every dispatch.
        """
        self._context.time_dispatches()
        self._timed = True

    async def start(self) -> None:
        """Follows discovery in the background and waits for ``quorum`` pooled workers."""
        self._sentinel = asyncio.create_task(self._follow_discovery())
        if self._quorum == 0:
            return
        try:
            async with asyncio.timeout(self._quorum_timeout):
                await self._quorum_reached.wait()
        except TimeoutError:
            await self.stop()
            # a discovery that can say why it found nobody (TopologyDiscovery: its source's
            # last failure) is asked, so the error carries the cause and not only the count
            cause = getattr(self._discovery, "last_failure", None)
            why = f"; discovery's last failure: {cause}" if cause else ""
            raise TimeoutError(
                f"{len(self._context)} of the {self._quorum} workers of the quorum joined "
                f"within {self._quorum_timeout} s{why}"
            ) from None

    async def stop(self) -> None:
        """Stops following discovery; the pool keeps its workers. Returns once the follower has
        ended (raising the discovery's error if it had failed); cancelled meanwhile, it raises
        ``CancelledError`` at once."""
        sentinel, self._sentinel = self._sentinel, None
        if sentinel is not None:
            await cancel_and_wait(sentinel)

    async def __aenter__(self) -> WorkerProxy:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _follow_discovery(self) -> None:
        async for event in self._discovery:
            self._apply(event)
            if len(self._context) >= self._quorum:
                self._quorum_reached.set()

    def _apply(self, event: DiscoveryEvent) -> None:
        metadata = event.metadata
        if event.type == "worker-dropped":
            if self._evict(metadata):
                self._evictions["dropped"] += 1
                logger.info("worker %s at %s dropped by discovery", metadata.uid, metadata.address)
            return
        pooled = self._context.workers.get(metadata.uid)
        if pooled is not None and event.type in ("worker-added", "worker-updated"):
            connection = self._connection_for(metadata)
            if connection is _UNCONNECTABLE:
                if self._evict(metadata):
                    self._evictions["unconnectable"] += 1
                return
            self._context.update_worker(metadata, connection)
            if connection is not pooled[1]:
                _close(pooled[1])
            self._refreshes += 1
            logger.info("worker %s refreshed: now at %s", metadata.uid, metadata.address)
        elif event.type == "worker-added":
            if self._lease is None or len(self._context) < self._lease:
                connection = self._connection_for(metadata)
                if connection is _UNCONNECTABLE:
                    self._not_admitted += 1
                    return
                self._context.add_worker(metadata, connection)
                self._admissions += 1
                logger.info("worker %s at %s admitted", metadata.uid, metadata.address)
            else:
                self._not_admitted += 1
                logger.info("worker %s not admitted: the pool is at its lease", metadata.uid)
        elif event.type != "worker-updated":
            logger.warning("discovery event of unknown type %r skipped", event.type)

    def _connection_for(self, metadata: WorkerMetadata) -> Connection:
        """``connect(metadata)``, or ``_UNCONNECTABLE`` when it raises (``connect`` may return
        anything, None included): one record the proxy cannot reach (a malformed address, an
        unknown scheme) is logged and skipped, and the stream goes on (the second safety rule
        in docs/architecture.md)."""
        try:
            return self._connect(metadata)
        except Exception as error:
            logger.warning(
                "worker %s at %r skipped: no connection can be made to it: %s",
                metadata.uid,
                metadata.address,
                error,
            )
            return _UNCONNECTABLE

    def _evict(self, metadata: WorkerMetadata) -> bool:
        """Evicts the uid, whichever connection it holds now (a refresh may have landed);
        False if it was not pooled."""
        pooled = self._context.workers.get(metadata.uid)
        if pooled is None:
            return False
        self._context.remove_worker(metadata)
        _close(pooled[1])
        return True

    def _count_transient(self, error: TransientRpcError) -> None:
        self._transient += 1
        self._count_reason(error)

    def _count_reason(self, error: RpcError) -> None:
        # a plugin's subclass may skip RpcError.__init__, or set a word of its own
        reason = getattr(error, "reason", "unspecified")
        self._rpc_failures[reason if reason in self._rpc_failures else "unspecified"] += 1

    def _evict_broken(self, metadata: WorkerMetadata, error: RpcError) -> None:
        self._broken += 1
        self._count_reason(error)
        if self._evict(metadata):
            self._evictions["broken"] += 1
            logger.info("worker %s at %s evicted: %s", metadata.uid, metadata.address, error)

    def explain(self, task: Any) -> DispatchExplanation:
        """The candidates the balancer would offer ``task`` now, in order, and why, without
        dispatching and without changing the balancer's state or the pool's (a round-robin
        rotation stays where it stands).

        The answer (:class:`~shardline.balancers.explanation.DispatchExplanation`) names the
        balancer and how the proxy drives it (the pool's rotation, ``select`` or
        ``delegate``), each candidate with its record and the reason the balancer offers it,
        the pooled workers it would never offer and why, and, when there is no candidate,
        why not (no worker pooled, no route for the key…). Its ``first`` is the worker the
        next dispatch would try first, unless another call or a discovery event comes in
        between. Each built-in balancer explains itself exactly; a plugin without an
        ``explain_candidates`` method is driven on a copy of itself over a read-only view of
        the pool, and a plugin that cannot be copied is reported as not explainable, never
        driven. See :mod:`shardline.balancers.explanation`. Raises what the balancer raises
        for a task it cannot place at all (a keyed balancer: an unknown tier, an unhashable
        key).
        """
        protocol: DispatchProtocol = (
            "pool-rotation" if self._pool_rotation else "select" if self._select else "delegate"
        )
        return explain_dispatch(
            self._balancer, task, self._context, protocol=protocol, select=self._select
        )

    async def dispatch(self, task: Any, *, timeout: float | None = None) -> Any:
        """Runs ``task`` on a worker the balancer names; see the class docstring.

        Implementation notes:
            Three paths in one coroutine (a helper coroutine per path would cost an extra
            frame and await on every dispatch): a balancer that declares ``pool_rotation``
            has its first candidate, connection and in-flight count from one Rust call
            (``dispatch_next``), and goes on through ``select`` after a failure; other
            balancers go through ``select`` or ``delegate``. The load (a count in flight and
            the latency, timed on the pool's clock in Rust) is kept only for a balancer that
            needs it; the select and delegate paths also time every dispatch once
            ``measure_latency`` was called, the native path only those the pool samples (a
            nonzero ``started``); otherwise the uid is resolved with a plain pool lookup. The
            native path's dispatches are counted by the pool
            (``dispatch_next``); the other paths count theirs here, and every failure is
            counted where its ``except`` already is, so a dispatch that succeeds on the native
            path adds nothing in Python.
        """
        context = self._context
        failure: Exception | None = None
        started = 0
        select = self._select
        if select is not None:
            tried: Tried = NOTHING_TRIED
            outcomes: dict[uuid.UUID, Exception | None] | None = None  # made on a first miss
            outcome: Exception | None
            if self._pool_rotation:
                picked = context.dispatch_next(None, self._load)
                if picked is None:
                    raise self._exhausted_call(task, tried)
                uid, metadata, connection, started = picked
                try:
                    return await connection.dispatch(task, timeout=timeout)
                except TransientRpcError as error:
                    self._count_transient(error)
                    failure = error
                except RpcError as error:
                    self._evict_broken(metadata, error)
                    failure = error
                except BaseException:
                    self._errors += 1
                    raise
                finally:
                    if started:  # counted for the balancer's load, or sampled for latency
                        if self._load:
                            context.finish_dispatch(uid, started)
                        else:
                            context.observe_dispatch(started)
                outcomes = {uid: failure}
                tried = MappingProxyType(outcomes)
            timed = self._timed
            while True:
                uid = select(task, context=context, tried=tried)
                if uid is None:
                    raise self._exhausted_call(task, tried) from failure
                if outcomes is not None and uid in outcomes:
                    raise RuntimeError(
                        f"balancer {self._balancer!r} offered worker {uid} twice in one call"
                    )
                try:
                    if timed:
                        metadata, connection, started = context.start_dispatch(uid)
                    else:
                        metadata, connection = context.entry(uid)
                except KeyError:  # it left the pool: skipped, not failed
                    outcome = None
                else:
                    self._dispatched += 1
                    try:
                        return await connection.dispatch(task, timeout=timeout)
                    except TransientRpcError as error:
                        self._count_transient(error)
                        failure = outcome = error
                    except RpcError as error:
                        self._evict_broken(metadata, error)
                        failure = outcome = error
                    except BaseException:
                        self._errors += 1
                        raise
                    finally:
                        if timed:
                            context.finish_dispatch(uid, started)
                if outcomes is None:
                    outcomes = {}
                    tried = MappingProxyType(outcomes)
                outcomes[uid] = outcome
        timed = self._timed
        candidates = self._balancer.delegate(task, context=context)
        offered: dict[uuid.UUID, Exception | None] = {}  # written only on a miss or a failure
        try:
            uid = await anext(candidates)
            while True:
                try:
                    if timed:
                        metadata, connection, started = context.start_dispatch(uid)
                    else:
                        metadata, connection = context.entry(uid)
                except KeyError:
                    offered[uid] = None
                    uid = await anext(candidates)
                    continue
                dispatched = uid
                self._dispatched += 1
                try:
                    result = await connection.dispatch(task, timeout=timeout)
                except TransientRpcError as error:
                    self._count_transient(error)
                    failure = offered[uid] = error
                    uid = await candidates.athrow(error)
                    continue
                except RpcError as error:
                    self._evict_broken(metadata, error)
                    failure = offered[uid] = error
                    uid = await candidates.athrow(error)
                    continue
                except BaseException:
                    self._errors += 1
                    raise
                finally:
                    if timed:
                        context.finish_dispatch(dispatched, started)
                try:
                    await candidates.asend(uid)
                except StopAsyncIteration:
                    return result
                raise RuntimeError(
                    f"balancer {self._balancer!r} offered another worker after a success"
                )
        except StopAsyncIteration:
            raise self._exhausted_call(task, offered) from failure
        finally:
            await candidates.aclose()

    def _exhausted_call(
        self, task: Any, tried: Mapping[uuid.UUID, Exception | None]
    ) -> NoWorkersAvailable:
        """Counts a call whose balancer offered nobody more, and makes its error."""
        self._exhausted += 1
        return _exhausted(task, tried)


_SHOWN_CANDIDATES = 8


def _exhausted(task: Any, tried: Mapping[uuid.UUID, Exception | None]) -> NoWorkersAvailable:
    """The error of a call whose balancer offered nobody more: what it tried, and how each
    candidate failed (the first few; the last failure is chained as the cause)."""
    if not tried:
        return NoWorkersAvailable(f"no worker could take the task {task!r}: none was offered")
    shown = [
        f"{uid} ({'left the pool' if error is None else type(error).__name__})"
        for uid, error in list(tried.items())[:_SHOWN_CANDIDATES]
    ]
    more = f" and {len(tried) - len(shown)} more" if len(tried) > len(shown) else ""
    return NoWorkersAvailable(
        f"no worker could take the task {task!r}: tried {', '.join(shown)}{more}"
    )


_UNCONNECTABLE: Final[Connection] = cast(Connection, object())
"""What ``WorkerProxy._connection_for`` returns for a record ``connect`` raised on."""


def _close(connection: Connection) -> None:
    """Closes a connection the pool let go, if it can be closed; a failure is only logged,
    because it must not stop the proxy from following discovery."""
    close = getattr(connection, "close", None)
    if not callable(close):
        return
    try:
        close()
    except Exception:
        logger.exception("closing the connection %r failed", connection)
