"""Conformance checks for balancers, to run in a balancer plugin's own test suite.

A plugin (see :mod:`shardline.balancers.registry`) checks its balancer with::

    from shardline.balancer_conformance import check_balancer

    def test_my_balancer_conforms() -> None:
        check_balancer(MyLoadBalancer)

or with one pytest test per property::

    import pytest
    from shardline.balancer_conformance import CHECKS

    @pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
    def test_my_balancer(check) -> None:
        check(MyLoadBalancer)

Every check takes ``factory``, a callable without arguments that returns a new balancer (the
class itself; or ``lambda: create_balancer("my-balancer")`` to go through the registered name),
and ``make_task``, which makes the n-th task the check asks the balancer about (default: the
strings ``"task-0"``, ``"task-1"``…; pass your own if your balancer reads the task). Each check
runs once through each protocol the balancer has (:mod:`shardline.balancers.protocol`):
``select`` and ``delegate``, for a :class:`~shardline.SelectLoadBalancer` both (its
``delegate`` is derived from ``select``). It drives them as :class:`~shardline.WorkerProxy`
does, on the proxy's own pool
(:class:`~shardline.LoadBalancerContext`, its loads kept as the proxy keeps them) of workers
with plain records (no tags, no ``extra``). Through ``delegate``: a candidate no longer pooled
is skipped with ``anext``, a failure is thrown in as :class:`~shardline.TransientRpcError` or,
after the worker was evicted, as :class:`~shardline.RpcError`, a success is sent as the uid,
and the generator is closed at the end. Through ``select``: the same outcomes are recorded in
``tried`` (``None`` for a candidate no longer pooled), and ``select`` is not asked again after
a success. An object without ``delegate`` fails every check: a balancer that implements only
``select`` gets it by subclassing :class:`~shardline.SelectLoadBalancer`. At the first
violation a check raises ``AssertionError`` naming the property, the balancer and protocol, the
scenario and what was offered (workers are named ``w1``, ``w2``… in the order they joined).
The checks are deterministic (seeded) and run their own event loops, so call them from
synchronous code; each takes well under a second for a balancer that does O(pool) work per
candidate. A ``select`` that never returns cannot be interrupted (it is a plain call): the
check then hangs.

The properties:

- :func:`check_no_repeats`: a call never offers the same worker twice, and offers only workers
  that are or were pooled, whatever mix of failures, evictions and successes it meets.
- :func:`check_ends_after_success`: once a candidate served the task the call ends (yielding
  again is what the proxy reports as ``RuntimeError``), and a call closed before its end (the
  proxy closes it when a dispatch raises an error of the caller's) closes without an error.
- :func:`check_offers_every_worker`: when every candidate fails, a call offers each pooled
  worker before it ends, after any earlier calls and changes to the pool; on an empty pool it
  ends at once. A call may end by raising :class:`~shardline.NoWorkersAvailable` (the proxy
  lets it through), but only once it has offered everyone.
- :func:`check_workers_leaving`: workers leaving mid-call (evicted after a failure, or dropped
  by discovery, offered or not yet) and joining never break a call: it raises nothing, ends,
  offers no worker twice and offers every worker pooled from its start to its end.
- :func:`check_concurrent_calls`: calls on one balancer and pool, interleaved step by step as
  concurrent dispatches interleave on an event loop, each keep the properties above; and
  concurrent dispatches through a real ``WorkerProxy``, with workers failing at random, each
  end with a result or ``NoWorkersAvailable``.

Scope: the checks are for balancers that choose among the pooled workers, any of which can
serve any task. One that leaves some out by design (by weight, say) fails
:func:`check_offers_every_worker`; run the other checks for it. One whose candidates do not
come from the pool, such as :class:`~shardline.BucketLoadBalancer` (the masters a topology
names for a task's key), is beyond what these checks can judge.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import random
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
from types import MappingProxyType
from typing import Any, Final, Literal

from shardline.balancers.protocol import LoadBalancerLike, select_of
from shardline.errors import NoWorkersAvailable, RpcError, TransientRpcError
from shardline.pool.context import LoadBalancerContext
from shardline.proxy import WorkerProxy
from shardline.workers import DiscoveryEvent, WorkerMetadata

__all__ = [
    "CHECKS",
    "check_balancer",
    "check_concurrent_calls",
    "check_ends_after_success",
    "check_no_repeats",
    "check_offers_every_worker",
    "check_workers_leaving",
]

Factory = Callable[[], LoadBalancerLike]
MakeTask = Callable[[int], Any]

# How long one step of `delegate` may take before a check reports that it hung: the built-in
# balancers take microseconds, and a balancer must never wait for the pool to change.
_STEP_TIMEOUT: Final = 10.0
_POOL_SIZES: Final = (1, 2, 3, 5, 8)
_NAMESPACE: Final = uuid.UUID("5f0c2a4e-3b1d-4c6f-9a8e-7d2b1c0e4f3a")

# What the driver answers for a pooled candidate.
Answer = Literal["serve", "fail", "evict"]


def _default_task(n: int) -> str:
    return f"task-{n}"


class _Pool:
    """The proxy's pool, with workers named ``w1``, ``w2``… in the order they joined."""

    def __init__(self, size: int) -> None:
        self.context = LoadBalancerContext()
        self.records: dict[uuid.UUID, WorkerMetadata] = {}
        self.names: dict[uuid.UUID, str] = {}
        for _ in range(size):
            self.join()

    def join(self) -> uuid.UUID:
        n = len(self.names) + 1
        uid = uuid.uuid5(_NAMESPACE, f"w{n}")
        record = WorkerMetadata(uid=uid, address=f"127.0.0.1:{7000 + n}", pid=n, version="1")
        self.records[uid] = record
        self.names[uid] = f"w{n}"
        self.context.add_worker(record, f"connection to w{n}")
        return uid

    def leave(self, uid: uuid.UUID) -> None:
        self.context.remove_worker(self.records[uid])

    def pooled(self) -> list[uuid.UUID]:
        return list(self.context.uids())

    def name(self, uid: object) -> str:
        return self.names.get(uid, repr(uid)) if isinstance(uid, uuid.UUID) else repr(uid)

    def show(self, uids: Iterable[object]) -> str:
        shown = [self.name(uid) for uid in uids]
        return f"[{', '.join(shown)}]"

    def broke(self, uid: uuid.UUID) -> RpcError:
        """The failure of a dispatch to ``uid`` that evicts it."""
        return RpcError(f"{self.name(uid)} broke", address=self.records[uid].address)

    def busy(self, uid: uuid.UUID) -> TransientRpcError:
        """The failure of a dispatch to ``uid`` that keeps it pooled."""
        return TransientRpcError(
            f"{self.name(uid)} is busy", reason="busy", address=self.records[uid].address
        )


class _Call:
    """One call of ``delegate``, driven one exchange at a time as ``WorkerProxy.dispatch``
    drives it; ``answer(call, uid)`` decides how each pooled candidate's dispatch ends."""

    def __init__(
        self,
        balancer: LoadBalancerLike,
        pool: _Pool,
        task: Any,
        answer: Callable[[_Call, uuid.UUID], Answer],
        where: str,
        rng: random.Random,
    ) -> None:
        self.pool = pool
        self.answer = answer
        self.where = where
        self.rng = rng
        self.task = task
        self.select = select_of(balancer) if _protocol.get() == "select" else None
        # through select: each offered candidate's outcome, the ``tried`` the proxy passes
        self.outcomes: dict[uuid.UUID, Exception | None] = {}
        self.generator: AsyncGenerator[uuid.UUID, uuid.UUID | None] | None = None
        if self.select is None:
            self.generator = balancer.delegate(task, context=pool.context)
        self.at_start = set(pool.pooled())
        self.offered: list[uuid.UUID] = []
        self.candidate: uuid.UUID | None = None
        self.in_flight = False  # the candidate's dispatch began (the proxy's begin_dispatch)
        self.started = False
        # once ended: "served", "exhausted" (the generator finished), "gave up" (it raised
        # NoWorkersAvailable) or "overran" (it offered more candidates than workers ever pooled)
        self.ending: str | None = None
        self.after_success: uuid.UUID | None = None

    @property
    def ended(self) -> bool:
        return self.ending is not None

    def begin(self) -> None:
        """The proxy's resolution of the candidate it was just given."""
        uid = self.candidate
        if uid is not None and uid in self.pool.context:
            self.pool.context.begin_dispatch(uid)
            self.in_flight = True

    async def step(self) -> None:
        """One exchange: the first ``anext``, or the answer to the last candidate."""
        if self.generator is None:
            self._select_step()
            return
        if not self.started:
            self.started = True
            await self._exchange(anext(self.generator))
            return
        uid = self.candidate
        assert uid is not None
        if not self.in_flight:  # it left before the proxy resolved it: skipped, nothing reported
            await self._exchange(anext(self.generator))
            return
        self.in_flight = False
        self.pool.context.end_dispatch(uid, self.rng.uniform(0.001, 0.1))
        answer = self.answer(self, uid)
        if answer == "serve":
            await self._exchange(self.generator.asend(uid), served=uid)
        elif answer == "evict":
            if uid in self.pool.context:
                self.pool.leave(uid)
            await self._exchange(self.generator.athrow(self.pool.broke(uid)))
        else:
            await self._exchange(self.generator.athrow(self.pool.busy(uid)))

    def _select_step(self) -> None:
        """The same exchange through ``select``: the outcome goes into ``tried``."""
        if self.started:
            uid = self.candidate
            assert uid is not None
            if not self.in_flight:  # it left before the proxy resolved it
                self.outcomes[uid] = None
            else:
                self.in_flight = False
                self.pool.context.end_dispatch(uid, self.rng.uniform(0.001, 0.1))
                answer = self.answer(self, uid)
                if answer == "serve":
                    self.ending = "served"
                    return
                if answer == "evict":
                    if uid in self.pool.context:
                        self.pool.leave(uid)
                    self.outcomes[uid] = self.pool.broke(uid)
                else:
                    self.outcomes[uid] = self.pool.busy(uid)
        self.started = True
        assert self.select is not None
        try:
            uid = self.select(
                self.task, context=self.pool.context, tried=MappingProxyType(self.outcomes)
            )
        except NoWorkersAvailable:
            self.ending = "gave up"
            return
        except Exception as error:
            raise AssertionError(
                f"{self.where}: select raised {error!r} after offering"
                f" {self.pool.show(self.offered)}"
            ) from error
        if uid is None:
            self.ending = "exhausted"
            return
        self._offer(uid)

    async def _exchange(self, step: Any, served: uuid.UUID | None = None) -> None:
        timeout = asyncio.timeout(_STEP_TIMEOUT)
        try:
            async with timeout:
                uid = await step
        except StopAsyncIteration:
            self.ending = "exhausted" if served is None else "served"
        except NoWorkersAvailable:
            self.ending = "gave up" if served is None else "served"
        except Exception as error:
            if isinstance(error, TimeoutError) and timeout.expired():
                raise AssertionError(
                    f"{self.where}: delegate did not answer within {_STEP_TIMEOUT} s after"
                    f" offering {self.pool.show(self.offered)}"
                ) from None
            raise AssertionError(
                f"{self.where}: delegate raised {error!r} after offering"
                f" {self.pool.show(self.offered)}"
            ) from error
        else:
            if served is not None:
                self.after_success = uid
                self.ending = "served"
            else:
                self._offer(uid)
        if self.ended:
            await self.close()

    def _offer(self, uid: uuid.UUID) -> None:
        """Takes ``uid``, offered by ``select`` or ``delegate``, as the call's candidate; a
        call that has offered more candidates than the pool has workers, and one more, has
        overrun, and ends."""
        self.offered.append(uid)
        self.candidate = uid
        if len(self.offered) > len(self.pool.names) + 1:
            self.ending = "overran"
        else:
            self.begin()

    async def close(self) -> None:
        """The proxy's ``finally``: the generator is closed, whether or not it finished
        (through ``select`` there is nothing to close)."""
        if self.generator is None:
            return
        try:
            async with asyncio.timeout(_STEP_TIMEOUT):
                await self.generator.aclose()
        except Exception as error:
            await self._drain()
            raise AssertionError(
                f"{self.where}: closing the call raised {error!r} after it offered"
                f" {self.pool.show(self.offered)}"
            ) from error

    async def _drain(self) -> None:
        """Runs a generator that yielded when closed to its end, so that no broken call outlives
        the check (its finalizer would fail again when it is collected); bounded, as it may
        never end. A second ``aclose`` would not do: it returns at once and leaves the frame."""
        assert self.generator is not None
        for _ in range(len(self.pool.names) + 2):
            try:
                async with asyncio.timeout(_STEP_TIMEOUT):
                    await anext(self.generator)
            except Exception:  # its end, whether StopAsyncIteration or an error
                return

    async def run(self) -> _Call:
        while not self.ended:
            await self.step()
        return self


def _where(title: str, balancer: LoadBalancerLike, scenario: str) -> str:
    return f"{title}: balancer {balancer!r} through {_protocol.get()}, {scenario}"


_protocol: contextvars.ContextVar[str] = contextvars.ContextVar("_protocol", default="delegate")


def _protocols(balancer: object) -> list[str]:
    """The protocols a check drives ``balancer`` through: ``select`` if it has it, then
    ``delegate``, which every balancer has; empty for an object without ``delegate``."""
    if not callable(getattr(balancer, "delegate", None)):
        return []
    return ["select", "delegate"] if select_of(balancer) is not None else ["delegate"]


def _each_protocol(check: Callable[..., None]) -> Callable[..., None]:
    """``check``, run once through each protocol the factory's balancers have."""

    @functools.wraps(check)
    def run(factory: Factory, *, make_task: MakeTask = _default_task) -> None:
        balancer = factory()
        protocols = _protocols(balancer)
        if not protocols:
            raise AssertionError(
                f"{check.__name__}: {balancer!r} has no delegate(task, *, context), so it is not"
                " a balancer (one that implements only select subclasses SelectLoadBalancer)"
            )
        for protocol in protocols:
            token = _protocol.set(protocol)
            try:
                check(factory, make_task=make_task)
            finally:
                _protocol.reset(token)

    return run


def _fail_all(_call: _Call, _uid: uuid.UUID) -> Answer:
    return "fail"


def _serve_all(_call: _Call, _uid: uuid.UUID) -> Answer:
    return "serve"


def _evict_all(_call: _Call, _uid: uuid.UUID) -> Answer:
    return "evict"


def _assert_ended(call: _Call) -> None:
    if call.ending == "overran":
        raise AssertionError(
            f"{call.where}: the call did not end; it offered {call.pool.show(call.offered)},"
            f" more candidates than the {len(call.pool.names)} workers ever pooled"
        )


def _assert_no_repeats(call: _Call) -> None:
    seen: set[uuid.UUID] = set()
    for uid in call.offered:
        if uid in seen:
            raise AssertionError(
                f"{call.where}: {call.pool.name(uid)} was offered twice in one call; offered"
                f" {call.pool.show(call.offered)}"
            )
        if uid not in call.pool.records:
            raise AssertionError(
                f"{call.where}: offered {uid!r}, which was never pooled; offered"
                f" {call.pool.show(call.offered)}"
            )
        seen.add(uid)


def _assert_ends_after_success(call: _Call) -> None:
    if call.after_success is not None:
        raise AssertionError(
            f"{call.where}: after {call.pool.name(call.offered[-1])} served the task, the call"
            f" offered {call.pool.name(call.after_success)} instead of ending (the proxy raises"
            f" RuntimeError); offered {call.pool.show(call.offered)}"
        )


def _assert_offered_everyone(call: _Call, required: Iterable[uuid.UUID]) -> None:
    missing = [uid for uid in required if uid not in call.offered]
    if missing and call.ending != "served":
        how = "raised NoWorkersAvailable" if call.ending == "gave up" else "ended"
        raise AssertionError(
            f"{call.where}: the call {how} without offering {call.pool.show(missing)};"
            f" offered {call.pool.show(call.offered)}"
        )


NO_REPEATS: Final = "never offers a worker twice in one call"


@_each_protocol
def check_no_repeats(factory: Factory, *, make_task: MakeTask = _default_task) -> None:
    """Raises ``AssertionError`` unless every call offers each worker at most once and only
    workers that are or were pooled; see the module docstring."""
    for seed in range(40):
        rng = random.Random(seed)
        size = rng.choice(_POOL_SIZES)
        balancer, pool = factory(), _Pool(size)

        def answer(_call: _Call, _uid: uuid.UUID, rng: random.Random = rng) -> Answer:
            return rng.choices(("serve", "fail", "evict"), (1, 2, 1))[0]

        for n in range(6):
            scenario = f"pool of {size} at first, random failures (seed {seed}), call {n + 1}"
            where = _where(NO_REPEATS, balancer, scenario)
            call = asyncio.run(_Call(balancer, pool, make_task(n), answer, where, rng).run())
            _assert_no_repeats(call)
            _assert_ended(call)
            while len(pool.context) < size:  # evicted workers are replaced by new ones
                pool.join()


ENDS_AFTER_SUCCESS: Final = "ends once a candidate served the task"


@_each_protocol
def check_ends_after_success(factory: Factory, *, make_task: MakeTask = _default_task) -> None:
    """Raises ``AssertionError`` unless a call ends as soon as a candidate served the task, and
    a call closed before its end closes cleanly; see the module docstring."""
    rng = random.Random(0)
    for size in _POOL_SIZES:
        balancer, pool = factory(), _Pool(size)
        for k in range(1, size + 1):

            def answer(call: _Call, _uid: uuid.UUID, k: int = k) -> Answer:
                return "serve" if len(call.offered) >= k else "fail"

            failing = f"candidates 1 to {k - 1} failing, " if k > 1 else ""
            scenario = f"pool of {size}, {failing}candidate {k} serving"
            where = _where(ENDS_AFTER_SUCCESS, balancer, scenario)
            call = asyncio.run(_Call(balancer, pool, make_task(k), answer, where, rng).run())
            _assert_ends_after_success(call)
            _assert_ended(call)
        for failures in (0, 1):
            scenario = f"pool of {size}, the call closed after {failures} failure(s)"
            where = _where(ENDS_AFTER_SUCCESS, balancer, scenario)
            asyncio.run(_abandon(balancer, pool, make_task(0), failures, where, rng))


async def _abandon(
    balancer: LoadBalancerLike,
    pool: _Pool,
    task: Any,
    failures: int,
    where: str,
    rng: random.Random,
) -> None:
    """A call closed mid-way, as the proxy closes it when a dispatch raises a caller's error."""
    call = _Call(balancer, pool, task, _fail_all, where, rng)
    while not call.ended and (not call.started or len(call.offered) <= failures):
        await call.step()
    if not call.ended:
        if call.in_flight:
            pool.context.end_dispatch(call.offered[-1], 0.01)
        await call.close()


EVERY_WORKER: Final = "offers every pooled worker before giving up"


@_each_protocol
def check_offers_every_worker(factory: Factory, *, make_task: MakeTask = _default_task) -> None:
    """Raises ``AssertionError`` unless a call whose candidates all fail offers every pooled
    worker before it ends; see the module docstring."""
    rng = random.Random(0)
    balancer, pool = factory(), _Pool(0)
    where = _where(EVERY_WORKER, balancer, "an empty pool")
    call = asyncio.run(_Call(balancer, pool, make_task(0), _fail_all, where, rng).run())
    if call.offered:
        raise AssertionError(f"{where}: offered {pool.show(call.offered)}")
    for size in _POOL_SIZES:
        balancer, pool = factory(), _Pool(size)
        history = "first call"
        for n in range(8):
            scenario = f"pool of {size}, every candidate failing, after: {history}"
            where = _where(EVERY_WORKER, balancer, scenario)
            required = pool.pooled()
            call = asyncio.run(_Call(balancer, pool, make_task(n), _fail_all, where, rng).run())
            _assert_ended(call)
            _assert_offered_everyone(call, required)
            # between the failing calls: served calls move a stateful balancer on, and the pool
            # changes (one worker leaves, a new one joins)
            history = f"{n + 1} failing and {n % 3 + 1} served call(s)"
            served = _where(
                EVERY_WORKER, balancer, f"pool of {size}, a served call after {history}"
            )
            for m in range(n % 3 + 1):
                asyncio.run(_Call(balancer, pool, make_task(m), _serve_all, served, rng).run())
            if n % 2:
                pool.leave(rng.choice(pool.pooled()))
                pool.join()
                history += ", a worker replaced"
        scenario = f"pool of {size}, every candidate failing and evicted"
        where = _where(EVERY_WORKER, balancer, scenario)
        required = pool.pooled()
        call = asyncio.run(_Call(balancer, pool, make_task(0), _evict_all, where, rng).run())
        _assert_ended(call)
        _assert_offered_everyone(call, required)


LEAVING: Final = "tolerates workers leaving mid-call"


@_each_protocol
def check_workers_leaving(factory: Factory, *, make_task: MakeTask = _default_task) -> None:
    """Raises ``AssertionError`` unless a call stays correct while workers leave and join
    mid-call; see the module docstring."""
    for seed in range(60):
        rng = random.Random(seed)
        size = rng.choice(_POOL_SIZES[1:])
        balancer, pool = factory(), _Pool(size)
        for m in range(rng.randrange(size + 1)):  # a stateful balancer's state moved on
            warm_up = _where(LEAVING, balancer, f"pool of {size}, served call {m + 1}")
            asyncio.run(_Call(balancer, pool, make_task(m), _serve_all, warm_up, rng).run())
        scenario = f"pool of {size} at first, workers leaving and joining (seed {seed})"
        where = _where(LEAVING, balancer, scenario)
        call = asyncio.run(_churning_call(balancer, pool, make_task(size), where, rng))
        _assert_ended(call)
        _assert_no_repeats(call)
        _assert_offered_everyone(call, sorted(call.at_start & set(pool.pooled())))


async def _churning_call(
    balancer: LoadBalancerLike, pool: _Pool, task: Any, where: str, rng: random.Random
) -> _Call:
    def answer(_call: _Call, _uid: uuid.UUID) -> Answer:
        return "evict" if rng.random() < 0.3 else "fail"

    call = _Call(balancer, pool, task, answer, where, rng)
    while not call.ended:
        await call.step()
        pooled = pool.pooled()
        if pooled and rng.random() < 0.4:  # dropped by discovery: offered, in flight, or not yet
            pool.leave(rng.choice(pooled))
        if rng.random() < 0.2:
            pool.join()
    return call


CONCURRENT: Final = "works with concurrent calls"


@_each_protocol
def check_concurrent_calls(factory: Factory, *, make_task: MakeTask = _default_task) -> None:
    """Raises ``AssertionError`` unless interleaved calls on one balancer and pool each keep
    the properties, directly and through a ``WorkerProxy``; see the module docstring."""
    for seed in range(40):
        rng = random.Random(seed)
        size = rng.choice(_POOL_SIZES)
        balancer, pool = factory(), _Pool(size)
        serving = rng.choice((0.0, 0.3))

        def answer(
            _call: _Call, _uid: uuid.UUID, rng: random.Random = rng, serving: float = serving
        ) -> Answer:
            return "serve" if rng.random() < serving else "fail"

        count = rng.randint(2, 6)
        scenario = (
            f"pool of {size}, {count} calls interleaved, "
            + ("every candidate failing" if not serving else "random failures")
            + f" (seed {seed})"
        )
        where = _where(CONCURRENT, balancer, scenario)
        calls = [_Call(balancer, pool, make_task(n), answer, where, rng) for n in range(count)]
        asyncio.run(_interleave(calls, rng))
        required = pool.pooled()
        for n, call in enumerate(calls):
            call.where = f"{where}, call {n + 1}"
            _assert_ended(call)
            _assert_no_repeats(call)
            _assert_ends_after_success(call)
            _assert_offered_everyone(call, required)
    balancer = factory()
    asyncio.run(_through_proxy(balancer, make_task))


async def _interleave(calls: list[_Call], rng: random.Random) -> None:
    running = list(calls)
    while running:
        call = rng.choice(running)
        await call.step()
        if call.ended:
            running.remove(call)


_dispatching: contextvars.ContextVar[list[uuid.UUID]] = contextvars.ContextVar("_dispatching")


class _FlakyWorker:
    """A connection that yields to the event loop, then fails or answers with its uid."""

    def __init__(self, uid: uuid.UUID, rng: random.Random) -> None:
        self.uid = uid
        self.rng = rng

    async def dispatch(self, task: Any, *, timeout: float | None = None) -> Any:
        _dispatching.get().append(self.uid)
        await asyncio.sleep(0)  # a dispatch is an await: other calls run meanwhile
        if self.rng.random() < 0.6:
            raise TransientRpcError("busy", reason="busy")
        return self.uid


async def _through_proxy(balancer: LoadBalancerLike, make_task: MakeTask) -> None:
    size, count = 5, 40
    pool = _Pool(size)
    rng = random.Random(0)
    where = _where(
        CONCURRENT,
        balancer,
        f"{count} concurrent dispatches through a WorkerProxy over {size} workers failing at"
        " random (TransientRpcError)",
    )
    idle = asyncio.Event()

    async def discovery() -> AsyncIterator[DiscoveryEvent]:
        for record in pool.records.values():
            yield DiscoveryEvent("worker-added", record)
        await idle.wait()

    async def one(n: int) -> tuple[list[uuid.UUID], BaseException | None]:
        dispatched: list[uuid.UUID] = []
        _dispatching.set(dispatched)
        try:
            async with asyncio.timeout(_STEP_TIMEOUT):
                await proxy.dispatch(make_task(n))
        except Exception as error:
            return dispatched, error
        return dispatched, None

    proxy = WorkerProxy(
        discovery=discovery(),
        loadbalancer=balancer,
        connect=lambda record: _FlakyWorker(record.uid, rng),
        quorum=size,
        quorum_timeout=_STEP_TIMEOUT,
        # the balancer's conformance: every worker offered, none hidden by passive health,
        # no retry refused by the budget
        health=None,
        retry_budget=None,
    )
    async with proxy:
        results = await asyncio.gather(*(one(n) for n in range(count)))
    for n, (dispatched, error) in enumerate(results):
        shown = pool.show(dispatched)
        if error is not None and not isinstance(error, NoWorkersAvailable):
            raise AssertionError(
                f"{where}: dispatch {n + 1} raised {error!r} after dispatching to {shown}"
            ) from error
        if len(set(dispatched)) != len(dispatched):
            raise AssertionError(f"{where}: dispatch {n + 1} reached a worker twice: {shown}")
        if error is not None and len(dispatched) < size:
            raise AssertionError(
                f"{where}: dispatch {n + 1} raised NoWorkersAvailable after dispatching only to"
                f" {shown}"
            )


CHECKS: Final[tuple[Callable[..., None], ...]] = (
    check_no_repeats,
    check_ends_after_success,
    check_offers_every_worker,
    check_workers_leaving,
    check_concurrent_calls,
)
"""Every check, in the order :func:`check_balancer` runs them (for ``pytest.mark.parametrize``)."""


def check_balancer(factory: Factory, *, make_task: MakeTask = _default_task) -> None:
    """Runs every check of :data:`CHECKS` against balancers made by ``factory``; raises
    ``AssertionError`` at the first violation. See the module docstring."""
    for check in CHECKS:
        check(factory, make_task=make_task)
