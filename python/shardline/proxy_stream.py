"""`ProxyStream`: the items of a streamed call through a `WorkerProxy` (`WorkerProxy.stream`)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator, Callable
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, Protocol

from shardline._closing import Closing
from shardline.errors import OutcomeUnknown, RpcError, TransientRpcError, WorkerError
from shardline.pool.context import LoadBalancerContext

if TYPE_CHECKING:
    from shardline.proxy import WorkerProxy

__all__ = ["ItemStream", "ProxyStream"]

_SUCCESS: Final = LoadBalancerContext.OUTCOME_SUCCESS
_FAILURE: Final = LoadBalancerContext.OUTCOME_FAILURE
_DEADLINE: Final = LoadBalancerContext.OUTCOME_DEADLINE
_NEUTRAL: Final = LoadBalancerContext.OUTCOME_NEUTRAL


class ItemStream(Protocol):
    """What a connection's ``stream(task, timeout=seconds)`` returns once the request is
    sent: the items, then ``StopAsyncIteration`` or the error that ended the stream (an
    ``RpcError`` saying with ``sent`` whether the task may have run, as ``dispatch``'s);
    ``close()`` cancels it on the worker."""

    async def __anext__(self) -> Any: ...

    def close(self) -> None: ...


class ProxyStream(Closing):
    """The items of one streamed call, made by :meth:`WorkerProxy.stream`: an async iterator,
    also an async context manager::

        async for item in proxy.stream(Task("tail", "log")):
            ...

    Nothing is sent until the first item is asked for. Then the balancer names a worker, as
    for a dispatch, and the stream starts there.

    **Before the first item** the rules are dispatch's: a failure before the task reached the
    worker goes to the next candidate; once it reached one, it is sent again only if it is
    idempotent, else :class:`~shardline.OutcomeUnknown`; the handler's own error is raised as
    :class:`~shardline.WorkerError`; the balancer out of candidates,
    :class:`~shardline.NoWorkersAvailable`.

    **After the first item** the stream is never sent again, idempotent or not: a failure of
    the transport (the connection lost, the worker stopped) raises
    :class:`~shardline.OutcomeUnknown` naming the worker and the items received; the
    generator's exception is raised as :class:`~shardline.WorkerError` in place of the item
    it kept from coming, after every item it yielded.

    **The deadline** (``timeout``, counted from the ``stream`` call) bounds the whole stream,
    every attempt and every item: unless the worker's end (its last item, or its error)
    arrived before it, the stream is cancelled on the worker at the deadline and the next item
    asked for raises :class:`~shardline.DeadlineExceeded`. A stream that ended in time yields
    all its items, however late they are read. A long stream needs a long ``timeout``.

    **Leaving early** (``break``, an exception in the loop body, ``aclose()``, leaving
    ``async with``, or this object being collected) cancels the stream on the worker, which
    closes its generator (its ``finally`` blocks run). The worker produces at most the
    connection's window of items (64 over msgpack) ahead of what was read.

    **Health.** A stream is one dispatch for the pool: counted in flight from its start to
    its first item (or to its end or failure, when none came), and judged then, as a
    dispatch is at its answer. A stream's length after that depends on its items and on how
    fast the caller reads, not on the worker's health, so it is not counted: a long stream
    would make a healthy worker look stuck.

    Streams need a connection with a ``stream`` method: the msgpack transport's has one; any
    other (gRPC) raises ``NotImplementedError`` naming it, before anything is sent.
    """

    def __init__(self, proxy: WorkerProxy, task: Any, timeout: float, idempotent: bool) -> None:
        self._proxy = proxy
        self._task = task
        self._timeout = timeout
        self._idempotent = idempotent
        self._deadline = time.monotonic() + timeout
        self._inner: ItemStream | None = None
        self._done = False
        self._uid: uuid.UUID | None = None
        self._address: str | None = None
        self._outcomes: dict[uuid.UUID, Exception | None] = {}
        self.received = 0
        """How many items this stream returned so far."""

    def __repr__(self) -> str:
        where = "" if self._uid is None else f", from {self._uid} at {self._address}"
        return f"ProxyStream({self._task!r}{where}, {self.received} items read)"

    def __aiter__(self) -> ProxyStream:
        return self

    async def __anext__(self) -> Any:
        inner = self._inner
        if inner is None:
            if self._done:
                raise StopAsyncIteration
            item = await self._open()
        else:
            try:
                item = await inner.__anext__()
            except StopAsyncIteration:
                self._done = True
                self._inner = None
                raise
            except RpcError as error:
                self.close()
                raise self._broke(error) from error
            except BaseException:
                self.close()
                raise
        self.received += 1
        return item

    def close(self) -> None:
        """Cancels the stream on the worker unless it ended; the iterator is exhausted."""
        self._done = True
        inner, self._inner = self._inner, None
        if inner is not None:
            inner.close()

    def __del__(self) -> None:
        # Dropped, not closed: the connection's stream cancels itself when collected, and
        # knows whether its loop still runs to send the cancel on.
        self._done = True
        self._inner = None

    async def _open(self) -> Any:
        """Starts the stream on a worker the balancer names and returns its first item.

        Implementation notes: the loop of ``WorkerProxy.dispatch``'s select and delegate
        paths, with the first item as the answer; each attempt is counted in the pool from
        ``start_dispatch`` to its first item or failure (``finish_dispatch``), and every
        failure is judged by the proxy's ``_failed``, so the rules are dispatch's own."""
        proxy = self._proxy
        task = self._task
        context = proxy._context
        timed = proxy._timed
        outcomes = self._outcomes
        tried = MappingProxyType(outcomes)
        candidates = _Candidates(proxy, task, tried)
        failure: RpcError | None = None
        last: RpcError | None = None
        try:
            while True:
                uid = await candidates.next(failure)
                failure = None
                if uid is None:
                    raise proxy._exhausted_call(task, tried) from last
                if uid in outcomes:
                    raise RuntimeError(
                        f"balancer {proxy._balancer!r} offered worker {uid} twice in one call"
                    )
                started = 0
                try:
                    if timed:
                        metadata, connection, started = context.start_dispatch(uid)
                    else:
                        metadata, connection = context.entry(uid)
                except KeyError:  # it left the pool or was ejected: skipped, not failed
                    outcomes[uid] = None
                    continue
                outcome = _NEUTRAL
                try:
                    open_stream = getattr(connection, "stream", None)
                    if open_stream is None:
                        raise NotImplementedError(
                            f"worker {uid} at {metadata.address} is reached through"
                            f" {type(connection).__name__}, which cannot stream: streaming"
                            " needs the msgpack transport (the grpc transport does not"
                            " implement it)"
                        )
                    remaining = proxy._remaining(task, self._timeout, self._deadline, tried)
                    proxy._dispatched += 1
                    inner: ItemStream | None = None
                    try:
                        inner = await open_stream(task, timeout=remaining)
                        first = await inner.__anext__()
                    except RpcError as error:
                        failure = last = outcomes[uid] = error
                        outcome = _DEADLINE if error.reason == "deadline" else _FAILURE
                    except StopAsyncIteration:
                        outcome = _SUCCESS
                        self._done = True
                        await candidates.succeeded(uid)
                        raise
                    except BaseException as error:
                        proxy._errors += 1
                        if isinstance(error, WorkerError):
                            outcome = _SUCCESS
                        if inner is not None:
                            inner.close()
                        raise
                    else:
                        outcome = _SUCCESS
                        self._inner = inner
                        self._uid = uid
                        self._address = metadata.address
                        await candidates.succeeded(uid)
                        return first
                finally:
                    if timed and context.finish_dispatch(uid, started, outcome):
                        proxy._report_health()
                assert failure is not None
                proxy._failed(
                    task,
                    uid,
                    metadata,
                    failure,
                    self._idempotent,
                    self._timeout,
                    self._deadline,
                    tried,
                )
        except BaseException:
            self.close()
            raise
        finally:
            await candidates.close()

    def _broke(self, error: RpcError) -> Exception:
        """The error to raise for a stream that failed after its first item: never sent
        again."""
        proxy = self._proxy
        uid = self._uid
        assert uid is not None
        self._outcomes[uid] = error
        if isinstance(error, TransientRpcError):
            proxy._transient += 1
            proxy._count_reason(error)
        else:
            pooled = proxy._context.pooled(uid)
            proxy._evict_broken(None if pooled is None else pooled[0], error)
        if error.reason == "deadline":
            return proxy._deadline_exceeded(
                self._task, self._timeout, MappingProxyType(self._outcomes), error
            )
        proxy._outcomes_unknown += 1
        address = error.address or self._address
        return OutcomeUnknown(
            f"the stream of the task {self._task!r} from worker {uid} at {address} broke after"
            f" {self.received} items: {error}; a stream is never sent again once an item came",
            reason=error.reason,
            address=address,
            uid=uid,
        )


class _Candidates:
    """The balancer's candidates for one call, through ``select`` or the ``delegate`` async
    generator, as the proxy drives them for a dispatch."""

    def __init__(
        self, proxy: WorkerProxy, task: Any, tried: MappingProxyType[uuid.UUID, Exception | None]
    ) -> None:
        self._select: Callable[..., uuid.UUID | None] | None = proxy._select
        self._task = task
        self._context = proxy._context
        self._tried = tried
        self._balancer = proxy._balancer
        self._delegate: AsyncGenerator[uuid.UUID, Any] | None = None
        if self._select is None:
            self._delegate = proxy._balancer.delegate(task, context=proxy._context)

    async def next(self, failure: RpcError | None) -> uuid.UUID | None:
        """The next candidate (None: no more); ``failure`` is the last attempt's error, if it
        failed."""
        if self._select is not None:
            return self._select(self._task, context=self._context, tried=self._tried)
        assert self._delegate is not None
        try:
            if failure is None:
                return await anext(self._delegate)
            return await self._delegate.athrow(failure)
        except StopAsyncIteration:
            return None

    async def succeeded(self, uid: uuid.UUID) -> None:
        if self._delegate is None:
            return
        try:
            await self._delegate.asend(uid)
        except StopAsyncIteration:
            return
        raise RuntimeError(f"balancer {self._balancer!r} offered another worker after a success")

    async def close(self) -> None:
        if self._delegate is not None:
            await self._delegate.aclose()
