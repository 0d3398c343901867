"""`WorkerProxy`: dispatches tasks through the pool, choosing workers with a balancer."""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import functools
import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterable, Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType, TracebackType
from typing import Any, Final, cast, get_args

from shardline._tasks import cancel_and_wait
from shardline.balancers.explanation import (
    DispatchExplanation,
    DispatchProtocol,
    Excluded,
    explain_dispatch,
)
from shardline.balancers.protocol import (
    NOTHING_TRIED,
    LoadBalancerLike,
    Tried,
    native_first,
    needs_load,
    select_of,
)
from shardline.balancers.registry import create_balancer
from shardline.balancers.round_robin import RoundRobinLoadBalancer
from shardline.checks import check_seconds
from shardline.errors import (
    DeadlineExceeded,
    NoWorkersAvailable,
    OutcomeUnknown,
    RpcError,
    RpcReason,
    TransientRpcError,
    WorkerError,
)
from shardline.pool.context import LoadBalancerContext
from shardline.pool.health import HealthPolicy, WorkerHealth
from shardline.proxy_stream import ProxyStream
from shardline.retry_budget import RetryBudget
from shardline.workers import Connection, DiscoveryEvent, WorkerMetadata

__all__ = [
    "DEFAULT_HEALTH",
    "DEFAULT_TIMEOUT",
    "EVICTION_REASONS",
    "Connection",
    "DispatchLatency",
    "ProxyStats",
    "WorkerProxy",
]

logger = logging.getLogger("shardline.proxy")

DEFAULT_TIMEOUT = 1.0
"""The deadline, in seconds, of a call made without ``timeout=``, unless the proxy was given
another. Finite, so that no call waits forever on a worker that stalled; one second, because
the services shardline serves count their latency in milliseconds and a call still waiting
after a second has almost always lost its caller (Tarantool's crud bounds its vshard calls
with 2 s by default, vshard's router with 0.5 s per attempt), and because a caller held by a
stalled worker is held at most that long: with a longer default, a stall of a few seconds
holds every caller that reached the stalled worker for its whole length. A task that takes
longer says so with ``timeout=``."""


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

    Which dispatches are timed: every one, except, on a proxy without passive health
    (``health=None``), the first attempts of a balancer that declares ``pool_rotation`` and
    ``needs_load = False`` (the built-in round-robin), which the pool hands out natively
    uncounted; of those, one in ``LoadBalancerContext.DISPATCH_SAMPLE`` (8)
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
    of a proxy without health it times a sample, one dispatch in 8 (see
    :class:`DispatchLatency`).

    ``deadlines`` counts the calls that raised :class:`~shardline.DeadlineExceeded`,
    ``outcomes_unknown`` those that raised :class:`~shardline.OutcomeUnknown` (a task that
    reached a worker whose answer never came, not sent again); ``retries`` the retries the
    retry budget allowed (second attempts after a failure and hedges alike) and
    ``retries_refused`` those it refused; ``hedges`` the hedged attempts sent. ``ejections``
    and ``readmissions`` count the pool's passive-health ejections and the re-admissions after
    a successful probe, ``ejected`` the workers ejected now (all 0 without health).
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
    deadlines: int = 0
    outcomes_unknown: int = 0
    retries: int = 0
    retries_refused: int = 0
    hedges: int = 0
    ejections: int = 0
    readmissions: int = 0
    ejected: int = 0


BalancerSpec = str | LoadBalancerLike | type[LoadBalancerLike] | Callable[[], LoadBalancerLike]

_monotonic = time.monotonic

# How a dispatch ended, for the pool's health (WorkerPool.finish_dispatch)
_SUCCESS: Final = LoadBalancerContext.OUTCOME_SUCCESS
_FAILURE: Final = LoadBalancerContext.OUTCOME_FAILURE
_DEADLINE: Final = LoadBalancerContext.OUTCOME_DEADLINE
_NEUTRAL: Final = LoadBalancerContext.OUTCOME_NEUTRAL

DEFAULT_HEALTH: Final = HealthPolicy()
"""The passive health policy of a proxy made without ``health=``."""
_DEFAULT_BUDGET: Final = RetryBudget()

# Hedging: the delay before a second attempt is the dispatches' 95th percentile over the last
# window of at least _HEDGE_SAMPLES dispatches (recomputed at most every _HEDGE_REFRESH s),
# never under _MIN_HEDGE_DELAY; before any is known, _FIRST_HEDGE_DELAY.
_HEDGE_PERCENTILE = 0.95
_HEDGE_SAMPLES = 20
_HEDGE_REFRESH = 0.5
_MIN_HEDGE_DELAY = 0.001
_FIRST_HEDGE_DELAY = 0.05

# How often an idle proxy (no dispatch in flight) has the pool look for stuck workers.
_IDLE_WATCH = 0.2


def _outcome_of(error: RpcError) -> int:
    """What a dispatch that raised ``error`` says of its worker's health."""
    return _DEADLINE if getattr(error, "reason", None) == "deadline" else _FAILURE


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
    rotation in one native call, and one declaring ``pool_least_loaded`` (the built-in
    least-loaded, given no ``rng``) from the pool's own least-loaded draw, likewise (see
    :mod:`shardline.balancers.protocol`).

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
      ``RuntimeError``;
    - a proxy that was never started (``dispatch`` before ``async with`` or ``start()``):
      ``RuntimeError`` saying so, as ``LocalPool`` raises, and not ``NoWorkersAvailable``.

    **One deadline per call.** ``dispatch(task, timeout=...)`` bounds the whole call: every
    attempt runs inside it and is given the seconds that remain, which the worker sees too
    (it never starts a request whose deadline has passed, and cancels an async handler at
    it). Without ``timeout=`` the call has the proxy's ``timeout`` (:data:`DEFAULT_TIMEOUT`,
    1 s, unless given another). When it passes, the call raises
    :class:`~shardline.DeadlineExceeded` (a ``TimeoutError``) naming the workers tried and
    whether the task may have run on the last one.

    **At most once, unless the task is idempotent.** A failure before the task reached a
    worker (no connection, ``busy``, ``shutting-down`` before it started, a handler's
    ``RetryElsewhere``: an ``RpcError`` whose ``sent`` is false) goes to the next candidate
    as above. Once the task reached a worker and its answer never came (the connection was
    lost, the worker stopped answering: ``sent`` true), it is never sent again: the call
    raises :class:`~shardline.OutcomeUnknown` naming the worker, since the task may have
    run there. A task declared idempotent (``Task(..., idempotent=True)``, or
    ``dispatch(task, idempotent=True)``) is sent to the next candidate instead, and, with
    ``hedging`` on (the default) and a ``select`` balancer, is also *hedged*: when its first
    attempt has not answered within the 95th percentile of the recent dispatch latencies, a
    second attempt goes to the next candidate, the first answer wins and the other attempt
    is cancelled on the wire. Retries and hedges draw on ``retry_budget`` (a
    :class:`~shardline.retry_budget.RetryBudget`: a fifth of the dispatches plus ten a
    second, by default); when it is spent the call raises ``NoWorkersAvailable`` rather than
    retry; ``retry_budget=None`` retries without limit.

    **Passive health.** With ``health`` (a :class:`~shardline.pool.health.HealthPolicy`; the
    default one unless None), the pool keeps per worker its consecutive failures and
    deadline misses, its calls in flight, a latency and a success-rate estimate, and ejects
    a worker that crosses the policy's thresholds (failures in a row, a low success rate, a
    call stuck far beyond the recent latency, a latency far above the pool's): no balancer
    is offered it, whatever the balancer, until its ejection time has passed and one probe
    call has succeeded. A handler's error (``WorkerError``) is a success here: the worker
    answered. See :class:`~shardline.pool.health.HealthPolicy` for the rules and defaults.

    Logs on ``shardline.proxy``: INFO when a worker is admitted, refreshed, evicted (with the
    error that evicted it), dropped by discovery, not admitted because the pool is at its
    lease, ejected by health (with the reason and for how long) or re-admitted; never a line
    per dispatch.

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
        timeout: float = DEFAULT_TIMEOUT,
        health: HealthPolicy | None = DEFAULT_HEALTH,
        retry_budget: RetryBudget | None = _DEFAULT_BUDGET,
        hedging: bool = True,
    ) -> None:
        if lease is not None and lease < 1:
            raise ValueError(f"lease must be at least 1 (or None for no cap), got {lease}")
        if quorum < 0:
            raise ValueError(f"quorum must not be negative, got {quorum}")
        if lease is not None and quorum > lease:
            raise ValueError(f"quorum {quorum} can never be reached with lease {lease}")
        if quorum_timeout <= 0:
            raise ValueError(f"quorum_timeout must be positive, got {quorum_timeout}")
        self._timeout = check_seconds("timeout", timeout)
        if retry_budget is _DEFAULT_BUDGET:
            retry_budget = RetryBudget()  # a bucket per proxy: the default object is a marker
        self._retry_budget = retry_budget
        self._discovery = discovery
        self._balancer = _balancer_of(loadbalancer)
        self._select = select_of(self._balancer)
        self._context = LoadBalancerContext()
        self._health = health
        if health is not None:
            self._context.configure_health(health)
        # every dispatch is counted in flight and ends with its outcome when the balancer
        # reads the load or the pool keeps health, but for the native path's token
        # dispatches, which report only an outcome other than a success
        self._count = needs_load(self._balancer)
        # the first candidate from the pool's own pick, only where select would name it
        self._native = None if self._select is None else native_first(self._balancer)
        # least-loaded's native pick reads the load, so its dispatches are always counted
        self._least_loaded_first = self._native == "pool-least-loaded"
        self._load = self._count or health is not None or self._least_loaded_first
        # bound once, so a dispatch calls it with no arguments: passing dispatch_next's two
        # on every dispatch cost round-robin's ~330 instructions of ~6,900 (callgrind)
        self._first_pick = self._native_first_pick()
        self._hedging = hedging
        self._hedge_delay = _FIRST_HEDGE_DELAY
        self._hedge_window: tuple[float, tuple[int, ...]] | None = None
        self._latency_measured = False
        # whether the select and delegate paths time their dispatches: the balancer's load, or
        # latency measured (the native path samples in the pool instead)
        self._timed = self._load
        self._connect = connect
        self._lease = lease
        self._quorum = quorum
        self._quorum_timeout = quorum_timeout
        # counted here for the paths written in Python; the pool counts its native path
        self._dispatched = 0
        self._transient = 0
        self._broken = 0
        self._errors = 0
        self._exhausted = 0
        self._deadlines = 0
        self._outcomes_unknown = 0
        self._hedges = 0
        self._admissions = 0
        self._refreshes = 0
        self._not_admitted = 0
        self._evictions = dict.fromkeys(EVICTION_REASONS, 0)
        self._rpc_failures = dict.fromkeys(get_args(RpcReason), 0)
        self._quorum_reached = asyncio.Event()
        self._sentinel: asyncio.Task[None] | None = None
        self._started = False
        self._watcher: asyncio.Task[None] | None = None

    @property
    def workers(self) -> list[WorkerMetadata]:
        """The records of the pooled workers, in admission order."""
        return [metadata for _, metadata, _ in self._context.members()]

    def stats(self) -> ProxyStats:
        """The proxy's counts now (see :class:`ProxyStats`).

        Implementation notes:
            Read on the call: the pool's native counts (dispatches of the round-robin fast
            path, the latency histogram) from Rust, the rest from the proxy's own integers,
            which the paths written in Python add to where they already branch.
        """
        native, latency = self._context.dispatch_counts()
        ejections, readmissions, ejected = self._context.health_counts()
        budget = self._retry_budget
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
            if latency is None or not self._latency_measured
            else DispatchLatency(
                bounds=tuple(LoadBalancerContext.DISPATCH_BUCKETS),
                counts=tuple(latency[0]),
                sum=latency[1],
            ),
            deadlines=self._deadlines,
            outcomes_unknown=self._outcomes_unknown,
            retries=0 if budget is None else budget.spent,
            retries_refused=0 if budget is None else budget.refused,
            hedges=self._hedges,
            ejections=ejections,
            readmissions=readmissions,
            ejected=ejected,
        )

    def health(self, uid: uuid.UUID) -> WorkerHealth | None:
        """The passive health of the pooled worker ``uid`` now (see
        :class:`~shardline.pool.health.WorkerHealth`); None when it is not pooled."""
        return self._context.health(uid)

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
        self._latency_measured = True

    async def start(self) -> None:
        """Follows discovery in the background and waits for ``quorum`` pooled workers; with
        health on, also watches for stuck workers in the background (see the class
        docstring)."""
        self._started = True
        self._sentinel = asyncio.create_task(self._follow_discovery())
        if self._health is not None:
            self._watcher = asyncio.create_task(self._watch_health(self._health.stuck_floor / 2))
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
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()  # it only ever waits or reads the pool: it ends at once
        sentinel, self._sentinel = self._sentinel, None
        if sentinel is not None:
            await cancel_and_wait(sentinel)

    async def _watch_health(self, interval: float) -> None:
        """Has the pool look for stuck workers every ``interval`` seconds while dispatches are
        in flight, every ``_IDLE_WATCH`` seconds while none are.

        Implementation notes:
            The pool also checks a worker when it hands it out or a dispatch ends, but a
            stalled worker soon holds every caller, and then neither happens until their
            deadlines: this timer is what ejects it within tens of milliseconds. A check is
            one pass over the pool in Rust, reading two counters per worker. An idle proxy
            waking 100 times a second cost 2% of a core; idle, nothing can be stuck, so the
            timer slows down, and the first check after calls begin comes within
            ``_IDLE_WATCH``.
        """
        context = self._context
        while True:
            pending, busy = context.check_health()
            if pending:
                self._report_health()
            await asyncio.sleep(interval if busy else max(interval, _IDLE_WATCH))

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
        pooled = self._context.pooled(metadata.uid)
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
        pooled = self._context.pooled(metadata.uid)
        if pooled is None:
            return False
        self._context.remove_worker(metadata)
        _close(pooled[1])
        return True

    def _count_reason(self, error: RpcError) -> None:
        # a plugin's subclass may skip RpcError.__init__, or set a word of its own
        reason = getattr(error, "reason", "unspecified")
        self._rpc_failures[reason if reason in self._rpc_failures else "unspecified"] += 1

    def _evict_broken(self, metadata: WorkerMetadata | None, error: RpcError) -> None:
        self._broken += 1
        self._count_reason(error)
        if metadata is not None and self._evict(metadata):
            self._evictions["broken"] += 1
            logger.info("worker %s at %s evicted: %s", metadata.uid, metadata.address, error)

    def explain(self, task: Any) -> DispatchExplanation:
        """The candidates the balancer would offer ``task`` now, in order, and why, without
        dispatching and without changing the balancer's state or the pool's (a round-robin
        rotation stays where it stands).

        The answer (:class:`~shardline.balancers.explanation.DispatchExplanation`) names the
        balancer and how the proxy drives it (the pool's rotation, ``select`` or
        ``delegate``), each candidate with its record and the reason the balancer offers it,
        the pooled workers it would never offer and why (among them those passive health
        has ejected, with the reason and the time left), and, when there is no candidate,
        why not (no worker pooled, no route for the key…). Its ``first`` is the worker the
        next dispatch would try first, unless another call or a discovery event comes in
        between. Each built-in balancer explains itself exactly; a plugin without an
        ``explain_candidates`` method is driven on a copy of itself over a read-only view of
        the pool, and a plugin that cannot be copied is reported as not explainable, never
        driven. See :mod:`shardline.balancers.explanation`. Raises what the balancer raises
        for a task it cannot place at all (a keyed balancer: an unknown tier, an unhashable
        key).
        """
        protocol: DispatchProtocol = self._native or ("select" if self._select else "delegate")
        explanation = explain_dispatch(
            self._balancer, task, self._context, protocol=protocol, select=self._select
        )
        ejected = tuple(self._ejected())
        if not ejected:
            return explanation
        return dataclasses.replace(explanation, excluded=explanation.excluded + ejected)

    def _native_first_pick(self) -> Callable[[], Any] | None:
        """The pool's native first pick for this proxy's balancer as a call with no arguments
        (see :meth:`dispatch`), or None when the balancer declares none."""
        if self._native is None:
            return None
        if self._least_loaded_first:
            return self._context.dispatch_less_loaded
        if self._count:
            return functools.partial(self._context.dispatch_next, None, True)
        return self._context.dispatch_next

    def _ejected(self) -> Iterator[Excluded]:
        """The pooled workers passive health hides from the balancer now, and why."""
        if self._health is None or not self._context.health_counts()[2]:
            return
        for uid, metadata, _ in self._context.members():
            health = self._context.health(uid)
            if health is None or health.state in ("healthy", "probation"):
                continue
            if health.state == "probing":
                why = "ejected by passive health; its probe call is running"
            else:
                # the ejection's length, not the time left: two explanations of one state read
                # the same (the time left is in health(uid))
                policy = self._health
                length = min(policy.base_ejection * health.times_ejected, policy.max_ejection)
                why = (
                    f"ejected by passive health ({health.reason}) for {length:.3g} s"
                    f" (ejection {health.times_ejected}), then one probe call"
                )
            yield Excluded(uid, why, metadata)

    async def dispatch(
        self, task: Any, *, timeout: float | None = None, idempotent: bool | None = None
    ) -> Any:
        """Runs ``task`` on a worker the balancer names; see the class docstring.

        ``timeout`` (seconds; the proxy's ``timeout`` when None) is the call's one deadline:
        every attempt runs inside it, each given what remains, and the worker sees it too.
        ``idempotent`` (when None, the task's own ``idempotent`` attribute, False if it has
        none) allows sending the task again after it reached a worker whose answer never came,
        and hedging it.

        Implementation notes:
            Two loops in one coroutine (a helper coroutine per attempt would cost an extra
            frame and await on every dispatch), each with one attempt block. The ``select``
            loop: a balancer that declares a native first pick has its first candidate,
            connection and in-flight count from one Rust call (``dispatch_next`` for
            ``pool_rotation``; ``dispatch_less_loaded``, which times every dispatch, for
            ``pool_least_loaded``: the same answer's shape), and every other candidate,
            or every candidate of another ``select`` balancer, comes from ``select``. The
            ``delegate`` loop drives a generator balancer. An idempotent task on a
            ``select`` balancer with hedging on takes a third, slower path
            (:meth:`_dispatch_hedged`). The load (a count in flight and the latency, timed on
            the pool's clock in Rust) is kept when the balancer needs it or health is on,
            and each dispatch then ends with its outcome (``finish_dispatch``); the select
            and delegate paths also time every dispatch once ``measure_latency`` was called,
            round-robin's native path only those the pool asks for (a nonzero ``started``);
            otherwise the uid is resolved with a plain pool lookup. With health on, most of
            round-robin's native dispatches are token dispatches instead (see
            ``docs/architecture.md``, "Passive health"): the frame holds the worker's token
            while the call is in flight and lets go of it first thing in ``finally``, and
            reports only an outcome other than a success, so a successful call costs health
            no clock reading and no second call into the pool. The clock is read once per
            call, for the deadline; every failure is handled by :meth:`_failed`, off the path
            of a call that succeeds.
        """
        if timeout is None:
            timeout = self._timeout
        elif not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
        if idempotent is None:
            idempotent = getattr(task, "idempotent", False) is True
        deadline = _monotonic() + timeout
        context = self._context
        # a native first pick's dispatch ends as the pool asks (counted, sampled or a token's);
        # every other one is counted in flight exactly when it is timed
        counted = self._load
        failure: RpcError | None = None
        started = 0
        outcome = _NEUTRAL
        select = self._select
        if select is not None:
            if idempotent and self._hedging:
                return await self._dispatch_hedged(task, timeout, deadline)
            tried: Tried = NOTHING_TRIED
            outcomes: dict[uuid.UUID, Exception | None] | None = None  # made on a first miss
            first_pick = self._first_pick
            if first_pick is None:
                picked = None
            else:
                picked = first_pick()
                if picked is None:
                    raise self._exhausted_call(task, tried)
            while True:
                if picked is not None:
                    # the token is held only by this frame's local while the call is in flight
                    uid, metadata, connection, started, token = picked
                    picked = None
                else:
                    uid = select(task, context=context, tried=tried)
                    if uid is None:
                        raise self._exhausted_call(task, tried) from failure
                    if outcomes is not None and uid in outcomes:
                        raise RuntimeError(
                            f"balancer {self._balancer!r} offered worker {uid} twice in one call"
                        )
                    counted, started, token = self._timed, 0, None
                    try:
                        if counted:
                            metadata, connection, started = context.start_dispatch(uid)
                        else:
                            metadata, connection = context.entry(uid)
                    except KeyError:  # it left the pool or was ejected: skipped, not failed
                        if outcomes is None:
                            outcomes = {}
                            tried = MappingProxyType(outcomes)
                        outcomes[uid] = None
                        continue
                    self._dispatched += 1
                try:
                    result = await connection.dispatch(
                        task,
                        timeout=timeout
                        if outcomes is None
                        else self._remaining(task, timeout, deadline, tried),
                    )
                except RpcError as error:
                    failure = error
                    outcome = _outcome_of(error)
                except BaseException as error:
                    self._errors += 1
                    outcome = _SUCCESS if isinstance(error, WorkerError) else _NEUTRAL
                    raise
                else:
                    outcome = _SUCCESS
                    return result
                finally:
                    del token  # the call is over: a token dispatch ends here
                    if started:  # counted for the load or health, or sampled for latency
                        if counted:
                            if context.finish_dispatch(uid, started, outcome):
                                self._report_health()
                        else:
                            context.observe_dispatch(started)
                    elif (  # a token dispatch that did not succeed
                        outcome != _SUCCESS and counted and context.finish_dispatch(uid, 0, outcome)
                    ):
                        self._report_health()
                if outcomes is None:
                    outcomes = {}
                    tried = MappingProxyType(outcomes)
                outcomes[uid] = failure
                self._failed(task, uid, metadata, failure, idempotent, timeout, deadline, tried)
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
                outcome = _NEUTRAL
                try:
                    result = await connection.dispatch(
                        task,
                        timeout=self._remaining(task, timeout, deadline, offered)
                        if offered
                        else timeout,
                    )
                except RpcError as error:
                    failure = offered[uid] = error
                    outcome = _outcome_of(error)
                except BaseException as error:
                    self._errors += 1
                    if isinstance(error, WorkerError):
                        outcome = _SUCCESS
                    raise
                else:
                    outcome = _SUCCESS
                finally:
                    if timed and context.finish_dispatch(dispatched, started, outcome):
                        self._report_health()
                if outcome != _SUCCESS:
                    assert failure is not None
                    self._failed(
                        task, uid, metadata, failure, idempotent, timeout, deadline, offered
                    )
                    uid = await candidates.athrow(failure)
                    continue
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

    def stream(
        self, task: Any, *, timeout: float | None = None, idempotent: bool | None = None
    ) -> ProxyStream:
        """The items of ``task``'s handler, an async generator on the worker, as an async
        iterator (see :class:`~shardline.proxy_stream.ProxyStream`: flow control, errors,
        leaving early, health)::

            async for item in proxy.stream(Task("count", 10)):
                ...

        ``timeout`` (the proxy's ``timeout`` when None) bounds the whole stream, from this call
        to its last item; ``idempotent`` is dispatch's, and matters only before the first item:
        a stream is never sent again once an item came. Nothing is sent until the first item
        is asked for. Only a msgpack connection streams (another raises
        ``NotImplementedError``); a handler that is not an async generator is a
        ``WorkerError`` (``shardline.BadRequest``), as is an async generator given to
        :meth:`dispatch`."""
        if timeout is None:
            timeout = self._timeout
        elif not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
        if idempotent is None:
            idempotent = getattr(task, "idempotent", False) is True
        return ProxyStream(self, task, timeout, idempotent)

    def _failed(
        self,
        task: Any,
        uid: uuid.UUID,
        metadata: WorkerMetadata | None,
        error: RpcError,
        idempotent: bool,
        timeout: float,
        deadline: float,
        tried: Mapping[uuid.UUID, Exception | None],
    ) -> None:
        """Counts a dispatch that raised ``error`` (evicting the worker unless the error is
        transient), then ends the call when it must end: its deadline passed
        (:class:`~shardline.DeadlineExceeded`), the task reached the worker and is not
        idempotent (:class:`~shardline.OutcomeUnknown`), or the retry budget is spent
        (:class:`~shardline.NoWorkersAvailable`). Returns when the call may try another
        worker."""
        if isinstance(error, TransientRpcError):
            self._transient += 1
            self._count_reason(error)
        else:
            self._evict_broken(metadata, error)
        if getattr(error, "reason", None) == "deadline" or _monotonic() >= deadline:
            raise self._deadline_exceeded(task, timeout, tried, error) from error
        if getattr(error, "sent", False) and not idempotent:
            address = getattr(error, "address", None) or (
                None if metadata is None else metadata.address
            )
            self._outcomes_unknown += 1
            raise OutcomeUnknown(
                f"the task {task!r} reached worker {uid} at {address} and may have run"
                f" there; it is not idempotent, so it was not sent again: {error}",
                reason=getattr(error, "reason", "unspecified"),
                address=address,
                uid=uid,
            ) from error
        budget = self._retry_budget
        if budget is not None and not budget.take(self._dispatch_count(), _monotonic()):
            self._exhausted += 1
            raise NoWorkersAvailable(
                f"no worker could take the task {task!r}: {uid} failed ({error}) and the"
                f" proxy's retry budget is spent (retries: {budget.spent} allowed,"
                f" {budget.refused} refused)"
            ) from error

    def _remaining(
        self,
        task: Any,
        timeout: float,
        deadline: float,
        tried: Mapping[uuid.UUID, Exception | None],
    ) -> float:
        """The seconds left to the call's deadline, for an attempt after the first;
        :class:`~shardline.DeadlineExceeded` when none are."""
        remaining = deadline - _monotonic()
        if remaining <= 0:
            raise self._deadline_exceeded(task, timeout, tried, None)
        return remaining

    def _deadline_exceeded(
        self,
        task: Any,
        timeout: float,
        tried: Mapping[uuid.UUID, Exception | None],
        error: RpcError | None,
    ) -> DeadlineExceeded:
        """The error of a call whose deadline passed; ``error`` is the last attempt's failure
        (None when the deadline passed between attempts)."""
        self._deadlines += 1
        attempts = tuple(
            (uid, getattr(failed, "address", None), getattr(failed, "reason", "unspecified"))
            for uid, failed in tried.items()
            if failed is not None
        )
        may_have_run = error is not None and bool(getattr(error, "sent", False))
        address = getattr(error, "address", None) if may_have_run else None
        where = (
            f"; the task was sent to the worker at {address} and may have run there"
            if may_have_run
            else "; the task did not reach a worker that could still run it"
        )
        shown = ", ".join(f"{uid} ({reason})" for uid, _, reason in attempts) or "none"
        return DeadlineExceeded(
            f"the deadline of {timeout:g} s for the task {task!r} passed{where};"
            f" workers tried: {shown}",
            timeout=timeout,
            tried=attempts,
            may_have_run=may_have_run,
            address=address,
        )

    async def _dispatch_hedged(self, task: Any, timeout: float, deadline: float) -> Any:
        """An idempotent task on a ``select`` balancer: the first attempt as on the other
        paths; if it has not answered within the hedge delay, a second attempt on the next
        candidate (a retry, so it draws on the retry budget), the first answer wins and the
        other attempt is cancelled (on the wire: the worker cancels its handler). A failure
        goes on to the next candidate, whether or not the task reached the worker.

        Implementation notes:
            Each attempt is a task of :meth:`_attempt`, which ends the pool's count of it
            with its outcome; a cancelled loser ends neutral (no health signal). The delay
            is :meth:`_hedge_delay_now`, read once per call.
        """
        context = self._context
        select = self._select
        assert select is not None
        loop = asyncio.get_running_loop()
        outcomes: dict[uuid.UUID, Exception | None] = {}
        tried = MappingProxyType(outcomes)
        running: dict[asyncio.Task[Any], uuid.UUID] = {}
        failure: RpcError | None = None
        delay = self._hedge_delay_now()
        hedged = False  # once a hedge was sent, or refused by the budget
        start_next = True
        try:
            while True:
                while start_next:
                    uid = select(task, context=context, tried=tried)
                    if uid is None:
                        if running:
                            break
                        raise self._exhausted_call(task, tried) from failure
                    if uid in outcomes:
                        raise RuntimeError(
                            f"balancer {self._balancer!r} offered worker {uid} twice in one call"
                        )
                    outcomes[uid] = None
                    try:
                        metadata, connection, started = context.start_dispatch(uid)
                    except KeyError:  # it left the pool or was ejected: skipped
                        continue
                    self._dispatched += 1
                    remaining = self._remaining(task, timeout, deadline, tried)
                    attempt = loop.create_task(
                        self._attempt(uid, connection, started, task, remaining)
                    )
                    running[attempt] = uid
                    start_next = False
                wait = deadline - _monotonic()
                if not hedged and len(running) == 1:
                    wait = min(wait, delay)
                done, _ = await asyncio.wait(
                    running, timeout=max(wait, 0.0), return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    if _monotonic() >= deadline:
                        late = TransientRpcError(
                            "no answer before the deadline", reason="deadline", sent=True
                        )
                        raise self._deadline_exceeded(task, timeout, tried, late)
                    hedged = True
                    budget = self._retry_budget
                    if budget is None or budget.take(self._dispatch_count(), _monotonic()):
                        self._hedges += 1
                        start_next = True
                    continue
                for attempt in done:
                    uid = running.pop(attempt)
                    try:
                        return attempt.result()
                    except RpcError as error:
                        failure = outcomes[uid] = error
                        pooled = context.pooled(uid)
                        metadata = pooled[0] if pooled is not None else None
                        self._failed(task, uid, metadata, error, True, timeout, deadline, tried)
                start_next = not running
        finally:
            for attempt in running:
                attempt.cancel()
            if running:
                await asyncio.wait(running)

    async def _attempt(
        self, uid: uuid.UUID, connection: Connection, started: int, task: Any, timeout: float
    ) -> Any:
        """One attempt of a hedged call, counted in the pool from ``start_dispatch`` (which
        returned ``started``) to its outcome."""
        outcome = _NEUTRAL
        try:
            result = await connection.dispatch(task, timeout=timeout)
        except RpcError as error:
            outcome = _outcome_of(error)
            raise
        except asyncio.CancelledError:  # the losing attempt, or the caller's cancellation
            raise
        except BaseException as error:  # it reaches the caller
            self._errors += 1
            if isinstance(error, WorkerError):
                outcome = _SUCCESS
            raise
        else:
            outcome = _SUCCESS
            return result
        finally:
            if self._context.finish_dispatch(uid, started, outcome):
                self._report_health()

    def _hedge_delay_now(self) -> float:
        """The delay before a hedge: the 95th percentile of the dispatch latencies of the
        latest window of at least ``_HEDGE_SAMPLES`` dispatches, refreshed at most every
        ``_HEDGE_REFRESH`` seconds from the pool's histogram."""
        now = _monotonic()
        window = self._hedge_window
        if window is not None and now - window[0] < _HEDGE_REFRESH:
            return self._hedge_delay
        _, latency = self._context.dispatch_counts()
        if latency is None:  # the first hedged call: the delay is read off the histogram
            self._context.time_dispatches()
            return self._hedge_delay
        counts = tuple(latency[0])
        if window is None:
            self._hedge_window = (now, counts)
            return self._hedge_delay
        recent = [now_count - then for now_count, then in zip(counts, window[1], strict=True)]
        total = sum(recent)
        if total < _HEDGE_SAMPLES:
            return self._hedge_delay
        cumulative = list(itertools.accumulate(recent))
        bucket = bisect.bisect_left(cumulative, _HEDGE_PERCENTILE * total)
        bounds = LoadBalancerContext.DISPATCH_BUCKETS
        bound = bounds[min(bucket, len(bounds) - 1)]
        self._hedge_delay = max(bound, _MIN_HEDGE_DELAY)
        self._hedge_window = (now, counts)
        return self._hedge_delay

    def _report_health(self) -> None:
        """Logs the pool's health events (ejections, re-admissions) at INFO."""
        for uid, metadata, kind, reason, seconds in self._context.drain_health_events():
            if kind == "ejected":
                logger.info(
                    "worker %s at %s ejected for %g s (%s)",
                    uid,
                    metadata.address,
                    seconds,
                    reason,
                )
            else:
                logger.info(
                    "worker %s at %s re-admitted: its probe succeeded", uid, metadata.address
                )

    def _dispatch_count(self) -> int:
        return self._context.dispatch_counts()[0] + self._dispatched

    def _exhausted_call(
        self, task: Any, tried: Mapping[uuid.UUID, Exception | None]
    ) -> NoWorkersAvailable | RuntimeError:
        """Counts a call whose balancer offered nobody more, and makes its error: a
        ``RuntimeError`` when the proxy was never started, so its pool is empty for that
        reason (checked here, off the path of a call that finds a worker)."""
        if not self._started:
            return RuntimeError(
                "the WorkerProxy was not started: dispatch inside `async with proxy:` (or"
                " after `await proxy.start()`), once discovery has brought workers"
            )
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
