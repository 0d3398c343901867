"""`LocalPool`: worker processes on this machine serving the caller's handlers, in one line."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from shardline._extras import require_extra
from shardline.balancers.round_robin import RoundRobinLoadBalancer
from shardline.checks import check_count, check_seconds, refusal
from shardline.discovery.local import LocalDiscovery
from shardline.discovery.subscription import Subscription
from shardline.errors import InvalidArgumentType, WorkerStartError
from shardline.pool.health import HealthPolicy
from shardline.proxy import DEFAULT_HEALTH, DEFAULT_TIMEOUT, BalancerSpec, WorkerProxy
from shardline.proxy_stream import ProxyStream
from shardline.transport.handlers_spec import check_spec
from shardline.transport.limits import WorkerLimits
from shardline.transport.schemes import DEFAULT_TRANSPORT, TRANSPORTS, connect
from shardline.transport.task import MAX_MESSAGE_BYTES
from shardline.transport.tls import TlsSettings
from shardline.workers import Connection, DiscoveryEvent, WorkerMetadata

__all__ = ["LOOPBACK", "LocalPool"]

logger = logging.getLogger("shardline.transport.local.pool")

_TAIL_BYTES = 2000  # of a worker's output, quoted when it dies
_LINE_BYTES = 8192  # a longer line is logged in pieces
_DRAIN_WAIT = 1.0  # for the rest of a dead worker's output (a grandchild may hold the pipe)

LOOPBACK = "127.0.0.1:0"
"""Where a local gRPC worker serves: loopback, on a port the system picks."""

_MAX_SOCKET_PATH = 100  # bytes; the system's limit for a Unix socket's path is 104-108


@dataclass(eq=False, slots=True)
class _Worker:
    """One worker process the pool started."""

    uid: uuid.UUID
    process: asyncio.subprocess.Process
    tail: bytearray = field(default_factory=bytearray)
    drain: asyncio.Task[None] | None = None
    watch: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def output(self) -> str:
        text = self.tail.decode(errors="replace").strip()
        return text or "(no output)"


class LocalPool:
    """``workers`` processes on this machine serving the handlers named by ``handlers``, and
    a :class:`~shardline.WorkerProxy` dispatching to them::

        async with LocalPool("myapp.handlers:HANDLERS", workers=4) as pool:
            result = await pool.dispatch(Task("echo", {"hello": 1}))

    ``handlers`` is ``"module:attribute"``: each worker process imports ``module`` (with this
    process's ``sys.path``, so what this process can import, the workers can) and serves
    ``attribute``, a mapping of handler names to handlers as :func:`~shardline.transport.serve`
    takes them (a handler that raises makes ``dispatch`` raise ``WorkerError``).
    ``workers`` defaults to ``os.cpu_count()``. ``transport`` names how the workers serve: one
    of :data:`~shardline.transport.TRANSPORTS`, ``"msgpack"`` (the default; on a Unix socket
    in the pool's directory) or ``"grpc"`` (on loopback TCP); the proxy reaches each worker
    with :func:`~shardline.transport.connect`. The pool's directory is private (mode 0700)
    and each worker's Unix socket file in it mode 0600: only this user can reach a worker.

    ``tls`` (a :class:`~shardline.transport.tls.TlsSettings` with ``cert`` and ``key``, valid
    for ``127.0.0.1`` or its ``server_hostname``) serves the workers that listen on loopback
    TCP with TLS, and the proxy dials them with the same settings (with ``ca``, both sides
    present and verify certificates); a worker on a Unix socket stays plaintext.

    ``limits`` (msgpack only) bounds what each worker lets its clients hold
    (:class:`~shardline.transport.limits.WorkerLimits`; its defaults when None).

    ``max_frame_bytes`` (:data:`~shardline.transport.MAX_MESSAGE_BYTES`, 4 MiB, by default) bounds
    every message between the proxy and the workers, both ways: the workers serve with it
    (``serve_msgpack``'s ``max_frame_bytes``, ``serve_grpc``'s ``max_message_bytes``) and the
    proxy's connections are made with it. A task over it is a ``ValueError`` naming the limit,
    before anything is sent; a result over it a :class:`~shardline.WorkerError`
    (``shardline.BadResult``) naming the limit. Neither counts against the worker.

    Entering the block starts the processes and returns once every one of them has joined the
    proxy's pool. A worker that exits before it joined fails the start with
    :class:`~shardline.errors.WorkerStartError` (its message names the spec, the pid, the exit
    status and ends with the tail of the worker's output, e.g. the import error of a spec that
    cannot be loaded); workers that have not all joined within ``start_timeout`` seconds fail it
    with ``TimeoutError`` naming those that had not. Either way every process started is
    stopped before the error propagates.

    ``await dispatch(task, timeout=None, idempotent=None)`` is the proxy's
    :meth:`~shardline.WorkerProxy.dispatch` (the same errors), with the ``loadbalancer``
    (round robin by default) and the passive ``health`` policy given (the default one; None
    for none), as :class:`~shardline.WorkerProxy` takes them:
    ``timeout`` bounds the whole call, and defaults to the pool's ``timeout``
    (:data:`~shardline.proxy.DEFAULT_TIMEOUT`, 1 s); a task that reached a worker is sent again
    only if it is idempotent. ``stream(task, timeout=None, idempotent=None)`` is the proxy's
    :meth:`~shardline.WorkerProxy.stream`: the items of an async generator handler (msgpack
    transport only). ``workers`` lists the records of the pooled workers and ``pids``
    the pids of the worker processes running now.

    A worker that dies while the pool runs is logged (WARNING, with its exit status and the
    tail of its output), its record withdrawn at once, and a new worker, with a new uid, is
    started in its place; dispatch goes on over the others meanwhile. At most ``max_restarts``
    workers are replaced within any ``restart_window`` seconds: the death that would exceed that
    is logged as an ERROR and from then on dead workers are no longer replaced, while dispatch
    goes on over the survivors.

    Leaving the block, also by an exception or cancellation, stops every worker: SIGTERM (each
    withdraws its record and gets ``stop_grace`` seconds to finish its calls in flight), then
    SIGKILL for any still running. A cancellation that arrives while they stop does not cut
    this short; it is raised once they are all gone. If this process dies without leaving the
    block (SIGKILL included), its workers stop by themselves within ``stop_grace`` plus 5
    seconds (the pool's small temporary directory is then left behind). A pool is entered
    once.

    ``ValueError``, naming the argument, for ``workers`` or ``max_frame_bytes`` below 1, a
    ``handlers`` that is not ``"module:attribute"``, an unknown ``transport``, durations that are
    not positive, or a negative ``max_restarts`` (also a ``TypeError`` where the argument is
    not a number at all); :class:`~shardline.MissingExtra` when the ``transport``'s extra
    (of the same name) is not installed, checked here rather than in every worker.

    Implementation notes: each worker is ``python -m shardline.transport.local.worker`` (the
    same interpreter, this process's ``sys.path`` given as ``PYTHONPATH``), in a session of its
    own so that a terminal's Ctrl-C reaches only this
    process, which stops the workers itself. The workers are announced through
    ``LocalDiscovery`` in a namespace of the pool's own (``local-pool-<uuid4>``) whose
    database lives in a temporary directory that leaving the block removes; the proxy follows
    it with a subscription of this process's own handle, through which the pool also withdraws
    the record of a worker that died. The pool gives each worker its uid, so it knows which
    record is which process. A worker's standard output and error go to one pipe the pool
    drains: each line is logged at DEBUG on this module's logger, and the last
    ``2000`` bytes are kept for the messages above. Each worker's standard input is a pipe
    this process never writes to; its end of file is how a worker learns that this process is
    gone (see :mod:`shardline.transport.local.worker`).
    """

    def __init__(
        self,
        handlers: str,
        workers: int | None = None,
        *,
        transport: str = DEFAULT_TRANSPORT,
        start_timeout: float = 30.0,
        stop_grace: float = 5.0,
        max_restarts: int = 10,
        restart_window: float = 60.0,
        timeout: float = DEFAULT_TIMEOUT,
        loadbalancer: BalancerSpec = RoundRobinLoadBalancer,
        health: HealthPolicy | None = DEFAULT_HEALTH,
        tls: TlsSettings | None = None,
        limits: WorkerLimits | None = None,
        max_frame_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        self._spec = check_spec(handlers)
        if tls is not None:
            if not isinstance(tls, TlsSettings):
                raise InvalidArgumentType(f"tls must be a TlsSettings, not {tls!r}")
            tls.server_context()  # the workers serve with it: bad files are said here
        self._tls = tls
        self._timeout = check_seconds("timeout", timeout)
        self._loadbalancer = loadbalancer
        self._health = health
        if workers is None:
            workers = os.cpu_count() or 1
        check_count("workers", workers)
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, not {transport!r}")
        if limits is not None and transport != "msgpack":
            raise ValueError(f"limits apply to the msgpack transport, not {transport!r}")
        self._limits = limits
        self._max_frame_bytes = check_count("max_frame_bytes", max_frame_bytes)
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
            raise refusal(max_restarts, int)(
                f"max_restarts must be an int >= 0, not {max_restarts!r}"
            )
        self._workers = workers
        self._transport = transport
        self._start_timeout = check_seconds("start_timeout", start_timeout)
        self._stop_grace = check_seconds("stop_grace", stop_grace)
        self._max_restarts = max_restarts
        self._restart_window = check_seconds("restart_window", restart_window)
        require_extra(transport, f"LocalPool(transport={transport!r})")
        self._state = "new"  # then "starting", "running", "stopping", "stopped"
        self._running: dict[uuid.UUID, _Worker] = {}
        self._restarts: collections.deque[float] = collections.deque()
        self._replacing = True
        self._died_starting: tuple[_Worker, int] | None = None
        self._changed = asyncio.Event()
        self._connections: list[Connection] = []
        # every watcher still running, also of a worker that died and left _running
        self._watches: set[asyncio.Task[None]] = set()
        self._directory: str | None = None
        self._namespace = f"local-pool-{uuid.uuid4().hex}"
        self._discovery: LocalDiscovery | None = None
        self._subscription: Subscription | None = None
        self._proxy: WorkerProxy | None = None
        self._stopping: asyncio.Future[None] | None = None

    def __repr__(self) -> str:
        return f"LocalPool({self._spec!r}, workers={self._workers}, {self._state})"

    @property
    def workers(self) -> list[WorkerMetadata]:
        """The records of the pooled workers, in admission order."""
        return [] if self._proxy is None else self._proxy.workers

    @property
    def pids(self) -> list[int]:
        """The pids of the worker processes running now."""
        return [w.pid for w in self._running.values() if w.process.returncode is None]

    async def dispatch(
        self, task: Any, *, timeout: float | None = None, idempotent: bool | None = None
    ) -> Any:
        """Runs ``task`` on one of the workers; see :meth:`shardline.WorkerProxy.dispatch`."""
        if self._state != "running" or self._proxy is None:
            raise RuntimeError(f"{self!r} is not running: dispatch inside `async with`")
        return await self._proxy.dispatch(task, timeout=timeout, idempotent=idempotent)

    def stream(
        self, task: Any, *, timeout: float | None = None, idempotent: bool | None = None
    ) -> ProxyStream:
        """The items of ``task`` streamed from one of the workers; see
        :meth:`shardline.WorkerProxy.stream`."""
        if self._state != "running" or self._proxy is None:
            raise RuntimeError(f"{self!r} is not running: stream inside `async with`")
        return self._proxy.stream(task, timeout=timeout, idempotent=idempotent)

    @property
    def proxy(self) -> WorkerProxy:
        """The pool's proxy, for its :meth:`~shardline.WorkerProxy.stats` and
        :meth:`~shardline.WorkerProxy.explain`; ``RuntimeError`` before the pool started."""
        if self._proxy is None:
            raise RuntimeError(f"{self!r} has not started: its proxy is made on entering it")
        return self._proxy

    async def __aenter__(self) -> LocalPool:
        if self._state != "new":
            raise RuntimeError(f"{self!r} was entered already: a LocalPool is entered once")
        self._state = "starting"
        try:
            await self._start()
        except BaseException:
            await self._stop()
            raise
        self._state = "running"
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self._stop()

    # -- starting -------------------------------------------------------------------------

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._start_timeout
        logger.info(
            "LocalPool %r: starting %d workers (transport %s, namespace %s)",
            self._spec,
            self._workers,
            self._transport,
            self._namespace,
        )
        self._directory = tempfile.mkdtemp(prefix="shardline-local-pool-")
        self._discovery = LocalDiscovery(self._namespace, directory=self._directory)
        self._subscription = self._discovery.subscribe()

        # each transport's connection names its bound in its own words
        limit = "max_frame_bytes" if self._transport == "msgpack" else "max_message_bytes"
        options: dict[str, Any] = {limit: self._max_frame_bytes}
        if self._tls is not None:
            options["tls"] = self._tls

        def connect_and_keep(metadata: WorkerMetadata) -> Connection:
            made = connect(metadata, **options)
            self._connections.append(made)
            return made

        self._proxy = WorkerProxy(
            discovery=self._follow(self._subscription),
            connect=connect_and_keep,
            quorum=0,
            timeout=self._timeout,
            loadbalancer=self._loadbalancer,
            health=self._health,
        )
        await self._proxy.start()
        for _ in range(self._workers):
            await self._spawn()
        await self._joined(deadline)
        logger.info(
            "LocalPool %r: %d workers joined (pids %s)",
            self._spec,
            self._workers,
            ", ".join(map(str, self.pids)),
        )

    async def _follow(self, subscription: Subscription) -> AsyncIterator[DiscoveryEvent]:
        """The proxy's discovery stream. ``_changed`` is set as each event is handed over; the
        proxy applies the event before it asks for the next one, which is before anyone woken
        by ``_changed`` runs, so a waiter that wakes sees the event applied."""
        async for event in subscription:
            self._changed.set()
            yield event

    async def _joined(self, deadline: float) -> None:
        """Returns once every worker started has joined the proxy's pool."""
        loop = asyncio.get_running_loop()
        while True:
            self._changed.clear()
            if self._died_starting is not None:
                worker, status = self._died_starting
                raise WorkerStartError(
                    f"LocalPool {self._spec!r}: worker pid {worker.pid} exited with status"
                    f" {status} before it joined; its output ends with:\n{worker.output()}"
                )
            pooled = {metadata.uid for metadata in self.workers}
            missing = [w for uid, w in self._running.items() if uid not in pooled]
            if not missing:
                return
            remaining = deadline - loop.time()
            if remaining <= 0:
                waiting = "; ".join(
                    f"pid {w.pid} (still running), its output so far: {w.output()}" for w in missing
                )
                raise TimeoutError(
                    f"LocalPool {self._spec!r}: {self._workers - len(missing)} of the"
                    f" {self._workers} workers joined within {self._start_timeout:g} s"
                    f" (start_timeout); not joined: {waiting}"
                )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._changed.wait()

    async def _spawn(self) -> _Worker:
        assert self._directory is not None
        uid = uuid.uuid4()
        environment = dict(os.environ)
        # the worker imports the handlers with this process's sys.path, as the caller would
        environment["PYTHONPATH"] = os.pathsep.join(
            # "" (the current directory) included, as an absolute path
            os.path.abspath(entry)
            for entry in sys.path
            if isinstance(entry, str)
        )
        address = self._address(uid)
        tls_files = []
        if self._tls is not None and not address.startswith("/"):
            assert self._tls.cert is not None
            assert self._tls.key is not None
            tls_files = ["--tls-cert", self._tls.cert, "--tls-key", self._tls.key]
            if self._tls.ca is not None:
                tls_files += ["--tls-ca", self._tls.ca]
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "shardline.transport.local.worker",
            "--handlers", self._spec,
            "--namespace", self._namespace,
            "--directory", self._directory,
            "--transport", self._transport,
            "--address", address,
            "--uid", str(uid),
            "--grace", repr(self._stop_grace),
            "--max-frame-bytes", str(self._max_frame_bytes),
            *tls_files,
            *(f"--limit={setting}" for setting in (self._limits or WorkerLimits()).settings()),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            env=environment,
        )  # fmt: skip
        worker = _Worker(uid, process)
        self._running[uid] = worker
        worker.drain = asyncio.create_task(self._drain(worker))
        worker.watch = asyncio.create_task(self._watch(worker))
        self._watches.add(worker.watch)
        worker.watch.add_done_callback(self._watches.discard)
        logger.info("LocalPool %r: started worker pid %d (uid %s)", self._spec, worker.pid, uid)
        return worker

    def _address(self, uid: uuid.UUID) -> str:
        """Where the worker ``uid`` serves: a Unix socket in the pool's directory for msgpack
        (same host: no TCP stack in the way), loopback TCP for gRPC or when the directory's
        path is too long for a socket's."""
        assert self._directory is not None
        if self._transport == "msgpack":
            path = os.path.join(self._directory, f"{uid.hex[:12]}.sock")
            if len(os.fsencode(path)) <= _MAX_SOCKET_PATH:
                return path
        return LOOPBACK

    # -- while running --------------------------------------------------------------------

    async def _drain(self, worker: _Worker) -> None:
        """Reads the worker's output to its end: each line logged at DEBUG, the tail kept."""
        stream = worker.process.stdout
        assert stream is not None
        pending = b""
        while chunk := await stream.read(65536):
            worker.tail += chunk
            del worker.tail[:-_TAIL_BYTES]
            *lines, pending = (pending + chunk).split(b"\n")
            if len(pending) > _LINE_BYTES:
                lines.append(pending)
                pending = b""
            for line in lines:
                logger.debug("worker pid %d: %s", worker.pid, line.decode(errors="replace"))
        if pending:
            logger.debug("worker pid %d: %s", worker.pid, pending.decode(errors="replace"))

    async def _watch(self, worker: _Worker) -> None:
        """Waits for the worker to exit; unless the pool is stopping, reports it, withdraws its
        record and replaces it (or, while starting, fails the start)."""
        status = await worker.process.wait()
        assert worker.drain is not None
        # the rest of its output, for the message; a grandchild may keep the pipe open
        await asyncio.wait([worker.drain], timeout=_DRAIN_WAIT)
        worker.drain.cancel()
        if self._state in ("stopping", "stopped"):
            return
        del self._running[worker.uid]
        await self._withdraw(worker)
        self._changed.set()
        if self._state in ("stopping", "stopped"):
            # the pool began to stop during the withdrawal (a failed start, say): no replacement
            return
        if self._state == "starting":
            # the start fails with this worker's exit in its message: no log of it
            if self._died_starting is None:
                self._died_starting = (worker, status)
            return
        logger.warning(
            "LocalPool %r: worker pid %d (uid %s) exited with status %d; its output ends with:\n%s",
            self._spec,
            worker.pid,
            worker.uid,
            status,
            worker.output(),
        )
        if self._may_replace():
            try:
                replacement = await self._spawn()
            except Exception:  # nothing would see it raised from this background task
                logger.exception("LocalPool %r: cannot start a worker", self._spec)
                return
            logger.info(
                "LocalPool %r: worker pid %d replaced by pid %d",
                self._spec,
                worker.pid,
                replacement.pid,
            )

    async def _withdraw(self, worker: _Worker) -> None:
        """Withdraws a dead worker's record now rather than when its liveness runs out, so
        the proxy stops offering it calls at once."""
        assert self._discovery is not None
        # a withdrawal is by uid: the rest of the record does not matter
        record = WorkerMetadata(uid=worker.uid, address="", pid=worker.pid, version="")
        try:
            await self._discovery.publisher.publish("worker-dropped", record)
        except Exception:
            logger.exception(
                "LocalPool %r: withdrawing the record of worker pid %d failed; it goes when its"
                " liveness runs out",
                self._spec,
                worker.pid,
            )

    def _may_replace(self) -> bool:
        """Counts a replacement if the restart rate allows it; the first refusal is an ERROR
        and ends replacements for good."""
        if not self._replacing:
            return False
        now = asyncio.get_running_loop().time()
        while self._restarts and self._restarts[0] <= now - self._restart_window:
            self._restarts.popleft()
        if len(self._restarts) < self._max_restarts:
            self._restarts.append(now)
            return True
        self._replacing = False
        logger.error(
            "LocalPool %r: %d workers were replaced within %g s (max_restarts=%d,"
            " restart_window=%g): dead workers are no longer replaced; %d left",
            self._spec,
            len(self._restarts),
            self._restart_window,
            self._max_restarts,
            self._restart_window,
            len(self._running),
        )
        return False

    # -- stopping -------------------------------------------------------------------------

    async def _stop(self) -> None:
        """Stops everything once; a cancellation meanwhile is raised when it is done."""
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._shutdown())
        cancelled = False
        while True:
            try:
                await asyncio.shield(self._stopping)
            except asyncio.CancelledError:
                if self._stopping.done():
                    raise
                cancelled = True
            else:
                break
        if cancelled:
            raise asyncio.CancelledError

    async def _shutdown(self) -> None:
        self._state = "stopping"
        # a watcher may be starting a replacement: cancelled, it either has started it (and
        # it is in _running) or it has not (asyncio kills a process whose start is cancelled)
        while watchers := [watch for watch in self._watches if not watch.done()]:
            for watcher in watchers:
                watcher.cancel()
            await asyncio.wait(watchers)
        workers = list(self._running.values())
        try:
            try:
                if self._proxy is not None:
                    await self._proxy.stop()  # raises what ended its sentinel, if anything did
                if self._subscription is not None:
                    await self._subscription.aclose()
            finally:
                await self._terminate(workers)
            for connection in self._connections:
                close = getattr(connection, "close", None)
                if callable(close):
                    close()
            if self._discovery is not None:
                await self._discovery.aclose()
        finally:
            if self._directory is not None:
                shutil.rmtree(self._directory, ignore_errors=True)
            self._state = "stopped"
        logger.info("LocalPool %r: stopped %d workers", self._spec, len(workers))

    async def _terminate(self, workers: list[_Worker]) -> None:
        """SIGTERM, then SIGKILL after ``stop_grace`` for those still running; returns once
        every process has exited and its output is read."""
        for worker in workers:
            if worker.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    worker.process.terminate()
        exits = [asyncio.ensure_future(w.process.wait()) for w in workers]
        if exits:
            _, late = await asyncio.wait(exits, timeout=self._stop_grace)
            for worker in workers:
                if worker.process.returncode is None:
                    logger.warning(
                        "LocalPool %r: worker pid %d still running %g s after SIGTERM: SIGKILL",
                        self._spec,
                        worker.pid,
                        self._stop_grace,
                    )
                    with contextlib.suppress(ProcessLookupError):
                        worker.process.kill()
            if late:
                await asyncio.wait(late)
        drains = [w.drain for w in workers if w.drain is not None]
        if drains:
            # a grandchild that inherited the pipe may keep it open: stop reading after a while
            _, unfinished = await asyncio.wait(drains, timeout=_DRAIN_WAIT)
            for drain in unfinished:
                drain.cancel()
