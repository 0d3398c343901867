"""Wake-ups between processes for LocalDiscovery: one named pipe (FIFO) per listening handle.

A listener creates a FIFO in the namespace's doorbell directory and watches it on its event
loop; a writer, after committing a change, writes one byte to every FIFO there. A FIFO nobody
reads any more (its process died) refuses to open for writing (``ENXIO``), and the writer
removes it. A wake-up is only a hint to look: a missed one (no FIFO support, a full pipe, a
change written by another tool) costs a poll interval of delay, never a change.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path

__all__ = ["Doorbell", "ring"]

_FIFOS = hasattr(os, "mkfifo")


def ring(directory: Path) -> None:
    """Wakes every listener in ``directory`` (blocking, but never waits on a listener)."""
    if not _FIFOS:
        return
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return
    for entry in entries:
        # a listener's FIFO gets its name only once it is open, so ENXIO means dead
        if entry.name.startswith("."):
            continue
        try:
            fd = os.open(entry.path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except OSError as error:
            if error.errno == errno.ENXIO:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
            continue
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                # a full pipe already holds a wake-up the listener has not read
                with contextlib.suppress(BlockingIOError):
                    os.write(fd, b"\0")
        finally:
            os.close(fd)


class Doorbell:
    """A FIFO in ``directory`` watched on the running event loop.

    ``rung`` is an event set by the next wake-up; take it *before* looking for changes, so a
    wake-up that arrives while looking is not lost. Raises ``OSError`` or
    ``NotImplementedError`` where FIFOs or reader callbacks are not available.
    """

    def __init__(self, directory: Path) -> None:
        if not _FIFOS:
            raise NotImplementedError("no FIFOs on this platform")
        directory.mkdir(mode=0o700, exist_ok=True)
        name = f"{os.getpid()}-{secrets.token_hex(8)}"
        opening = directory / f".{name}"
        os.mkfifo(opening, 0o600)
        self._path = directory / name
        self._loop = asyncio.get_running_loop()
        self.rung = asyncio.Event()
        self._reader = os.open(opening, os.O_RDONLY | os.O_NONBLOCK)
        # held open so that the reader never sees end-of-file between writers
        self._keeper = os.open(opening, os.O_WRONLY | os.O_NONBLOCK)
        try:
            self._loop.add_reader(self._reader, self._drain)
            os.rename(opening, self._path)
        except BaseException:
            self._loop.remove_reader(self._reader)
            self._close_files(opening)
            raise

    def close(self) -> None:
        """Stops listening; whoever waits on ``rung`` is woken to notice."""
        self._loop.remove_reader(self._reader)
        self._close_files(self._path)
        self.rung.set()

    def _drain(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._reader, 4096):
                pass
        self.rung.set()
        self.rung = asyncio.Event()

    def _close_files(self, path: Path) -> None:
        os.close(self._reader)
        os.close(self._keeper)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
