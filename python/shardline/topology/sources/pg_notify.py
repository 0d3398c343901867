"""The PostgreSQL ``LISTEN``/``NOTIFY`` transport of :class:`NotificationSource`.

Picodata does not push topology notifications yet, and no Picodata server runs in the tests, so
the tests publish the documents through a real PostgreSQL. This module is that adapter; it
needs the ``pg`` extra (psycopg 3) and is imported only when a ``NotificationSource`` is given a
DSN.

The design over PostgreSQL
==========================

- **Events**: one event document per notification on one channel (default
  ``shardline_topology``; quoted, so case-sensitive). ``NOTIFY`` payloads are limited to 8,000
  bytes, and an ADR event carries one instance, one replicaset or one bucket range — a few
  hundred bytes with real names, about 2.3 KB with ASCII texts at their 1,024-character limit
  — so an event is never chunked. A publisher with more to say at one raft position (one
  entry changing several things) sends several notifications with that position, each a
  whole event. (PostgreSQL refuses a larger payload at ``pg_notify``, so the publisher learns
  of it; the source also skips and counts any document over ``max_document``.)
- **Snapshot**: ``snapshot_query`` (default ``SELECT shardline_topology_snapshot()``) returns
  the snapshot document as one ``text`` or ``json`` value: the whole topology with the raft
  position it is at.
- **The publisher's side**: each change is one transaction that takes the next raft position
  under a lock (so positions increase in commit order), updates what the snapshot query reads,
  and calls ``pg_notify(channel, document)``. PostgreSQL delivers notifications at commit, in
  commit order, and drops a repeat of an identical payload within one transaction (so a
  redelivery test sends each copy in its own transaction).
- **No gap between snapshot and stream**: the adapter runs ``LISTEN`` first (autocommit, so
  it is in force when the statement returns), then the snapshot query. A change committed
  before the snapshot's statement began is in the snapshot, and if it committed after the
  ``LISTEN`` it is also queued: the source drops it, its position being at or below the
  snapshot's. A change committed later is queued and handed out. psycopg keeps notifications
  that arrive while a query runs and yields them first from ``notifies()``.
- **Liveness**: after ``ping_interval`` seconds without a notification the adapter runs
  ``SELECT 1`` (within ``timeout``), so a dead peer is noticed even when no FIN arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Mapping
from typing import Any, Final

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.types.string import TextLoader

from shardline.topology.sources.notification import TransportError
from shardline.topology.sources.state import FailureReason

__all__ = [
    "DEFAULT_CHANNEL",
    "DEFAULT_SNAPSHOT_QUERY",
    "PgNotifySession",
    "PgNotifyTransport",
]

DEFAULT_CHANNEL: Final = "shardline_topology"
DEFAULT_SNAPSHOT_QUERY: Final = "SELECT shardline_topology_snapshot()"

_MAX_CHANNEL = 63  # NAMEDATALEN - 1: PostgreSQL truncates longer identifiers


class PgNotifySession:
    """One connection: ``LISTEN`` on the channel, the snapshot read after it, and the
    notifications since (see :class:`NotificationSession`)."""

    def __init__(
        self,
        connection: psycopg.AsyncConnection[tuple[Any, ...]],
        *,
        channel: str,
        snapshot: str | bytes,
        ping_interval: float,
        timeout: float,
    ) -> None:
        self._connection = connection
        self._channel = channel
        self._snapshot = snapshot
        self._ping_interval = ping_interval
        self._timeout = timeout
        self._server = f"{connection.info.host}:{connection.info.port}"

    @property
    def server(self) -> str:
        return self._server

    @property
    def snapshot(self) -> str | bytes:
        return self._snapshot

    async def documents(self) -> AsyncIterator[str | bytes]:
        connection = self._connection
        while True:
            try:
                async with contextlib.aclosing(
                    connection.notifies(timeout=self._ping_interval)
                ) as notifies:
                    async for notify in notifies:
                        if notify.channel == self._channel:
                            yield notify.payload
                async with asyncio.timeout(self._timeout):
                    await connection.execute("SELECT 1")
            except TimeoutError:
                raise TransportError(
                    FailureReason.TIMEOUT,
                    f"{self._server}: no answer to a ping within {self._timeout} s",
                ) from None
            except psycopg.Error as error:
                raise TransportError(
                    FailureReason.CONNECTION_LOST, f"{self._server}: {_message(error)}"
                ) from None

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await self._connection.close()


class PgNotifyTransport:
    """Connects to PostgreSQL, ``LISTEN``\\ s on ``channel``, then reads the snapshot with
    ``snapshot_query`` (see the module docstring for the whole design).

    Args:
        dsn: a libpq connection string or URI.
        channel: the notification channel (a name of at most 63 bytes).
        snapshot_query: SQL returning one row with one ``text`` or ``json`` column, the
            snapshot document.
        ping_interval: seconds without a notification after which the connection is checked.
        timeout: seconds a ping may take.
        connect_kwargs: passed to ``psycopg.AsyncConnection.connect`` (``autocommit`` is always
            on; ``application_name`` defaults to ``"shardline"``).

    Raises ``ValueError`` naming the argument for an invalid one; :meth:`connect` raises
    :class:`TransportError` (``connect``, ``query-error``, ``connection-lost``).
    """

    def __init__(
        self,
        dsn: str,
        *,
        channel: str = DEFAULT_CHANNEL,
        snapshot_query: str = DEFAULT_SNAPSHOT_QUERY,
        ping_interval: float = 5.0,
        timeout: float = 5.0,
        connect_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(dsn, str):
            raise ValueError(f"dsn must be a str, got {type(dsn).__name__}")
        try:
            given = conninfo_to_dict(dsn)
        except psycopg.Error as error:
            raise ValueError(f"dsn is not a valid connection string: {error}") from None
        if not isinstance(channel, str) or not channel or len(channel.encode()) > _MAX_CHANNEL:
            raise ValueError(
                f"channel must be a non-empty str of at most {_MAX_CHANNEL} bytes, got {channel!r}"
            )
        if not isinstance(snapshot_query, str) or not snapshot_query.strip():
            raise ValueError(f"snapshot_query must be a non-empty str, got {snapshot_query!r}")
        for name, value in (("ping_interval", ping_interval), ("timeout", timeout)):
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value <= 0
            ):
                raise ValueError(
                    f"{name} must be a positive finite number of seconds, got {value!r}"
                )
        kwargs = dict(connect_kwargs or {})
        if not all(isinstance(key, str) for key in kwargs):
            raise ValueError(f"connect_kwargs must have str keys, got {sorted(map(repr, kwargs))}")
        managed = sorted(key for key in ("autocommit", "row_factory") if key in kwargs)
        if managed:
            raise ValueError(
                f"connect_kwargs must not set {', '.join(managed)}: the transport does"
            )
        if "application_name" not in kwargs and "application_name" not in given:
            kwargs["application_name"] = "shardline"
        self._dsn = dsn
        self._channel = channel
        self._snapshot_query = snapshot_query
        self._ping_interval = float(ping_interval)
        self._timeout = float(timeout)
        self._connect_kwargs = kwargs
        host = given.get("host") or given.get("hostaddr") or "localhost"
        port = given.get("port")
        self._name = f"{host}:{port}/{channel}" if port else f"{host}/{channel}"

    @property
    def name(self) -> str:
        return self._name

    async def connect(self) -> PgNotifySession:
        try:
            connection = await psycopg.AsyncConnection.connect(
                self._dsn, autocommit=True, **self._connect_kwargs
            )
        except psycopg.Error as error:
            raise TransportError(FailureReason.CONNECT, _message(error)) from None
        try:
            # the snapshot's text must reach the source undecoded, whatever its SQL type
            for name in ("json", "jsonb"):
                connection.adapters.register_loader(name, TextLoader)
            await connection.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
            cursor = await connection.execute(self._snapshot_query)
            rows = await cursor.fetchmany(2)
            if len(rows) != 1 or len(rows[0]) != 1 or not isinstance(rows[0][0], str | bytes):
                shape = f"{len(rows)} row(s)" if len(rows) != 1 else f"row {rows[0]!r:.80}"
                raise TransportError(
                    FailureReason.QUERY,
                    f"{self._snapshot_query!r} must return one text value, got {shape}",
                )
            return PgNotifySession(
                connection,
                channel=self._channel,
                snapshot=rows[0][0],
                ping_interval=self._ping_interval,
                timeout=self._timeout,
            )
        except BaseException as error:
            lost = connection.closed
            with contextlib.suppress(Exception):
                await connection.close()
            if isinstance(error, psycopg.Error):
                reason = FailureReason.CONNECTION_LOST if lost else FailureReason.QUERY
                raise TransportError(reason, f"snapshot: {_message(error)}") from None
            raise


def _message(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0]
