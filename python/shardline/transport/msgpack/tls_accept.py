"""`TlsAccept`: a worker's TCP connection up to the end of its TLS handshake, so a worker sees
the handshakes it refuses (asyncio and uvloop drop them without a word)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import Any, cast

from shardline.transport.eager import start_eagerly
from shardline.transport.limits import unread_bytes

__all__ = ["TlsAccept"]

# start_tls's own timeout: a backstop only, as it cannot look at the socket (see TlsAccept).
_BACKSTOP = 3600.0
# A handshake's timer that comes later than this share of its timeout says the worker's loop
# was held up: the time it came late is given back to the handshake.
_STALL_SHARE = 0.1


class TlsAccept(asyncio.Protocol):
    """The protocol a TLS worker's server makes for each connection it accepts: runs the
    server side of the TLS handshake (``context``, at most ``timeout`` seconds), then gives
    the TLS transport to a protocol of ``make()``, as if that protocol's server had been made
    with ``ssl=context``. A handshake that fails, or does not finish in time, closes the
    connection and calls ``refused(peer, error)``, ``peer`` the socket's peer address
    (``peername``), ``error`` the exception the handshake raised (a ``TimeoutError`` for
    one out of time). ``handshakes`` holds the handshakes under way (a worker that stops
    cancels them). A handshake whose bytes came in time is not cut because the worker's
    loop was held up (a handler that blocks it, a long GC pause) past its timeout.

    Implementation notes: the handshake is ``loop.start_tls`` on the plain transport, whose
    failure the caller sees; a server made with ``ssl=`` only logs it in debug mode. It is
    started within ``connection_made`` (:func:`start_eagerly`), so the handshake's first
    bytes are read by it: uvloop starts reading once ``connection_made`` returns, whatever
    it paused, and what a protocol that is not yet the TLS one read would be lost. What the TLS
    transport delivers between the handshake's end and the protocol of ``make()`` taking
    it (a first request sent with the handshake's last flight) is kept and handed over.
    The timeout is a timer of its own, not start_tls's, which cut handshakes whose client
    was on time after the worker's loop was held up: uvloop runs the timers that came due
    before it reads the sockets again, or reads a flight just before them (when the loop was
    held up by a callback rather than by a read), leaving the next one a round trip away.
    So when this timer comes, a handshake whose socket holds bytes received and not read
    (:func:`~shardline.transport.limits.unread_bytes`, as the worker's
    :class:`~shardline.transport.limits.Sweeper` asks) is given its time again, and one whose
    timer came more than a tenth of its timeout late is given back the time it came late;
    only then is a handshake cut. Neither is the client's to cause: bytes wait unread only if
    they came since the loop last read, and the loop is held up by the worker.
    """

    def __init__(
        self,
        context: ssl.SSLContext,
        make: Callable[[], asyncio.Protocol],
        refused: Callable[[Any, BaseException], None],
        handshakes: set[asyncio.Task[None]],
        timeout: float,
    ) -> None:
        self._context = context
        self._make = make
        self._refused = refused
        self._handshakes = handshakes
        self._timeout = timeout
        self._timer: asyncio.TimerHandle | None = None
        self._due = 0.0  # when the timer is due (the loop's time)
        self._late = False  # the timeout ended the handshake

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        plain = cast(asyncio.Transport, transport)
        handshake = start_eagerly(asyncio.get_running_loop(), self._handshake(plain))
        if handshake is not None:
            self._handshakes.add(handshake)
            handshake.add_done_callback(self._handshakes.discard)

    async def _handshake(self, plain: asyncio.Transport) -> None:
        early = _Early()
        loop = asyncio.get_running_loop()
        self._arm(loop, self._timeout, plain)
        secured = None
        failure: Exception | None = None
        try:
            secured = await loop.start_tls(
                plain, early, self._context, server_side=True, ssl_handshake_timeout=_BACKSTOP
            )
        except asyncio.CancelledError:
            plain.abort()
            raise
        except Exception as error:
            failure = error
        finally:
            if self._timer is not None:
                self._timer.cancel()
        if self._late:  # (start_tls may raise, or return None, for the socket aborted)
            failure = TimeoutError(
                f"the handshake did not finish within handshake_timeout {self._timeout:g} s"
            )
        if failure is not None:
            plain.abort()
            self._refused(plain.get_extra_info("peername"), failure)
            return
        if secured is None or early.lost:
            return  # (the peer left as the handshake ended)
        protocol = self._make()
        secured.set_protocol(protocol)
        protocol.connection_made(secured)
        early.hand_over(protocol)

    def _arm(
        self, loop: asyncio.AbstractEventLoop, seconds: float, plain: asyncio.Transport
    ) -> None:
        self._due = loop.time() + seconds
        self._timer = loop.call_at(self._due, self._judge, plain)

    def _judge(self, plain: asyncio.Transport) -> None:
        """The handshake is due: ended now (its socket aborted, which fails start_tls),
        unless bytes its client sent wait unread or the loop was held up (see the class)."""
        loop = asyncio.get_running_loop()
        held_up = loop.time() - self._due
        if unread_bytes(plain) > 0:
            self._arm(loop, self._timeout, plain)
        elif held_up > _STALL_SHARE * self._timeout:
            self._arm(loop, held_up, plain)
        else:
            self._late = True
            plain.abort()


class _Early(asyncio.Protocol):
    """The TLS transport's protocol during the handshake: keeps what comes before the
    protocol of ``make()`` takes over."""

    def __init__(self) -> None:
        self.received: list[bytes] = []
        self.ended = False
        self.lost = False

    def data_received(self, data: bytes) -> None:
        self.received.append(data)

    def eof_received(self) -> bool | None:
        self.ended = True
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True

    def hand_over(self, protocol: asyncio.Protocol) -> None:
        if self.received:
            protocol.data_received(b"".join(self.received))
        if self.ended:
            protocol.eof_received()
