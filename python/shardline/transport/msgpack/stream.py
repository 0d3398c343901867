"""`MsgpackStream`: the caller's side of one streamed call on a MessagePack-RPC socket, an async
iterator of the worker's items with credit-based flow control."""

from __future__ import annotations

import asyncio
import collections
import weakref
from collections.abc import Callable
from typing import Any, Final

from shardline._closing import Closing
from shardline.errors import RpcReason, TransientRpcError
from shardline.transport.msgpack import wire
from shardline.transport.remote_errors import worker_error

__all__ = ["MsgpackStream", "StreamFeed", "answer_error"]

# The reason of each error kind a caller retries elsewhere (wire.TRANSIENT_KINDS).
_TRANSIENT_REASONS: Final[dict[str, RpcReason]] = {
    wire.BUSY: "busy",
    wire.UNAVAILABLE: "unavailable",
    wire.SHUTTING_DOWN: "shutting-down",
    wire.DEADLINE: "deadline",
}
# The error kinds of a call that may have started: unless the answer says it had not.
_MAY_HAVE_STARTED: Final = frozenset({wire.SHUTTING_DOWN, wire.DEADLINE})


def answer_error(address: str, handler: str, failure: wire.ErrorAnswer) -> Exception:
    """What an error answer means to the caller of a dispatch or a stream: ``TransientRpcError``
    (sent unless refused or said not started) or ``WorkerError`` (with the worker's built-in
    type and traceback, see :mod:`~shardline.transport.remote_errors`)."""
    kind = failure.kind
    reason = _TRANSIENT_REASONS.get(kind)
    if reason is not None:
        return TransientRpcError(
            f"worker at {address}: {kind}: {failure.type}: {failure.message}",
            reason=reason,
            address=address,
            # busy and unavailable: refused, or asked for by the handler itself
            sent=kind in _MAY_HAVE_STARTED and failure.started is not False,
        )
    return worker_error(
        failure.type,
        failure.message,
        handler=handler,
        address=address,
        builtin=failure.builtin,
        traceback=failure.traceback,
    )


class _Ended:
    """The outcome of a stream that ended without an error: its items, then the end."""


_END: Final = _Ended()


class StreamFeed:
    """What the socket (the connection's link) hands one stream: its items (``push``) and its
    outcome (``finish``: :data:`_END` or the error to raise after the items), and how many
    items the worker may still send (``allowed``: a push past it breaks the protocol)."""

    __slots__ = ("allowed", "handler", "items", "outcome", "waiter")

    def __init__(self, handler: str, window: int) -> None:
        self.handler = handler
        self.items: collections.deque[Any] = collections.deque()
        self.outcome: _Ended | BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.allowed = window

    def push(self, value: Any) -> None:
        self.allowed -= 1
        self.items.append(value)
        self._wake()

    def finish(self, outcome: _Ended | BaseException) -> None:
        if self.outcome is None:
            self.outcome = outcome
            self._wake()

    def end(self) -> None:
        self.finish(_END)

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)


class MsgpackStream(Closing):
    """The items of one streamed call, in the order the worker's generator yielded them::

        async with await connection.stream(Task("count", 10)) as items:
            async for item in items:
                ...

    Made by :meth:`MsgpackConnection.stream` once the request is written. ``__anext__``
    returns the next item, waiting for it; after the last one it raises
    ``StopAsyncIteration``. An error ends the stream where it happened: the items received
    before it are returned first, then it is raised, as :meth:`MsgpackConnection.dispatch`
    would raise it (the generator's exception as ``WorkerError``; a lost connection, a
    worker that stopped, as ``TransientRpcError`` with ``sent``).

    **Flow control.** The worker sends at most ``window`` items ahead of what this iterator
    returned, and advances its generator only while it may send: a caller that stops reading
    stops the generator within ``window`` items. Credit is granted back a half window at a
    time, as items are read.

    **The deadline** (``timeout`` given to ``stream``) bounds the whole stream: unless the
    worker's end (the last item, or its error) arrived before it, at the deadline the call is
    cancelled on the worker, the items not yet read are dropped, and the next ``__anext__``
    raises ``TransientRpcError`` (reason ``"deadline"``, sent). A stream whose end arrived in
    time yields all its items, however late they are read.

    **Leaving early.** ``close()`` (or ``await aclose()``, or leaving ``async with``, or this
    object being collected, as when an ``async for`` over it is left by ``break`` or an
    exception) cancels the call on the worker, which closes the generator (its ``finally``
    blocks run); the iterator is then exhausted. Cancelling a task waiting in ``__anext__``
    does the same.
    """

    def __init__(
        self,
        feed: StreamFeed,
        msgid: int,
        window: int,
        deadline: float | None,
        address: str,
        grant: Callable[[int, int], None],
        cancel: Callable[[int], None],
        ended: Callable[[], None],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._feed = feed
        self._msgid = msgid
        self._address = address
        self._grant = grant
        self._cancel = cancel
        self._ended: Callable[[], None] | None = ended
        self._loop = loop
        self._grant_every = max(1, window // 2)
        self._taken = 0  # items read since the last grant
        self.received = 0
        """How many items this iterator returned."""
        # (the timer holds the stream weakly: one left unread is collected, and so cancelled)
        self._timer = (
            None if deadline is None else loop.call_at(deadline, _expire, weakref.ref(self))
        )

    def __repr__(self) -> str:
        return (
            f"MsgpackStream({self._feed.handler!r}, msgid {self._msgid}, at {self._address},"
            f" {self.received} items read)"
        )

    def __aiter__(self) -> MsgpackStream:
        return self

    async def __anext__(self) -> Any:
        feed = self._feed
        while True:
            items = feed.items
            if items:
                value = items.popleft()
                self.received += 1
                taken = self._taken + 1
                if taken >= self._grant_every and feed.outcome is None:
                    self._grant(self._msgid, taken)
                    taken = 0
                self._taken = taken
                return value
            outcome = feed.outcome
            if outcome is not None:
                self._done()
                if outcome is _END:
                    raise StopAsyncIteration
                assert isinstance(outcome, BaseException)
                raise outcome
            waiter = feed.waiter = self._loop.create_future()
            try:
                await waiter
            except asyncio.CancelledError:
                self.close()
                raise

    def close(self) -> None:
        """Cancels the call on the worker unless it ended; the iterator is exhausted."""
        feed = self._feed
        if feed.outcome is None:
            feed.finish(_END)
            self._cancel(self._msgid)
        feed.items.clear()
        self._done()

    def __del__(self) -> None:
        if self._ended is not None and not self._loop.is_closed():
            self.close()

    def _expire(self) -> None:
        self._timer = None
        feed = self._feed
        if feed.outcome is None:
            feed.items.clear()
            feed.finish(
                TransientRpcError(
                    f"worker at {self._address}: deadline: the stream had not ended when its"
                    f" deadline passed ({self.received} items read)",
                    reason="deadline",
                    address=self._address,
                    sent=True,
                )
            )
            self._cancel(self._msgid)

    def _done(self) -> None:
        """Once: stops the timer and tells the socket the call is over."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        ended, self._ended = self._ended, None
        if ended is not None:
            ended()


def _expire(stream: weakref.ref[MsgpackStream]) -> None:
    alive = stream()
    if alive is not None:
        alive._expire()
