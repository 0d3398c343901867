"""What the tests' etcd and PostgreSQL servers share: one server binary run as a child process on
free loopback ports, its data and log in a temporary folder, started, waited for, stopped and
removed. :class:`~support.etcd_server.EtcdServer` and :class:`~support.pg_server.PgServer`
say how to run and probe their binary; this module runs it.

Anything that keeps a server from starting raises its class's :class:`ServerUnavailable`
subclass with the reason and the end of the server's log: tests that need a server fail, they
never skip.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar, Self


class ServerUnavailable(RuntimeError):
    """A server could not be found or started."""


class _CrashedAtStart(RuntimeError):
    """The server died by a signal before it was ready."""


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports free right now."""
    # all bound at once so that they differ; another process may still take one before the
    # server does, which ServerProcess.start notices and answers with new ports
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class ServerProcess:
    """One server process; ``start()``, ``stop()`` and ``restart()`` keep its ports and data;
    ``with Server() as server`` starts it and closes it afterwards.

    A subclass names the server (:attr:`name`, :attr:`unavailable`, :attr:`log_name`, the
    timeouts and stop signals) and provides :meth:`_command`, :meth:`_probe` and
    :meth:`_new_ports`; :meth:`_prepare` and :meth:`_popen_kwargs` are optional.

    Implementation notes: :meth:`start` tries up to :attr:`ATTEMPTS` times. A start that finds
    a port taken (the server's log says one of :attr:`port_taken`) moves to new ports, unless
    :meth:`_can_move` says the data ties it to its ports; a start whose process dies by a signal
    before it is ready is tried again on the same ports. The tests start servers from a process
    that may have gRPC threads running (etcd clients, gRPC workers), and a child forked from a
    multithreaded process can die before its exec (seen as SIGSEGV, right after gRPC's
    "skipping fork() handlers"). That is the fork, not the server; it never happens twice in a
    row here.
    """

    ATTEMPTS: ClassVar[int] = 3
    name: ClassVar[str]
    unavailable: ClassVar[type[ServerUnavailable]]
    log_name: ClassVar[str]
    start_timeout: ClassVar[float]
    stop_timeout: ClassVar[float]
    # sent in turn, each given stop_timeout, before a SIGKILL
    stop_signals: ClassVar[tuple[signal.Signals, ...]]
    # what the server's log says when it finds a port taken
    port_taken: ClassVar[tuple[str, ...]]

    def __init__(self, *, prefix: str) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix=prefix))
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()  # a failed start leaves its data folder and maybe a process behind
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def log(self) -> Path:
        return self.directory / self.log_name

    # what a subclass provides

    def _command(self) -> list[str]:
        """The server's command line."""
        raise NotImplementedError

    def _probe(self) -> str | None:
        """None once the server is ready, else why not yet."""
        raise NotImplementedError

    def _new_ports(self) -> None:
        """Picks new free ports after a start found one taken."""
        raise NotImplementedError

    def _can_move(self) -> bool:
        """Whether a start that found a port taken may retry on new ports."""
        return True

    def _prepare(self) -> None:
        """Runs before each start (e.g. initialises the data directory on first use)."""

    def _popen_kwargs(self) -> dict[str, Any]:
        """Extra arguments of the server's ``subprocess.Popen``."""
        return {}

    # life cycle

    def start(self) -> None:
        """Starts the server and waits until it is ready (see the class's implementation
        notes for the retries); raises :attr:`unavailable` if it cannot."""
        for attempt in range(self.ATTEMPTS):
            last = attempt == self.ATTEMPTS - 1
            try:
                self._start_once()
                return
            except _CrashedAtStart as crash:
                if last:
                    raise self.unavailable(str(crash)) from None
            except ServerUnavailable as error:
                taken = any(marker in str(error) for marker in self.port_taken)
                if not taken or last or not self._can_move():
                    raise
                self._new_ports()

    def _start_once(self) -> None:
        self._prepare()
        command = self._command()
        with self.log.open("ab") as log:
            try:
                self.process = subprocess.Popen(
                    command, stdout=log, stderr=subprocess.STDOUT, **self._popen_kwargs()
                )
            except OSError as error:
                raise self.unavailable(f"{command[0]} could not be run: {error}") from error
        deadline = time.monotonic() + self.start_timeout
        reason = "not tried"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                status = self.process.returncode
                message = f"{self.name} exited with status {status}:\n{self._log_tail()}"
                if status < 0:
                    raise _CrashedAtStart(message)
                raise self.unavailable(message)
            probed = self._probe()
            if probed is None:
                return
            reason = probed
            time.sleep(0.02)
        self.stop()
        raise self.unavailable(
            f"{self.name} not ready within {self.start_timeout} s ({reason}):\n{self._log_tail()}"
        )

    def _log_tail(self) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Stops the server: each of :attr:`stop_signals` in turn, then SIGKILL."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        for signum in self.stop_signals:
            process.send_signal(signum)
            try:
                process.wait(self.stop_timeout)
                return
            except subprocess.TimeoutExpired:
                pass
        process.kill()
        process.wait()

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        """Stops the server and removes its folder."""
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)
