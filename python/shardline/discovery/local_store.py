"""The SQLite store behind :class:`~shardline.discovery.local.LocalDiscovery`.

One database file per namespace, in WAL mode, shared by every process that opens it. Tables:

- ``records(uid, data, owner)``: the current record of each worker, in the wire form of
  :mod:`shardline.discovery.record`, and the publisher that owns it.
- ``changes(seq, uid, data)``: an append-only log, one row per change of ``records`` (``data``
  is ``NULL`` when the record was withdrawn; a record put again equal but for its ``published``
  time is no change), ``seq`` from ``AUTOINCREMENT`` so it only grows.
  A reader that has applied everything up to ``seq = n`` reads ``WHERE seq > n``.
- ``publishers(id, pid, beat_at, timeout)``: one row per live publisher, its last heartbeat
  (``time.monotonic()``, a clock every process on the machine shares) and its own liveness
  timeout.
- ``orphans(uid, data, owner, reaped_at)``: records withdrawn from a publisher presumed dead,
  kept so that the publisher gets them back if it was only stalled.
- ``meta``: the layout version, the namespace, and ``trimmed_through``, the highest ``seq``
  deleted from the log.

Every write is one ``BEGIN IMMEDIATE`` transaction (writers queue on the database lock with a
busy timeout), and one that logged changes rings the namespace's doorbells
(:mod:`shardline.discovery.local_doorbell`) once committed; every read of more than one
statement is one read transaction, which WAL lets run beside a writer.

Rules:

- A publisher whose heartbeat is further than its timeout from now (in either direction: a row
  left by a previous boot carries a clock reading from before the reboot) is reaped by any
  participant: its records move to ``orphans`` and their withdrawals go to the log.
- A publisher that writes or beats and finds its row gone was presumed dead while stalled: it
  registers again under the same id and its orphans return to ``records`` (and to the log).
  Any write of a uid discards that uid's orphan, so a record someone replaced or withdrew in
  the meantime is not brought back. Each reap discards orphans older than an hour.
- Writers trim the log to its last ``log_retention`` entries (in steps, so the cost is
  amortised over the writes); a reader whose position is below ``trimmed_through`` lost entries
  and re-reads ``records`` whole instead.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardline.discovery.local_doorbell import ring
from shardline.discovery.record import decode_record
from shardline.errors import InvalidRecord

__all__ = ["Batch", "LocalStore", "Registration", "connect", "head"]

logger = logging.getLogger("shardline.discovery.local")

LAYOUT = 1
BUSY_TIMEOUT = 10.0
_TRIM_STEP = 256
_WAL_RETRY = 0.005  # seconds between two attempts to switch a new database to WAL
_ORPHAN_RETENTION = 3600.0

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value NOT NULL)",
    """CREATE TABLE IF NOT EXISTS publishers (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        pid INTEGER NOT NULL,
        beat_at REAL NOT NULL,
        timeout REAL NOT NULL CHECK (timeout > 0)
    )""",
    """CREATE TABLE IF NOT EXISTS records (
        uid BLOB PRIMARY KEY CHECK (typeof(uid) = 'blob' AND length(uid) = 16),
        data BLOB NOT NULL CHECK (typeof(data) = 'blob'),
        owner INTEGER NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS records_by_owner ON records (owner)",
    """CREATE TABLE IF NOT EXISTS changes (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        uid BLOB NOT NULL CHECK (typeof(uid) = 'blob' AND length(uid) = 16),
        data BLOB CHECK (data IS NULL OR typeof(data) = 'blob')
    )""",
    """CREATE TABLE IF NOT EXISTS orphans (
        uid BLOB PRIMARY KEY,
        data BLOB NOT NULL,
        owner INTEGER NOT NULL,
        reaped_at REAL NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS orphans_by_owner ON orphans (owner)",
)

# (seq, uid, data): one entry of the log; data is None when the record was withdrawn
Change = tuple[int, bytes, bytes | None]


@dataclass
class Registration:
    """A publisher as the store knows it; only store calls read or write it."""

    timeout: float
    id: int | None = None
    live: bool = False


@dataclass(frozen=True, slots=True)
class Batch:
    """What a reader learns in one read.

    ``records`` is ``None`` for a run of log entries after the reader's position; otherwise it
    is every current record and ``changes`` is empty (a snapshot). ``head`` is the position
    the reader has reached either way.
    """

    head: int
    changes: list[Change]
    records: list[tuple[bytes, bytes]] | None = None


class LocalStore:
    """The database of one namespace. Blocking; every method is called from one thread."""

    def __init__(self, path: Path, namespace: str, *, log_retention: int) -> None:
        self.path = path
        self.doorbells = path.with_suffix(".doorbells")
        self._retention = log_retention
        self._trim_step = min(_TRIM_STEP, log_retention)
        self._db = connect(path, BUSY_TIMEOUT)
        try:
            use_wal(self._db, BUSY_TIMEOUT)
            with self._transaction():
                for statement in _SCHEMA:
                    self._db.execute(statement)
                self._db.execute(
                    "INSERT OR IGNORE INTO meta (key, value) VALUES"
                    " ('layout', ?), ('namespace', ?), ('trimmed_through', 0)",
                    (LAYOUT, namespace),
                )
                layout, owner = (self._meta("layout"), self._meta("namespace"))
            if layout != LAYOUT:
                raise ValueError(f"{path} has store layout {layout!r}, not {LAYOUT}")
            if owner != namespace:
                raise ValueError(f"{path} holds namespace {owner!r}, not {namespace!r}")
        except BaseException:
            self._db.close()
            raise

    def close(self) -> None:
        self._db.close()

    # -- publishers --------------------------------------------------------------------------

    def put(self, publisher: Registration, uid: bytes, data: bytes) -> None:
        """``uid``'s record is now ``data``, owned by ``publisher``. A record equal to the
        stored one but for its publish time is no change: nothing is logged or stored, and only
        the owner moves if another publisher held it."""
        with self._write():
            self._db.execute("DELETE FROM orphans WHERE uid = ?", (uid,))
            self._register(publisher)
            row = self._db.execute("SELECT data, owner FROM records WHERE uid = ?", (uid,))
            current = row.fetchone()
            if current is None or not same_record(current[0], data):
                self._db.execute(
                    "INSERT INTO records (uid, data, owner) VALUES (?, ?, ?)"
                    " ON CONFLICT (uid) DO UPDATE SET data = excluded.data, owner = excluded.owner",
                    (uid, data, publisher.id),
                )
                self._db.execute("INSERT INTO changes (uid, data) VALUES (?, ?)", (uid, data))
            elif current[1] != publisher.id:
                # a takeover with an identical record: only the owner changes, nobody is told
                self._db.execute("UPDATE records SET owner = ? WHERE uid = ?", (publisher.id, uid))

    def drop(self, uid: bytes) -> None:
        """Withdraws ``uid``'s record, whoever owns it."""
        with self._write():
            self._db.execute("DELETE FROM orphans WHERE uid = ?", (uid,))
            if self._db.execute("DELETE FROM records WHERE uid = ?", (uid,)).rowcount:
                self._db.execute("INSERT INTO changes (uid, data) VALUES (?, NULL)", (uid,))

    def beat(self, publisher: Registration) -> None:
        """Records that ``publisher`` is alive (registering it again if it was reaped)."""
        if publisher.live:
            with self._write():
                self._register(publisher)

    def withdraw(self, publisher: Registration) -> None:
        """Withdraws the records ``publisher`` owns and forgets it."""
        publisher.live = False
        if publisher.id is None:
            return
        with self._write():
            self._withdraw_owned(publisher.id)
            self._db.execute("DELETE FROM orphans WHERE owner = ?", (publisher.id,))
            self._db.execute("DELETE FROM publishers WHERE id = ?", (publisher.id,))

    def reap(self) -> None:
        """Withdraws the records of every publisher whose heartbeat lapsed."""
        if not self._lapsed(time.monotonic()):
            return
        with self._write():
            now = time.monotonic()
            for id, pid, beat_at in self._lapsed(now):
                self._db.execute(
                    "INSERT OR REPLACE INTO orphans (uid, data, owner, reaped_at)"
                    " SELECT uid, data, owner, ? FROM records WHERE owner = ?",
                    (now, id),
                )
                count = self._withdraw_owned(id)
                self._db.execute("DELETE FROM publishers WHERE id = ?", (id,))
                logger.warning(
                    "publisher %d (pid %d) of %s missed its heartbeats for %.3g s:"
                    " withdrew its %d records",
                    id,
                    pid,
                    self.path,
                    abs(now - beat_at),
                    count,
                )
            self._db.execute(
                "DELETE FROM orphans WHERE abs(? - reaped_at) > ?", (now, _ORPHAN_RETENTION)
            )

    # -- readers -----------------------------------------------------------------------------

    def snapshot(self) -> Batch:
        """Every current record, after reaping, so no worker already known dead is replayed."""
        self.reap()
        with self._read():
            return self._snapshot()

    def read(self, position: int, limit: int) -> Batch:
        """Up to ``limit`` log entries after ``position``, or a snapshot if some were trimmed."""
        with self._read():
            head = self._head()
            if position < int(self._meta("trimmed_through")) or position > head:
                return self._snapshot(head)
            changes: list[Change] = self._db.execute(
                "SELECT seq, uid, data FROM changes WHERE seq > ? ORDER BY seq LIMIT ?",
                (position, limit),
            ).fetchall()
        # all read up to head, unless the limit stopped short (a gap left by a hand-made delete
        # must not keep a reader looking for entries that are not there)
        return Batch(head if len(changes) < limit else changes[-1][0], changes)

    # -- internals ---------------------------------------------------------------------------

    def _register(self, publisher: Registration) -> None:
        now = time.monotonic()
        if publisher.id is not None:
            beat = "UPDATE publishers SET beat_at = ? WHERE id = ?"
            if self._db.execute(beat, (now, publisher.id)).rowcount:
                return
        publisher.id = self._db.execute(
            "INSERT INTO publishers (id, pid, beat_at, timeout) VALUES (?, ?, ?, ?)",
            (publisher.id, os.getpid(), now, publisher.timeout),
        ).lastrowid
        restored = self._db.execute(
            "INSERT INTO records (uid, data, owner)"
            " SELECT uid, data, owner FROM orphans WHERE owner = ?",
            (publisher.id,),
        ).rowcount
        if restored:
            self._db.execute(
                "INSERT INTO changes (uid, data)"
                " SELECT uid, data FROM orphans WHERE owner = ? ORDER BY uid",
                (publisher.id,),
            )
            self._db.execute("DELETE FROM orphans WHERE owner = ?", (publisher.id,))
        if publisher.live:
            logger.warning(
                "publisher %d of %s was presumed dead (no heartbeat within %.3g s);"
                " restored %d of its records",
                publisher.id,
                self.path,
                publisher.timeout,
                restored,
            )
        publisher.live = True

    def _withdraw_owned(self, owner: int) -> int:
        self._db.execute(
            "INSERT INTO changes (uid, data)"
            " SELECT uid, NULL FROM records WHERE owner = ? ORDER BY uid",
            (owner,),
        )
        return self._db.execute("DELETE FROM records WHERE owner = ?", (owner,)).rowcount

    def _lapsed(self, now: float) -> list[tuple[int, int, float]]:
        return self._db.execute(
            "SELECT id, pid, beat_at FROM publishers WHERE abs(? - beat_at) > timeout", (now,)
        ).fetchall()

    def _snapshot(self, head: int | None = None) -> Batch:
        records = self._db.execute("SELECT uid, data FROM records").fetchall()
        return Batch(self._head() if head is None else head, [], records)

    def _head(self) -> int:
        return head(self._db)

    def _meta(self, key: str) -> Any:
        return self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()[0]

    def _trim(self, head: int) -> None:
        keep_after = head - self._retention
        if keep_after - int(self._meta("trimmed_through")) >= self._trim_step:
            self._db.execute("DELETE FROM changes WHERE seq <= ?", (keep_after,))
            self._db.execute(
                "UPDATE meta SET value = ? WHERE key = 'trimmed_through'", (keep_after,)
            )

    @contextmanager
    def _write(self) -> Iterator[None]:
        """A write transaction; if it logged changes, it trims the log and rings, once done."""
        with self._transaction():
            before = self._head()
            yield
            head = self._head()
            if head != before:
                self._trim(head)
        if head != before:
            ring(self.doorbells)

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    @contextmanager
    def _read(self) -> Iterator[None]:
        self._db.execute("BEGIN")
        try:
            yield
        finally:
            self._db.execute("COMMIT")


def same_record(stored: bytes, data: bytes) -> bool:
    """Whether two wire forms hold the same record, as records compare: the ``published`` time
    aside, so an unchanged record published again is no change. A form that cannot be read
    differs from any other."""
    if stored == data:
        return True
    try:
        return decode_record(stored) == decode_record(data)
    except InvalidRecord:
        return False


def head(db: sqlite3.Connection) -> int:
    """The ``seq`` of the last entry ever logged (0 before the first)."""
    found = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'changes'").fetchone()
    return 0 if found is None else int(found[0])


def use_wal(db: sqlite3.Connection, busy_timeout: float) -> None:
    """Puts the database in WAL mode, waiting up to ``busy_timeout`` seconds for the lock.

    Switching the journal mode needs an exclusive lock, and SQLite answers "database is
    locked" at once instead of calling its busy handler, so processes opening a new namespace
    together retry here."""
    deadline = time.monotonic() + busy_timeout
    while True:
        try:
            db.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() >= deadline:
                raise
        time.sleep(_WAL_RETRY)


def connect(path: Path, busy_timeout: float) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit), usable from any thread."""
    db = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA synchronous = NORMAL")
    return db
