"""`AcceptGate`: the bound on a worker's connection churn (``WorkerLimits.accept_burst`` and
``accept_rate``, ``violation_burst`` and ``violation_rate``): token buckets of the connections
accepted and of the protocol violations, over the whole worker; while either is empty, the
worker's listening sockets accept nothing."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable

from shardline.transport.limits import WorkerLimits
from shardline.transport.log_throttle import LogThrottle

__all__ = ["AcceptGate", "Reserve"]

Reserve = Callable[[socket.socket], Awaitable[asyncio.Server]]
"""Serves a listening socket again (``loop.create_server(factory, sock=...)`` with the
server's own options), the socket's ownership passed to the server made."""


# A pause waits for this share of a second's refill (and at least one token), so a steady
# churn costs at most about ten pauses a second, not one per connection.
_RESUME_SECONDS = 0.1
# Tokens a refill computed in two steps may lack against one: not a shortage.
_ROUNDING = 1e-9


class _Bucket:
    """A token bucket ``depth`` deep refilled at ``rate`` a second, whose debt is at most
    ``depth``."""

    __slots__ = ("depth", "filled_at", "rate", "tokens")

    def __init__(self, depth: int, rate: float, now: float) -> None:
        self.depth = float(depth)
        self.rate = rate
        self.tokens = self.depth
        self.filled_at = now

    def take(self, now: float) -> bool:
        """Takes one; whether fewer than one is left after."""
        self.tokens = max(-self.depth, self.level(now) - 1)
        return self.tokens < 1 - _ROUNDING

    def level(self, now: float) -> float:
        self.tokens = min(self.depth, self.tokens + (now - self.filled_at) * self.rate)
        self.filled_at = now
        return self.tokens

    def wait(self, now: float) -> float:
        """Seconds until it holds enough to resume accepting (0: it does)."""
        short = max(1.0, min(self.depth, self.rate * _RESUME_SECONDS)) - self.level(now)
        return short / self.rate if short > _ROUNDING else 0.0


class AcceptGate:
    """Bounds a worker's connection churn: stops its accepting while more connections came,
    or more of them broke the protocol, than ``limits`` allow. Two token buckets: one of the
    connections accepted (:meth:`accepted`), ``accept_burst`` deep and refilled at
    ``accept_rate`` a second; one of the violations (:meth:`violation`: a connection closed
    for breaking the protocol, a refused TLS handshake), ``violation_burst`` deep and
    refilled at ``violation_rate`` a second. Each takes one per event; once either holds
    less than one, the listening sockets accept nothing (connections dialled meanwhile wait
    in the system's listen backlog; those open are served as before) until it holds one
    again, or a tenth of a second's refill if that is more. A burst of events can run a
    bucket into debt, at most its depth, so a pause lasts at most about
    ``(depth + 1) / rate`` seconds.

    :meth:`attach` gives it the server whose accepting it pauses (``reserve`` None: a server
    never paused, a Unix socket's); :meth:`close` closes that server, :meth:`wait_closed`
    waits for it as ``AbstractServer.wait_closed`` does. ``violations`` and ``pauses`` count
    since it was made. Each pause is logged at WARNING through ``log`` (so at most one
    line, and one of counts, per ``log_interval``).

    Implementation notes: neither asyncio nor uvloop can pause a server's accepting, so a
    pause closes the server while this keeps a duplicate of each listening socket's
    descriptor: the socket, and its backlog, stays open in the kernel, and accepting resumes
    with a new server on another duplicate (``reserve``). Nothing is accepted while paused:
    accepting a connection only to close it would cost the loop most of what the churn
    costs it, and would let the peer dial again sooner. A pause closes the server once the
    callback that counted the last event returns, so a connection being accepted then is
    served: uvloop makes a connection's transport as it accepts it; asyncio's own loop makes
    it a turn later, so there a connection it accepted in the same turn as a pause, after
    the event that caused it, is dropped (its client dials again).
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop, limits: WorkerLimits, log: LogThrottle
    ) -> None:
        self.violations = 0
        self.pauses = 0
        self._loop = loop
        self._log = log
        now = loop.time()
        self._accepts = _Bucket(limits.accept_burst, limits.accept_rate, now)
        self._violations = _Bucket(limits.violation_burst, limits.violation_rate, now)
        self._servers: list[asyncio.Server] = []
        self._held: list[socket.socket] = []
        self._reserve: Reserve | None = None
        self._paused = False
        self._closed = False
        self._timer: asyncio.TimerHandle | None = None
        self._reopening: asyncio.Task[None] | None = None

    @property
    def paused(self) -> bool:
        """Whether accepting is stopped now."""
        return self._paused

    def attach(self, server: asyncio.Server, reserve: Reserve | None) -> None:
        """Gives the gate the ``server`` it pauses, served again on a listening socket by
        ``reserve`` (None: never paused)."""
        self._servers = [server]
        if reserve is not None:
            self._reserve = reserve
            self._held = [socket.socket(fileno=os.dup(held.fileno())) for held in server.sockets]
            if self._wait() > 0:
                self._pause("connections came before the server was ready")

    def accepted(self) -> None:
        """Counts one connection accepted; stops accepting if it empties the bucket."""
        if self._accepts.take(self._loop.time()) and not self._paused:
            self._pause(
                f"accept_burst {self._accepts.depth:.0f}, accept_rate {self._accepts.rate:g}/s"
            )

    def violation(self) -> None:
        """Counts one violation; stops accepting if it empties the bucket."""
        self.violations += 1
        if self._violations.take(self._loop.time()) and not self._paused:
            self._pause(
                f"{self.violations} connections broke the protocol so far (violation_burst"
                f" {self._violations.depth:.0f}, violation_rate {self._violations.rate:g}/s)"
            )

    def close(self) -> None:
        """Stops accepting for good: closes the server and the sockets held."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        if self._reopening is not None:
            self._reopening.cancel()
        for server in self._servers:
            server.close()
        for held in self._held:
            held.close()
        self._held = []

    async def wait_closed(self) -> None:
        for server in self._servers:
            await server.wait_closed()

    def _wait(self) -> float:
        now = self._loop.time()
        return max(self._accepts.wait(now), self._violations.wait(now))

    def _pause(self, why: str) -> None:
        if self._reserve is None or self._closed:
            return
        self._paused = True
        self.pauses += 1
        # Closed once the current callback returns: an accept may be under way (the protocol
        # factory counts it), and a server closed before it attaches the connection's
        # transport fails that connection.
        for server in self._servers:
            self._loop.call_soon(server.close)
        self._servers = []
        wait = self._wait()
        self._log.log(logging.WARNING, "stopped accepting connections for %.2f s: %s", wait, why)
        self._timer = self._loop.call_later(wait, self._resume)

    def _resume(self) -> None:
        self._timer = None
        wait = self._wait()
        if wait > 0:  # violations of connections already open came meanwhile
            self._timer = self._loop.call_later(wait, self._resume)
            return
        self._reopening = self._loop.create_task(self._reopen())

    async def _reopen(self) -> None:
        assert self._reserve is not None
        servers = []
        try:
            for held in self._held:
                servers.append(await self._reserve(socket.socket(fileno=os.dup(held.fileno()))))
        except BaseException as error:
            for server in servers:
                server.close()
            self._reopening = None
            if not isinstance(error, OSError) or self._closed:
                raise
            # out of file descriptors, most likely: try again, never stop accepting for good
            self._log.log(logging.WARNING, "cannot accept connections again yet: %s", error)
            self._timer = self._loop.call_later(_RESUME_SECONDS, self._resume)
            return
        self._reopening = None
        if self._closed:
            for server in servers:
                server.close()
            return
        self._servers = servers
        self._paused = False
