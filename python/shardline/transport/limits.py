"""`WorkerLimits`: what one MessagePack-RPC worker lets its clients hold (connections, calls,
queued answers, time, items); the file descriptors it raises its own limit to; and the
`Sweeper` that enforces the connection count and the timeouts over a worker's connections."""

from __future__ import annotations

import array
import asyncio
import errno
import logging
import math
import os
from collections import Counter
from dataclasses import dataclass, fields
from typing import Any, Protocol, cast

from shardline.checks import refusal

__all__ = [
    "FD_RESERVE",
    "FRAME",
    "HELLO",
    "IDLE",
    "Sweeper",
    "WorkerLimits",
    "connection_bounds",
    "raise_fd_limit",
    "unread_bytes",
]

logger = logging.getLogger("shardline.transport.limits")

FD_RESERVE = 256
"""File descriptors a worker keeps for everything but its connections and its listen queue
(its listening socket, discovery, logs, the handlers' own files): see
:func:`connection_bounds` for how the rest of its open file limit is shared."""

# The share of the descriptors left beyond FD_RESERVE the listen backlog may take at most;
# the connections open take the rest.
_BACKLOG_SHARE = 4

# Where Linux says how far it caps every listen backlog.
_SOMAXCONN = "/proc/sys/net/core/somaxconn"

try:
    import fcntl
    import termios

    _FIONREAD: int | None = termios.FIONREAD
except ImportError:  # Windows
    _FIONREAD = None

# Where the hard limit is unlimited, the soft one is raised this far (Linux's default
# fs.nr_open): a soft limit cannot be unlimited.
_UNLIMITED_TARGET = 1 << 20


@dataclass(frozen=True, slots=True)
class WorkerLimits:
    """The bounds a MessagePack-RPC worker keeps whatever its clients send, given to
    :func:`~shardline.transport.msgpack.server.serve_msgpack` (or ``serve``) as
    ``limits=WorkerLimits(...)``; each field's default is written after it. docs/msgpack-rpc.md
    ("Bounds") tells what a client sees of each.

    - ``max_connections`` (10,000): connections open at once. One accepted beyond it is closed
      at once, counted (``MsgpackWorkerServer.refused_connections``) and logged at WARNING. The
      bound in force is never above what the file descriptor soft limit leaves beyond
      :data:`FD_RESERVE` and the listen backlog (the worker raises its soft limit to the hard
      one when it starts; see :func:`connection_bounds`).
    - ``max_calls`` (4,096): dispatches in flight on the whole worker, over every connection
      (each connection also has ``serve_msgpack``'s ``max_in_flight``). A dispatch beyond it is
      answered ``busy`` at once, which the caller retries elsewhere as not sent.
    - ``max_queued_bytes`` (64 MiB): answer bytes written to one connection and not yet taken
      by its socket. Once the socket stops taking them, the worker stops starting calls for
      that connection and reading from it, so this is reached only by the answers of calls
      that were already running; a connection whose client leaves more than this unread is
      closed (logged at WARNING).
    - ``hello_timeout`` (10 s): a connection whose hello has not come this long after it
      opened is closed.
    - ``idle_timeout`` (300 s): a connection with no call in flight that has sent nothing for
      this long is closed (its client dials again at its next call).
    - ``frame_timeout`` (30 s): a message must be received whole within this long of its first
      byte, or its connection is closed (4 MiB in 30 s is about 1.1 Mbit/s).
    - ``handshake_timeout`` (10 s): a worker served with TLS drops a client whose handshake
      has not finished this long after the accept (logged at WARNING, a violation). A
      handshake whose bytes came in time is never cut for a stall of the worker's loop
      (see :class:`~shardline.transport.msgpack.tls_accept.TlsAccept`).
    - ``max_message_items`` (4,096): items (each value, container and map key counts one) in one
      message, outside the payload it carries; beyond them the connection is closed.
      A MessagePack-RPC message of this protocol holds about ten.
    - ``max_payload_items`` (1,048,576): items in one dispatch's (or stream's) payload; beyond
      them the call is answered ``bad_request``. Reading a value costs about its item count, so
      each message read costs at most about ``max_message_items + max_payload_items`` items of
      work, however it was built (a 4 MiB frame holds four million one-byte ints).
    - ``accept_burst`` (1,000) and ``accept_rate`` (500 per second): connections accepted, on
      the whole worker, as a token bucket: it holds up to ``accept_burst`` of them and
      refills at ``accept_rate`` a second; once it is empty, the worker stops accepting new
      connections until it holds a tenth of a second's refill (new clients wait in the
      system's listen backlog; open connections are served as before). So a peer that dials
      and closes again and again, breaking no rule, gets about ``accept_rate`` connections a
      second, while a thousand clients can connect at once: the listen backlog is
      ``accept_burst`` deep, so they all wait in it, none for a SYN sent again (where the
      open file limit and the system allow it, see :func:`connection_bounds`).
    - ``violation_burst`` (20) and ``violation_rate`` (5 per second): connections closed for
      breaking the protocol (a malformed message, one over a bound above, a bad hello) or for
      a failed TLS handshake, on the whole worker, as a token bucket: it holds up to
      ``violation_burst`` of them and refills at ``violation_rate`` a second; once it is
      empty, the worker stops accepting new connections until it holds one again (new
      clients wait in the system's listen backlog; open connections are served on as
      before). So an attacker who dials again and again, breaking the protocol each time,
      gets about ``violation_rate`` connections a second, and a connection that is not yet
      accepted waits at most ``(violation_burst + 1) / violation_rate`` seconds (4.2 s) for
      its turn. The rule counts the whole worker, not each peer address: see
      docs/msgpack-rpc.md ("Connection churn") for why. Each pause, of either bucket, is
      logged at WARNING and counted (``MsgpackWorkerServer.accept_pauses``; the violations:
      ``violations``). Neither bucket applies to a Unix socket (only this user can reach it).
    - ``log_interval`` (10 s): the lines a worker logs per connection closed for a violation
      (at ERROR), per refused TLS handshake and per accept pause (at WARNING), each kind
      apart: the first in each ``log_interval`` is logged as it comes, those that follow it
      in the interval are counted and said in one line at its end.

    ``ValueError``, naming the field, for a count that is not a positive int or a timeout,
    rate or interval that is not a positive finite number; for a value of the wrong type (a
    str, a bool, a float given as a count) it is an
    :class:`~shardline.errors.InvalidArgumentType`, also a ``TypeError``.
    """

    max_connections: int = 10_000
    max_calls: int = 4096
    max_queued_bytes: int = 64 * 1024 * 1024
    hello_timeout: float = 10.0
    idle_timeout: float = 300.0
    frame_timeout: float = 30.0
    handshake_timeout: float = 10.0
    max_message_items: int = 4096
    max_payload_items: int = 1 << 20
    accept_burst: int = 1000
    accept_rate: float = 500.0
    violation_burst: int = 20
    violation_rate: float = 5.0
    log_interval: float = 10.0

    def __post_init__(self) -> None:
        for field in fields(self):
            value: Any = getattr(self, field.name)
            if field.type == "float":
                if (
                    isinstance(value, bool)
                    or not isinstance(value, int | float)
                    or not math.isfinite(value)
                    or value <= 0
                ):
                    raise refusal(value, (int, float))(
                        f"WorkerLimits.{field.name} must be a positive finite number"
                        f"{'' if field.name.endswith('_rate') else ' of seconds'}, got {value!r}"
                    )
            elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise refusal(value, int)(
                    f"WorkerLimits.{field.name} must be an int >= 1, got {value!r}"
                )

    @classmethod
    def parse(cls, settings: list[str]) -> WorkerLimits:
        """The limits ``settings`` give, each ``NAME=VALUE`` (``max_calls=2048``,
        ``idle_timeout=60``), the defaults for the rest: what ``shardline worker --limit``
        takes. ``ValueError`` naming the setting for an unknown name or a bad value."""
        known = [field.name for field in fields(cls)]
        decimal = {field.name for field in fields(cls) if field.type == "float"}
        given: dict[str, Any] = {}
        for setting in settings:
            name, equals, text = setting.partition("=")
            name = name.strip().replace("-", "_")
            if not equals or name not in known:
                raise ValueError(
                    f"a limit is NAME=VALUE, NAME one of {', '.join(known)}; got {setting!r}"
                )
            try:
                given[name] = float(text) if name in decimal else int(text)
            except ValueError:
                raise ValueError(f"limit {setting!r}: {text!r} is not a number") from None
        return cls(**given)

    def settings(self) -> list[str]:
        """The ``NAME=VALUE`` forms :meth:`parse` reads back into these limits, for the fields
        that differ from the defaults."""
        default = WorkerLimits()
        return [
            f"{field.name}={getattr(self, field.name)!r}"
            for field in fields(self)
            if getattr(self, field.name) != getattr(default, field.name)
        ]

    @property
    def sweep_interval(self) -> float:
        """How often a worker looks for connections past a timeout: a quarter of the shortest
        one, between 50 ms and 1 s, so a timeout is enforced at most twice that late (the hello
        timeout at most that late), never early."""
        shortest = min(self.hello_timeout, self.idle_timeout, self.frame_timeout)
        return min(1.0, max(0.05, shortest / 4))


def raise_fd_limit() -> int | None:
    """Raises this process's soft limit on open file descriptors to its hard limit (to
    ``2**20`` where the hard one is unlimited), where the system allows; returns the soft
    limit in force after (None where the platform has none, as on Windows). Logged at INFO
    when it changed."""
    try:
        import resource
    except ImportError:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _UNLIMITED_TARGET if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as error:
            # macOS refuses more than its kern.maxfilesperproc whatever the hard limit says
            logger.info(
                "the open file limit stays %d: raising it to %d failed: %s", soft, target, error
            )
            return soft
        logger.info("raised the open file limit from %d to %d", soft, target)
        soft = target
    return None if soft == resource.RLIM_INFINITY else soft


def connection_bounds(limits: WorkerLimits) -> tuple[int, int]:
    """``max_connections`` as it can hold, and the listen backlog, under the file descriptor
    soft limit (raised first, see :func:`raise_fd_limit`): the descriptors it leaves beyond
    :data:`FD_RESERVE` are shared between the connections open and the connections waiting in
    the listen queue, so neither idle sockets nor a burst of dials can take the descriptors
    every other file needs. The backlog is ``accept_burst``, at most a quarter of them, and at
    most what the system caps every backlog to (Linux's ``net.core.somaxconn``); the
    connections get the rest, at most ``max_connections``. Each lowered is logged at INFO.
    With the defaults, a soft limit of 11,256 or more lowers neither; under ``ulimit -n
    1024``, 192 wait in the backlog and 576 connections are open at most.

    Implementation notes: a backlog shallower than the bursts of dials makes the kernel drop
    the SYNs over it, and each of those clients waits for TCP to send its SYN again (1 s
    later, then 2 s after that). One deeper can cost descriptors: asyncio's own loop accepts
    the whole queue (up to the backlog) in one pass, a descriptor each, and makes each
    connection known to its protocol, which refuses those over ``max_connections``, only a
    turn later; so the worker holds its open connections and its whole queue at once, and
    both must fit beside the reserve (a backlog of 1,000 beside 768 connections under
    ``ulimit -n 1024`` failed accepts with EMFILE). uvloop (0.23) makes each connection
    known as it accepts it, and a refused one's descriptor is closed before the next
    accept, but the bound does not count on it.
    """
    configured, burst = limits.max_connections, limits.accept_burst
    soft = raise_fd_limit()
    if soft is None:
        return configured, _system_backlog(burst)
    room = soft - FD_RESERVE
    fitting = max(1, min(burst, room // _BACKLOG_SHARE))
    if fitting < burst:
        logger.info(
            "the listen backlog is %d, under accept_burst %d: the open file limit (%d) leaves"
            " no more (a burst of more dials waits for TCP to send their SYNs again)",
            fitting,
            burst,
            soft,
        )
    backlog = _system_backlog(fitting)
    bound = max(1, min(configured, room - backlog))
    if bound < configured:
        logger.info(
            "max_connections %d is over what the open file limit (%d) allows beside a listen"
            " backlog of %d: %d connections at most",
            configured,
            soft,
            backlog,
            bound,
        )
    return bound, backlog


def _system_backlog(wanted: int) -> int:
    """``wanted``, or what the system caps every listen backlog to if that is less (logged
    at INFO)."""
    try:
        with open(_SOMAXCONN) as file:
            cap = int(file.read())
    except (OSError, ValueError):  # not Linux
        return wanted
    if cap >= wanted:
        return wanted
    logger.info(
        "the system caps the listen backlog at %d (net.core.somaxconn), under %d: a burst"
        " of more dials waits for TCP to send their SYNs again",
        cap,
        wanted,
    )
    return cap


def unread_bytes(transport: asyncio.BaseTransport) -> int:
    """How many bytes the socket under ``transport`` (a TLS one's too) has received and not
    yet given to it: 0 when it has none, where it is closed, or where the platform cannot
    tell (no ``fcntl``)."""
    sock = transport.get_extra_info("socket")
    if sock is None or _FIONREAD is None:
        return 0
    count = array.array("i", [0])
    try:
        fcntl.ioctl(sock.fileno(), _FIONREAD, count)
    except (OSError, ValueError):  # closed meanwhile (a fileno of -1 is a ValueError)
        return 0
    return count[0]


HELLO, FRAME, IDLE = "hello", "frame", "idle"
"""The timeouts a connection can be past (see :meth:`Swept.overdue`)."""

_TIMEOUTS = {
    HELLO: lambda limits: f"no hello within hello_timeout {limits.hello_timeout:g} s",
    FRAME: lambda limits: f"a message unfinished after frame_timeout {limits.frame_timeout:g} s",
    IDLE: lambda limits: f"idle for idle_timeout {limits.idle_timeout:g} s",
}


class Swept(Protocol):
    """A connection as the :class:`Sweeper` sees it."""

    def overdue(self, now: float, limits: WorkerLimits) -> str | None:
        """Which timeout (:data:`HELLO`, :data:`FRAME` or :data:`IDLE`) it is past at ``now``
        (the loop's time), if any."""

    def expire(self, reason: str) -> None:
        """Closes it for the timeout ``reason``."""

    def unread(self) -> bool:
        """Whether bytes its client sent wait in its socket, not read yet."""


class Sweeper:
    """Keeps a worker's connections (``links``, the set the server keeps of its open ones)
    within ``limits``: :meth:`admit` refuses one beyond ``max_connections``; from
    :meth:`start` to :meth:`stop`, a sweep every ``limits.sweep_interval`` closes those past a
    timeout and logs them (WARNING; INFO for idle ones), the refusals since the last sweep
    (WARNING), and a worker out of file descriptors (WARNING, then INFO once they are back).
    ``refused`` counts the refusals. A connection is closed for a timeout only when nothing
    its client sent waits unread: one whose bytes came while the worker's loop was held up
    (a handler that blocks it, a long GC pause) is judged once they are read.

    Implementation notes: one timer for the whole server, not one per connection, and a
    connection's read stamps nothing: each sweep dates what a connection received since the
    sweep before to its own time (see ``overdue``), so a timeout is enforced at most two
    ``sweep_interval`` late. Those dates are only as fresh as the last read, and a loop
    held up does not read: uvloop (libuv) runs the timers that came due during a stall
    before it polls the sockets again (a handler's first step runs inside a read, in
    libuv's poll phase, and the timers follow that phase), so the sweep came first, with
    every date as old as the stall. So a connection past a timeout is asked whether its
    socket holds bytes received and not read (:func:`unread_bytes`: one ``ioctl`` for each
    connection past a timeout, none for the others) and, if so, is left to the next sweep,
    by which time the loop has read them and its dates are fresh. What came in time is
    never cut; what came after a timeout but before its sweep is spared too, which gives a
    client nothing to abuse: bytes wait unread at a sweep only when they came since the
    loop last read, and the bytes a client goes on sending finish its message or break a
    bound (``max_frame_bytes``, the items). The loop says nothing when
    accept() fails for want of descriptors (uvloop's libuv closes such connections
    silently), so each sweep opens one descriptor to see.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        limits: WorkerLimits,
        links: set[Any],
        max_connections: int,
    ) -> None:
        self.refused = 0
        self._loop = loop
        self._limits = limits
        self._links: set[Swept] = links
        self._max_connections = max_connections
        self._refused_logged = 0
        self._out_of_files = False
        self._timer: asyncio.TimerHandle | None = None

    def admit(self, transport: asyncio.BaseTransport) -> bool:
        """Whether a connection just accepted may stay; one beyond ``max_connections`` is
        closed here (and counted)."""
        if len(self._links) < self._max_connections:
            return True
        self.refused += 1
        cast(asyncio.Transport, transport).abort()
        return False

    def start(self) -> None:
        self._timer = self._loop.call_later(self._limits.sweep_interval, self._sweep)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _sweep(self) -> None:
        limits = self._limits
        # scheduled first: nothing below may end the sweeps
        self._timer = self._loop.call_later(limits.sweep_interval, self._sweep)
        now = self._loop.time()
        closed: Counter[str] = Counter()
        for link in list(self._links):
            reason = link.overdue(now, limits)
            if reason is not None and not link.unread():
                closed[reason] += 1
                link.expire(reason)
        for reason, count in closed.items():
            level = logging.INFO if reason == IDLE else logging.WARNING
            logger.log(level, "closed %d connections: %s", count, _TIMEOUTS[reason](limits))
        if self.refused > self._refused_logged:
            logger.warning(
                "refused %d connections over max_connections (%d are open, at most %d)",
                self.refused - self._refused_logged,
                len(self._links),
                self._max_connections,
            )
            self._refused_logged = self.refused
        self._probe_files()

    def _probe_files(self) -> None:
        try:
            os.close(os.open(os.devnull, os.O_RDONLY))
        except OSError as error:
            if error.errno not in (errno.EMFILE, errno.ENFILE):
                logger.warning("cannot open %s to count file descriptors: %s", os.devnull, error)
                return
            if not self._out_of_files:
                self._out_of_files = True
                logger.warning(
                    "out of file descriptors (%s) with %d connections open: new connections"
                    " fail until some close; raise the open file limit (ulimit -n) or lower"
                    " max_connections",
                    errno.errorcode[error.errno],
                    len(self._links),
                )
            return
        if self._out_of_files:
            self._out_of_files = False
            logger.info("file descriptors are available again")
