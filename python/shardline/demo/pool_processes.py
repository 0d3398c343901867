"""The worker-pool part of ``shardline demo`` with real worker processes (the default).

Each worker is a ``python -m shardline worker`` process serving the demo handlers over
MessagePack-RPC on loopback, announced through ``LocalDiscovery`` in a private temporary
directory (or through etcd, given its URL), in a namespace of its own. A
:class:`shardline.WorkerProxy` follows that namespace and reaches the workers with
:func:`shardline.transport.connect`. From the quorum on, a few callers dispatch ``whoami`` tasks
(each answers the pid of the process that served it) continuously, while the driver changes the
cluster in phases:

1. workers w1, w2 and w3 join (the proxy starts with a quorum of 3);
2. w2 moves: a new process starts with w2's uid (its record replaces the old one: the proxy
   gets ``worker-updated``), then the old process gets SIGTERM and exits, withdrawing nothing,
   because the record is no longer its own;
3. w4 joins;
4. w1 is SIGKILLed: dispatches to it fail transiently (its connection is lost, then refused)
   and the proxy retries them on another worker, until the liveness bound drops w1's record;
5. w3 leaves gracefully: SIGTERM, it withdraws its record and exits 0.

What is shown is measured. Every connection the proxy makes is wrapped: it counts the tasks
answered through it and its transient failures, and for each task checks, when the proxy sends
it, that the connection's record is still the one registered for its worker (the demo mirrors
the discovery events on their way to the proxy) and, when it is answered, that the pid in the
answer is the pid that record names. A task failing either check is counted as sent to a
superseded address.

Every process the driver starts is stopped before it returns, on errors and interruptions
too, and the temporary directory (the namespace's database, the workers' logs) is removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardline import DiscoveryEvent, WorkerMetadata, WorkerProxy
from shardline.balancers import create_balancer
from shardline.demo.pool import (
    AddressRow,
    PhaseReport,
    PoolDemoError,
    PoolRun,
    PoolView,
    status_of,
)
from shardline.discovery.protocol import Discovery
from shardline.discovery.record import decode_record
from shardline.errors import TransientRpcError

__all__ = ["Settings", "run_process_pool_demo"]

logger = logging.getLogger("shardline.demo")

_WEIGHTS = {"w1": 1, "w2": 2, "w3": 1, "w4": 2}
_LOG_TAIL = 2000  # characters of a worker's log quoted when it fails


@dataclass(frozen=True, slots=True)
class Settings:
    """How the demo runs. ``heartbeat``/``liveness_timeout`` are LocalDiscovery's (short, so a
    killed worker is dropped within about a second); ``ttl`` the etcd lease's (etcd's minimum
    is about 2 s with its default timings). ``callers`` dispatch continuously, pausing
    ``pause`` seconds between tasks; a phase ends once its change has reached the proxy and
    ``dwell_tasks`` more tasks have been answered. ``timeout`` bounds every wait: for a worker
    to be ready, for a change to reach the proxy (plus the liveness bound), for a task."""

    heartbeat: float = 0.2
    liveness_timeout: float = 1.0
    ttl: int = 2
    callers: int = 4
    pause: float = 0.005
    dwell_tasks: int = 120
    timeout: float = 20.0


@dataclass(slots=True)
class _Worker:
    """One ``shardline worker`` process the driver started."""

    name: str
    uid: uuid.UUID
    process: asyncio.subprocess.Process
    log: Path
    record: WorkerMetadata | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def state(self) -> str:
        code = self.process.returncode
        if code is None:
            return "running"
        if code < 0:
            return f"killed ({signal.Signals(-code).name})"
        return f"exited {code}"

    def log_tail(self) -> str:
        try:
            text = self.log.read_text(errors="replace").strip()
        except OSError:
            return "(no log)"
        return text[-_LOG_TAIL:] if text else "(its log is empty)"


@dataclass(slots=True)
class _Address:
    """What happened at one (uid, address), the phase's counts reset at each phase."""

    name: str
    uid: uuid.UUID
    address: str
    pid: int
    tasks: int = 0
    tasks_so_far: int = 0
    failures: int = 0
    reasons: Counter[str] = field(default_factory=Counter)  # of the phase's failures
    superseded: int = 0
    tasks_when_superseded: int | None = None  # ``tasks`` when the proxy got the change


@dataclass(slots=True)
class _Phase:
    number: int
    description: str
    started: float
    events: list[tuple[float, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    tasks: int = 0
    failed: Counter[str] = field(default_factory=Counter)  # why tasks failed altogether


class _LogToPhase(logging.Handler):
    """Shows this process's shardline warnings (e.g. a reaped publisher) among the phase's
    events instead of on stderr. ``emit`` may run on a discovery worker thread: it only
    appends to a list."""

    def __init__(self, demo: _Demo) -> None:
        super().__init__(logging.WARNING)
        self._demo = demo

    def emit(self, record: logging.LogRecord) -> None:
        try:
            # the temporary directory's path says nothing and makes the line long
            message = record.getMessage().replace(str(self._demo.directory), "<tmp>")
            self._demo.event(f"log {record.levelname.lower()} {record.name}: {message}")
        except Exception:
            self.handleError(record)


class _ObservedConnection:
    """The proxy's connection to one worker (the transport its address names) that reports to
    the demo."""

    def __init__(self, demo: _Demo, metadata: WorkerMetadata) -> None:
        from shardline.transport import connect

        self._demo = demo
        self.metadata = metadata
        self._inner = connect(metadata)
        demo.connections.add(self)

    async def dispatch(self, task: Any, *, timeout: float | None = None) -> Any:
        metadata = self.metadata
        registered = self._demo.registry.get(metadata.uid)
        stale = registered is None or (registered.address, registered.pid) != (
            metadata.address,
            metadata.pid,
        )
        try:
            reply = await self._inner.dispatch(task, timeout=timeout)
        except TransientRpcError as error:
            self._demo.failed_at(metadata, _reason(error))
            raise
        self._demo.answered(metadata, reply, stale=stale)
        return reply

    def close(self) -> None:
        self._inner.close()
        self._demo.connections.discard(self)


class _Demo:
    def __init__(
        self,
        balancer: str,
        etcd: str | None,
        settings: Settings,
        directory: Path,
        view: PoolView | None,
        started: list[_Worker],
    ) -> None:
        self.settings = settings
        self.etcd = etcd
        self.directory = directory
        self.view = view
        self.workers = started  # every process started, kept by the caller for a last resort
        self.namespace = f"shardline-demo-{uuid.uuid4().hex[:12]}"
        self.balancer = create_balancer(balancer)
        self.balancer_name = type(self.balancer).__name__
        self.names: dict[uuid.UUID, str] = {}
        self.registry: dict[uuid.UUID, WorkerMetadata] = {}  # as delivered to the proxy
        self.addresses: dict[tuple[uuid.UUID, str], _Address] = {}
        self.connections: set[_ObservedConnection] = set()
        self.callers: list[asyncio.Task[None]] = []
        self.terminated = False  # by SIGTERM or SIGHUP
        self.answered_count = 0
        self.t0 = time.monotonic()
        self.phase = _Phase(0, "", self.t0)
        self.run = PoolRun(self.balancer_name, header=self._header(), processes=True, phase_count=5)

    # -- what the proxy and its connections report ----------------------------------------

    def event(self, text: str) -> None:
        self.phase.events.append((time.monotonic(), text))

    def _name(self, metadata: WorkerMetadata) -> str:
        return self.names.get(metadata.uid, str(metadata.uid)[:8])

    def _describe(self, metadata: WorkerMetadata) -> str:
        return (
            f"{self._name(metadata)} {str(metadata.uid)[:8]} at {metadata.address}"
            f" (pid {metadata.pid})"
        )

    async def mirror(
        self, subscription: AsyncIterator[DiscoveryEvent]
    ) -> AsyncIterator[DiscoveryEvent]:
        """The proxy's discovery stream, recorded on its way: the proxy applies each event as
        soon as this yields it, so ``registry`` is what the proxy's pool was built from."""
        async for event in subscription:
            metadata = event.metadata
            previous = self.registry.get(metadata.uid)
            if previous is not None and (event.type == "worker-dropped" or previous != metadata):
                superseded = self.addresses.get((previous.uid, previous.address))
                if superseded is not None:
                    superseded.tasks_when_superseded = superseded.tasks
            if event.type == "worker-dropped":
                self.registry.pop(metadata.uid, None)
            else:
                self.registry[metadata.uid] = metadata
                key = (metadata.uid, metadata.address)
                if key not in self.addresses:
                    self.addresses[key] = _Address(
                        self._name(metadata), metadata.uid, metadata.address, metadata.pid
                    )
            self.event(f"the proxy got {event.type} {self._describe(metadata)}")
            yield event

    def connect(self, metadata: WorkerMetadata) -> _ObservedConnection:
        return _ObservedConnection(self, metadata)

    def _address(self, metadata: WorkerMetadata) -> _Address:
        key = (metadata.uid, metadata.address)
        found = self.addresses.get(key)
        if found is None:
            found = self.addresses[key] = _Address(
                self._name(metadata), metadata.uid, metadata.address, metadata.pid
            )
        return found

    def answered(self, metadata: WorkerMetadata, reply: Any, *, stale: bool) -> None:
        at = self._address(metadata)
        pid = reply.get("pid") if isinstance(reply, dict) else None
        if pid != metadata.pid:
            logger.warning(
                "a task sent to %s was answered by pid %r", self._describe(metadata), pid
            )
            stale = True
        at.tasks += 1
        at.tasks_so_far += 1
        at.superseded += stale
        self.phase.tasks += 1
        self.answered_count += 1
        self.run.per_address[at.name, at.address] += 1
        self.run.pids[at.address] = at.pid
        self.run.superseded += stale

    def failed_at(self, metadata: WorkerMetadata, reason: str) -> None:
        at = self._address(metadata)
        at.failures += 1
        at.reasons[reason] += 1
        self.run.retried += 1

    # -- the driver ----------------------------------------------------------------------

    def _header(self) -> tuple[str, ...]:
        s = self.settings
        if self.etcd is None:
            source = (
                f"LocalDiscovery (namespace {self.namespace}, in a private temporary directory)"
            )
            liveness = (
                f"liveness: heartbeat {s.heartbeat:g} s; a worker that dies is dropped"
                f" {s.liveness_timeout:g} s after its last heartbeat"
            )
        else:
            source = f"etcd at {self.etcd} (namespace {self.namespace})"
            liveness = (
                f"liveness: each worker's record is on a lease of {s.ttl} s (etcd may grant"
                " more); a worker that dies is dropped when its lease expires"
            )
        return (
            f"Worker pool: a WorkerProxy over {source} and real worker processes"
            " (`shardline worker`, MessagePack-RPC on 127.0.0.1), reached with"
            " shardline.transport.connect",
            liveness,
            f"balancer: {self.balancer_name}; {s.callers} callers dispatch `whoami` tasks"
            " (answered with the serving process's pid) continuously from the quorum on;"
            " a phase's tasks are those answered while it ran",
        )

    def open_discovery(self) -> Discovery:
        if self.etcd is None:
            from shardline.discovery.local import LocalDiscovery

            return LocalDiscovery(
                self.namespace,
                directory=self.directory / "shardline",
                heartbeat=self.settings.heartbeat,
                liveness_timeout=self.settings.liveness_timeout,
            )
        from shardline.discovery.etcd import EtcdDiscovery

        return EtcdDiscovery([self.etcd], self.namespace)

    async def spawn(self, name: str, uid: uuid.UUID | None = None) -> _Worker:
        """Starts ``shardline worker`` as ``name`` and waits for its ready line."""
        uid = uid or uuid.uuid4()
        self.names[uid] = name
        arguments = [
            "--namespace", self.namespace,
            "--address", "127.0.0.1:0",
            "--uid", str(uid),
            "--grace", "1",
            "--weight", str(_WEIGHTS[name]),
        ]  # fmt: skip
        if self.etcd is None:
            arguments += [
                "--heartbeat", str(self.settings.heartbeat),
                "--liveness-timeout", str(self.settings.liveness_timeout),
            ]  # fmt: skip
        else:
            arguments += ["--etcd", self.etcd, "--ttl", str(self.settings.ttl)]
        log = self.directory / f"{name}-{len(self.workers) + 1}.log"
        with log.open("wb") as stderr:
            process = await _start(
                sys.executable,
                "-m",
                "shardline",
                "worker",
                *arguments,
                stdin=asyncio.subprocess.DEVNULL,
                # Ctrl-C on a terminal reaches the demo only, which stops its workers itself
                start_new_session=True,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                env={**os.environ, "XDG_RUNTIME_DIR": str(self.directory)},
            )
        worker = _Worker(name, uid, process, log)
        self.workers.append(worker)
        assert process.stdout is not None
        try:
            async with asyncio.timeout(self.settings.timeout):
                line = await process.stdout.readline()
        except TimeoutError:
            raise PoolDemoError(
                f"worker {name} (pid {worker.pid}) was not ready within"
                f" {self.settings.timeout:g} s; its log:\n{worker.log_tail()}"
            ) from None
        if not line:
            await process.wait()
            raise PoolDemoError(
                f"worker {name} (pid {worker.pid}) {worker.state} before it was ready;"
                f" its log:\n{worker.log_tail()}"
            )
        try:
            worker.record = decode_record(line.rstrip(b"\n"))
        except ValueError as error:
            raise PoolDemoError(
                f"worker {name} (pid {worker.pid}) printed {line!r}, not its record: {error}"
            ) from None
        self.event(f"{name} ready: pid {worker.pid} serves at {worker.record.address}")
        return worker

    async def signal(self, worker: _Worker, signum: signal.Signals | None) -> None:
        """Sends ``signum`` (unless ``None``: it was sent already) and waits for the process
        to exit, killing it if it has not after the timeout."""
        if signum is not None and worker.process.returncode is None:
            worker.process.send_signal(signum)
        try:
            async with asyncio.timeout(self.settings.timeout):
                await worker.process.wait()
        except TimeoutError:
            logger.warning("worker %s (pid %d) did not exit: killed", worker.name, worker.pid)
            worker.process.kill()
            await worker.process.wait()

    async def until(self, done: Callable[[], bool], what: str, timeout: float) -> float:
        """Waits until ``done()``; returns the seconds waited, or fails after ``timeout``."""
        started = time.monotonic()
        while not done():
            if self.callers and all(caller.done() for caller in self.callers):
                raise PoolDemoError("the callers stopped dispatching")
            if time.monotonic() - started > timeout:
                raise PoolDemoError(f"{what} did not happen within {timeout:g} s")
            await asyncio.sleep(0.005)
        return time.monotonic() - started

    def pooled(self, proxy: WorkerProxy) -> set[tuple[uuid.UUID, str, int]]:
        return {(m.uid, m.address, m.pid) for m in proxy.workers}

    async def dwell(self) -> None:
        target = self.answered_count + self.settings.dwell_tasks
        await self.until(
            lambda: self.answered_count >= target,
            f"{self.settings.dwell_tasks} more answered tasks",
            self.settings.timeout,
        )

    def begin(self, number: int, description: str) -> None:
        self.phase = _Phase(number, description, time.monotonic())
        for at in self.addresses.values():
            at.tasks = at.failures = at.superseded = 0
            at.reasons.clear()

    def end(self, proxy: WorkerProxy) -> None:
        phase = self.phase
        status = status_of(proxy.workers)
        processes = {w.pid: w for w in self.workers}
        rows = []
        for (uid, address), at in sorted(
            self.addresses.items(), key=lambda item: (item[1].name, item[1].pid)
        ):
            process = processes.get(at.pid)
            rows.append(
                AddressRow(
                    at.name,
                    uid,
                    address,
                    status(uid, address),
                    at.tasks,
                    at.tasks_so_far,
                    pid=at.pid,
                    process=None if process is None else process.state,
                    failures=at.failures,
                    superseded=at.superseded,
                )
            )
        events = tuple(f"+{at - phase.started:.2f} s {text}" for at, text in sorted(phase.events))
        report = PhaseReport(
            phase.number,
            phase.description,
            events,
            self.balancer_name,
            phase.tasks,
            tuple(rows),
            pool=tuple(self._describe(m) for m in proxy.workers),
            retried=sum(row.failures for row in rows),
            failed=phase.failed.total(),
            superseded=sum(row.superseded for row in rows),
            notes=(
                *phase.notes,
                *(
                    f"{count} task{'' if count == 1 else 's'} failed: {why}"
                    for why, count in phase.failed.most_common()
                ),
            ),
        )
        self.run.phases.append(report)
        if self.view is not None:
            self.view.phase(self.run, report)

    async def stop_callers(self, stop: asyncio.Event) -> None:
        """Lets each caller finish its task in flight, then dispatch no more."""
        stop.set()
        await asyncio.gather(*self.callers, return_exceptions=True)

    async def call(self, proxy: WorkerProxy, stop: asyncio.Event) -> None:
        from shardline.transport import Task

        while not stop.is_set():
            try:
                # whoami only reads: idempotent, so a call on a worker killed under it goes
                # on to another worker rather than fail as "may have run"
                await proxy.dispatch(
                    Task("whoami", idempotent=True), timeout=self.settings.timeout / 4
                )
            except Exception as error:  # counted and shown; the flow goes on
                self.phase.failed[f"{type(error).__name__}: {error}"] += 1
                self.run.failed += 1
            await asyncio.sleep(self.settings.pause)

    # -- the scenario --------------------------------------------------------------------

    async def main(self) -> PoolRun:
        # SIGTERM and SIGHUP end the run like Ctrl-C does: with every worker stopped. The
        # workers run in sessions of their own, so nothing else would stop them.
        loop = asyncio.get_running_loop()
        main = asyncio.current_task()
        assert main is not None

        def terminate() -> None:
            self.terminated = True
            main.cancel()

        handled = []
        for signum in (signal.SIGTERM, signal.SIGHUP):
            try:
                loop.add_signal_handler(signum, terminate)
            except (ValueError, RuntimeError, NotImplementedError):  # not the main thread
                continue
            handled.append(signum)
        try:
            return await self._main()
        finally:
            for signum in handled:
                loop.remove_signal_handler(signum)

    async def _main(self) -> PoolRun:
        if self.view is not None:
            self.view.header(self.run)
        try:
            discovery = self.open_discovery()
        except (OSError, ValueError) as error:
            raise PoolDemoError(f"cannot open discovery: {error}") from None
        subscription = discovery.subscribe()
        stream = self.mirror(subscription)
        proxy = WorkerProxy(
            discovery=stream,
            loadbalancer=self.balancer,
            connect=self.connect,
            quorum=3,
            quorum_timeout=self.settings.timeout,
        )
        stop = asyncio.Event()
        try:
            await self.scenario(proxy, stop)
        finally:
            await self.stop_callers(stop)
            await proxy.stop()
            with contextlib.suppress(Exception):
                await stream.aclose()  # type: ignore[attr-defined]
            with contextlib.suppress(Exception):
                await subscription.aclose()
            for connection in list(self.connections):
                connection.close()
            running = [w for w in self.workers if w.process.returncode is None]
            await asyncio.gather(
                *(self.signal(w, signal.SIGTERM) for w in running), return_exceptions=True
            )
            self.run.closing = (
                "the worker processes still running were sent SIGTERM: "
                + ", ".join(f"{w.name} pid {w.pid} {w.state}" for w in running)
                if running
                else "no worker process was left running"
            )
            await discovery.aclose()
            await asyncio.sleep(0.01)  # lets the channels' closing tasks finish
        if self.view is not None:
            self.view.summary(self.run)
        return self.run

    async def scenario(self, proxy: WorkerProxy, stop: asyncio.Event) -> None:
        s = self.settings
        self.begin(1, "workers w1, w2, w3 join")
        self.event("start w1, w2, w3 (`shardline worker` processes)")
        starting = asyncio.ensure_future(proxy.start())
        try:
            w1, w2, w3 = await asyncio.gather(self.spawn("w1"), self.spawn("w2"), self.spawn("w3"))
            await starting
        except TimeoutError as error:
            raise PoolDemoError(str(error)) from None
        finally:
            if not starting.done():
                starting.cancel()
        self.callers = [
            asyncio.create_task(self.call(proxy, stop), name=f"caller {n}")
            for n in range(s.callers)
        ]
        await self.dwell()
        self.end(proxy)

        self.begin(2, "w2 moves to a new process and address (same uid)")
        self.event(f"start a new w2 process with w2's uid {str(w2.uid)[:8]}")
        moved = await self.spawn("w2", w2.uid)
        await self.until(
            lambda: (w2.uid, _at(moved), moved.pid) in self.pooled(proxy),
            "the proxy seeing w2's new address",
            s.timeout,
        )
        old = self.addresses[w2.uid, _at(w2)]
        self.event(f"SIGTERM to the old w2 process (pid {w2.pid})")
        await self.signal(w2, signal.SIGTERM)
        self.event(f"old w2 process {w2.state}")
        await self.dwell()
        sent_after = (
            "all sent before the proxy got the update"
            if not old.superseded
            else f"{old.superseded} of them sent after the proxy got the update"
        )
        in_flight = old.tasks - (old.tasks_when_superseded or 0)
        self.phase.notes.append(
            f"the old w2 process answered {old.tasks} tasks in this phase, {sent_after}"
            f" ({in_flight} of them still in flight when it came)"
        )
        registered = self.registry.get(w2.uid)
        if registered is not None and registered.pid == moved.pid:
            self.phase.notes.append(
                f"w2's record still names the new process (pid {moved.pid}) after the old one"
                f" {w2.state}: the old process withdrew nothing, as the record was no longer"
                " its own"
            )
        else:
            now = "gone" if registered is None else f"names pid {registered.pid}"
            self.phase.notes.append(
                f"w2's record is {now} after the old process {w2.state}, where it should still"
                f" name the new process (pid {moved.pid})"
            )
        self.end(proxy)

        self.begin(3, "w4 joins")
        self.event("start w4")
        w4 = await self.spawn("w4")
        await self.until(lambda: w4.uid in self.registry, "the proxy seeing w4", s.timeout)
        await self.dwell()
        self.end(proxy)

        self.begin(4, "w1 is killed (SIGKILL): it cannot withdraw its record")
        self.event(f"SIGKILL to w1 (pid {w1.pid})")
        killed_at = time.monotonic()
        w1.process.kill()
        await w1.process.wait()
        bound = (s.liveness_timeout + s.heartbeat) if self.etcd is None else float(s.ttl)
        await self.until(
            lambda: w1.uid not in self.registry,
            "w1's record being dropped",
            bound + s.timeout,
        )
        dropped_after = time.monotonic() - killed_at
        await self.dwell()
        # counted at the end of the phase: a call in flight to w1 when it was dropped fails after
        at_w1 = self.addresses[w1.uid, _at(w1)]
        reasons = ", ".join(f"{n} {why}" for why, n in at_w1.reasons.most_common())
        self.phase.notes.append(
            f"w1's record was dropped {dropped_after:.2f} s after the SIGKILL; in this phase"
            f" {at_w1.failures} dispatches to it failed transiently ({reasons or 'none'}),"
            " and each time the proxy went on to the next worker the balancer offered"
        )
        self.end(proxy)

        self.begin(5, "w3 leaves gracefully (SIGTERM)")
        self.event(f"SIGTERM to w3 (pid {w3.pid})")
        terminated_at = time.monotonic()
        w3.process.terminate()
        await self.until(
            lambda: w3.uid not in self.registry, "w3's record being withdrawn", s.timeout
        )
        withdrawn_after = time.monotonic() - terminated_at
        await self.signal(w3, None)
        self.event(f"w3 process {w3.state}")
        self.phase.notes.append(
            f"w3 withdrew its record: the proxy dropped it {withdrawn_after:.2f} s after the"
            f" SIGTERM; the process: {w3.state}"
        )
        await self.dwell()
        # the last tasks in flight count in the last phase
        await self.stop_callers(stop)
        self.end(proxy)


async def _start(*command: str, **options: Any) -> asyncio.subprocess.Process:
    try:
        return await asyncio.create_subprocess_exec(*command, **options)
    except OSError as error:
        raise PoolDemoError(f"cannot start {' '.join(command[:4])}: {error}") from None


def _reason(error: TransientRpcError) -> str:
    """A transient failure's reason as the phase's notes show it: ``connection lost``,
    ``cannot connect``, ``deadline``..."""
    return error.reason.replace("-", " ")


def _at(worker: _Worker) -> str:
    assert worker.record is not None
    return worker.record.address


def _last_resort(workers: list[_Worker]) -> None:
    """Kills and reaps any process the event loop could not stop (the loop was interrupted
    again while cleaning up). A pid not reaped yet is still ours, so this kills nothing else."""
    for worker in workers:
        if worker.process.returncode is not None:
            continue
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(worker.pid, signal.SIGKILL)
            os.waitpid(worker.pid, 0)


def run_process_pool_demo(
    balancer: str = "round-robin",
    *,
    etcd: str | None = None,
    view: PoolView | None = None,
    settings: Settings | None = None,
) -> PoolRun:
    """Runs the pool scenario with real worker processes over LocalDiscovery, or over the
    etcd at ``etcd`` (a URL such as ``http://127.0.0.1:2379``), with the balancer named
    ``balancer`` (a name in the ``shardline.balancers`` entry-point group), showing it on
    ``view`` as it goes if given; returns what it recorded. Raises :class:`PoolDemoError` when
    it cannot run, and ``KeyboardInterrupt`` when interrupted (Ctrl-C, or SIGTERM or SIGHUP
    while it runs on the main thread), in every case once the processes it started are stopped
    and its temporary directory is removed. Needs ``msgpack`` (and ``aetcd`` and ``grpcio`` for
    etcd)."""
    started: list[_Worker] = []
    root = logging.getLogger("shardline")
    with tempfile.TemporaryDirectory(prefix="shardline-demo-") as directory:
        demo = _Demo(balancer, etcd, settings or Settings(), Path(directory), view, started)
        handler = _LogToPhase(demo)
        propagate = root.propagate
        root.addHandler(handler)
        root.propagate = False
        try:
            return asyncio.run(demo.main())
        except asyncio.CancelledError:
            if demo.terminated:
                raise KeyboardInterrupt from None
            raise
        finally:
            root.removeHandler(handler)
            root.propagate = propagate
            _last_resort(started)
