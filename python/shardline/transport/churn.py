"""`AcceptGate`: the bound on connection churn after protocol violations
(``WorkerLimits.violation_burst`` and ``violation_rate``): a token bucket of violations over the
whole worker; while it is empty, the worker's listening sockets accept nothing."""

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


class AcceptGate:
    """Counts a worker's protocol violations (:meth:`violation`: a connection closed for
    breaking the protocol, a refused TLS handshake) and stops its accepting while more came
    than ``limits`` allow: the bucket holds ``violation_burst`` and refills at
    ``violation_rate`` a second; each violation takes one, and while less than one is left
    the listening sockets accept nothing (connections dialled meanwhile wait in the system's
    listen backlog; those open are served as before). The debt a burst of violations can run
    up is at most ``violation_burst``, so a pause lasts at most
    ``(violation_burst + 1) / violation_rate`` seconds.

    :meth:`attach` gives it the server whose accepting it pauses (``reserve`` None: a server
    never paused, a Unix socket's); :meth:`close` closes that server, :meth:`wait_closed`
    waits for it as ``AbstractServer.wait_closed`` does. ``violations`` and ``pauses`` count
    since it was made. Each pause is logged at WARNING through ``log`` (so at most one
    line, and one of counts, per ``log_interval``).

    Implementation notes: neither asyncio nor uvloop can pause a server's accepting, so a
    pause closes the server while this keeps a duplicate of each listening socket's
    descriptor: the socket, and its backlog, stays open in the kernel, and accepting resumes
    with a new server on another duplicate (``reserve``). Nothing is accepted while paused:
    accepting a connection only to close it would cost the loop what the attacker's churn
    costs it now, and would let it dial again sooner.
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop, limits: WorkerLimits, log: LogThrottle
    ) -> None:
        self.violations = 0
        self._log = log
        self.pauses = 0
        self._loop = loop
        self._rate = limits.violation_rate
        self._burst = float(limits.violation_burst)
        self._tokens = self._burst
        self._filled_at = loop.time()
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
            if self._refill() < 1:
                self._pause()

    def violation(self) -> None:
        """Counts one violation; stops accepting if it empties the bucket."""
        self.violations += 1
        self._tokens = max(-self._burst, self._refill() - 1)
        if self._tokens < 1 and not self._paused and self._reserve is not None:
            self._pause()

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

    def _refill(self) -> float:
        now = self._loop.time()
        self._tokens = min(self._burst, self._tokens + (now - self._filled_at) * self._rate)
        self._filled_at = now
        return self._tokens

    def _pause(self) -> None:
        self._paused = True
        self.pauses += 1
        for server in self._servers:
            server.close()
        self._servers = []
        self._log.log(
            logging.WARNING,
            "stopped accepting connections for %.2f s: %d connections broke the protocol"
            " so far (violation_burst %d, violation_rate %g/s)",
            (1 - self._tokens) / self._rate,
            self.violations,
            self._burst,
            self._rate,
        )
        self._wait_for_token()

    def _wait_for_token(self) -> None:
        self._timer = self._loop.call_later((1 - self._tokens) / self._rate, self._resume)

    def _resume(self) -> None:
        self._timer = None
        if self._refill() < 1:  # violations of connections already open came meanwhile
            self._wait_for_token()
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
            self._tokens = 0.0
            self._wait_for_token()
            return
        self._reopening = None
        if self._closed:
            for server in servers:
                server.close()
            return
        self._servers = servers
        self._paused = False
