"""The PostgreSQL ``LISTEN``/``NOTIFY`` stand-in transport of :class:`NotificationSource`.

Picodata has not shipped its topology notifications yet (its accepted ADR,
``doc/adr/2025-09-12-pgproto-topology-notifications.md``, sends them as ``NOTICE`` messages on
a pgproto connection opened with the startup parameter ``picodata_catalog_cdc=1``). Until it
does, the tests publish the ADR's documents through a real PostgreSQL, and this module is that
adapter. It needs the ``pg`` extra (asyncpg) and is imported only when a
``NotificationSource`` is given a DSN.

The design over PostgreSQL
==========================

- **Events**: one ADR document per notification on one channel (default
  ``shardline_topology``; quoted, so case-sensitive). ``NOTIFY`` payloads are limited to 8,000
  bytes, and an ADR document carries one instance, one replicaset or one bucket range, so a
  document is never chunked. A publisher with more to say at one raft position (one entry
  changing several things) sends several notifications with that position.
- **Snapshot**: the ADR's initial snapshot is a burst of ``replace`` documents before
  ``ReadyForQuery``. Here ``snapshot_query`` (default ``SELECT shardline_topology_snapshot()``)
  returns that burst: one row per document, one ``text`` or ``json`` column, in the ADR's order
  (replicasets, instances, bucket ranges). The rows are what the ADR's server would send, so
  the source reads the stand-in's snapshot and Picodata's with the same code.
- **Tiers**: the ADR's documents do not carry a tier's bucket count, which routing needs;
  ``tiers_query`` (default ``SELECT name, bucket_count FROM _pico_tier``, Picodata's catalog
  table) reads them, once per connection, before the snapshot.
- **The publisher's side**: each change is one transaction that takes the next raft position
  under a lock (so positions increase in commit order), updates what the snapshot query reads,
  and calls ``pg_notify(channel, document)``. PostgreSQL delivers notifications at commit, in
  commit order.
- **No gap between snapshot and stream**: the adapter runs ``LISTEN`` first, then the snapshot
  query. A change committed before the snapshot's statement began is in the snapshot, and if
  it committed after the ``LISTEN`` it is also queued: the source drops it, its position being
  at or below the snapshot's. A change committed later is queued and handed out.
- **Liveness**: after ``ping_interval`` seconds without a notification the adapter runs
  ``SELECT 1`` (within ``timeout``), so a dead peer is noticed even when no FIN arrives; a
  connection asyncpg sees close is reported at once.
- **Bounds**: at most ``max_queue`` notifications wait in the adapter; one more ends the
  session (``too-large``) and the source reconnects, reading a new snapshot, so nothing is
  lost and memory stays bounded. Each document's size is bounded by the source.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Final

from shardline._extras import requires_extra

with requires_extra("pg", __name__):
    import asyncpg

from shardline.checks import check_seconds, refusal
from shardline.topology.sources import pg_connect
from shardline.topology.sources.membership import TIERS_QUERY
from shardline.topology.sources.notification_transport import TransportError
from shardline.topology.sources.pg_connect import CLOSE_TIMEOUT, message, parse_dsn, peer
from shardline.topology.sources.state import FailureReason

__all__ = [
    "DEFAULT_CHANNEL",
    "DEFAULT_SNAPSHOT_QUERY",
    "DEFAULT_TIERS_QUERY",
    "PgNotifySession",
    "PgNotifyTransport",
]

DEFAULT_CHANNEL: Final = "shardline_topology"
DEFAULT_SNAPSHOT_QUERY: Final = "SELECT shardline_topology_snapshot()"
DEFAULT_TIERS_QUERY: Final = TIERS_QUERY

_MAX_CHANNEL = 63  # NAMEDATALEN - 1: PostgreSQL truncates longer identifiers
_MAX_BUCKET_COUNT = 2**32 - 1

# what asyncpg raises when the connection itself fails, as opposed to a statement's error
_CONNECTION_ERRORS = (OSError, asyncpg.InterfaceError, asyncpg.PostgresConnectionError)


class PgNotifySession:
    """One connection: ``LISTEN`` on the channel, the tiers and the snapshot burst read after
    it, and the notifications since (see :class:`NotificationSession`)."""

    def __init__(
        self,
        connection: asyncpg.Connection,
        queue: asyncio.Queue[str | TransportError],
        *,
        server: str,
        tiers: Mapping[str, int],
        snapshot: Sequence[str | bytes],
        ping_interval: float,
        timeout: float,
    ) -> None:
        self._connection = connection
        self._queue = queue
        self._server = server
        self._tiers = tiers
        self._snapshot = snapshot
        self._ping_interval = ping_interval
        self._timeout = timeout

    @property
    def server(self) -> str:
        return self._server

    @property
    def tiers(self) -> Mapping[str, int]:
        return self._tiers

    @property
    def snapshot(self) -> Sequence[str | bytes]:
        return self._snapshot

    async def documents(self) -> AsyncIterator[str | bytes]:
        queue = self._queue
        while True:
            try:
                async with asyncio.timeout(self._ping_interval):
                    item = await queue.get()
            except TimeoutError:
                await self._ping()
                continue
            if isinstance(item, TransportError):
                raise item
            yield item

    async def _ping(self) -> None:
        try:
            async with asyncio.timeout(self._timeout):
                await self._connection.execute("SELECT 1")
        except TimeoutError:
            raise TransportError(
                FailureReason.TIMEOUT,
                f"{self._server}: no answer to a ping within {self._timeout} s",
            ) from None
        except (*_CONNECTION_ERRORS, asyncpg.PostgresError) as error:
            raise TransportError(
                FailureReason.CONNECTION_LOST, f"{self._server}: {message(error)}"
            ) from None

    async def aclose(self) -> None:
        await _close(self._connection)


class PgNotifyTransport:
    """Connects to PostgreSQL, reads the tiers, ``LISTEN``\\ s on ``channel``, then reads the
    snapshot burst with ``snapshot_query`` (see the module docstring for the whole design).

    Args:
        dsn: a ``postgresql://`` (or ``postgres://``) URI, as asyncpg reads it (as for
            :class:`PollingSource`: credentials, TLS ``sslmode``, and server settings as query
            parameters).
        channel: the notification channel (a name of at most 63 bytes).
        snapshot_query: SQL returning one row per snapshot document, each one ``text`` or
            ``json`` column.
        tiers_query: SQL returning one row per tier: its name and bucket count (0 for a tier
            without buckets).
        ping_interval: seconds without a notification after which the connection is checked.
        timeout: seconds connecting, or a ping, may take.
        max_queue: how many notifications may wait in the transport before the session ends.
        connect_kwargs: passed to ``asyncpg.connect`` (not ``dsn`` nor ``timeout``, which the
            transport sets; ``server_settings["application_name"]`` defaults to
            ``"shardline"``).

    Raises ``ValueError`` naming the argument for an invalid one; :meth:`connect` raises
    :class:`TransportError` (``connect``, ``query-error``, ``connection-lost``,
    ``malformed-row`` for a tiers row that is not a name and a bucket count).
    """

    def __init__(
        self,
        dsn: str,
        *,
        channel: str = DEFAULT_CHANNEL,
        snapshot_query: str = DEFAULT_SNAPSHOT_QUERY,
        tiers_query: str = DEFAULT_TIERS_QUERY,
        ping_interval: float = 5.0,
        timeout: float = 5.0,
        max_queue: int = 10_000,
        connect_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(channel, str) or not channel or len(channel.encode()) > _MAX_CHANNEL:
            raise refusal(channel, str)(
                f"channel must be a non-empty str of at most {_MAX_CHANNEL} bytes, got {channel!r}"
            )
        for name, query in (("snapshot_query", snapshot_query), ("tiers_query", tiers_query)):
            if not isinstance(query, str) or not query.strip():
                raise refusal(query, str)(f"{name} must be a non-empty str, got {query!r}")
        check_seconds("ping_interval", ping_interval)
        check_seconds("timeout", timeout)
        if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 1:
            raise refusal(max_queue, int)(f"max_queue must be a positive int, got {max_queue!r}")
        where, dsn_settings = parse_dsn(dsn)
        self._dsn = dsn
        self._connect_kwargs = pg_connect.connect_kwargs(connect_kwargs, dsn_settings)
        self._channel = channel
        self._snapshot_query = snapshot_query
        self._tiers_query = tiers_query
        self._ping_interval = float(ping_interval)
        self._timeout = float(timeout)
        self._max_queue = max_queue
        self._where = where
        self._name = f"{where}/{channel}"

    @property
    def name(self) -> str:
        return self._name

    async def connect(self) -> PgNotifySession:
        try:
            connection = await asyncpg.connect(
                self._dsn, timeout=self._timeout, **self._connect_kwargs
            )
        except (*_CONNECTION_ERRORS, asyncpg.PostgresError, TimeoutError) as error:
            raise TransportError(
                FailureReason.CONNECT, f"{self._where}: {message(error)}"
            ) from None
        try:
            return await self._subscribe(connection)
        except BaseException as error:
            lost = connection.is_closed()
            connection.terminate()
            if isinstance(error, _CONNECTION_ERRORS) or lost:
                raise TransportError(
                    FailureReason.CONNECTION_LOST, f"{self._where}: {message(error)}"
                ) from None
            if isinstance(error, asyncpg.PostgresError):
                raise TransportError(
                    FailureReason.QUERY, f"{self._where}: {message(error)}"
                ) from None
            raise

    async def _subscribe(self, connection: asyncpg.Connection) -> PgNotifySession:
        tiers = _tiers(self._tiers_query, await connection.fetch(self._tiers_query))
        queue: asyncio.Queue[str | TransportError] = asyncio.Queue()
        limit = self._max_queue
        where = self._where

        def notified(_connection: object, _pid: int, _channel: str, payload: str) -> None:
            if queue.qsize() < limit:
                queue.put_nowait(payload)
            elif queue.qsize() == limit:
                queue.put_nowait(
                    TransportError(
                        FailureReason.TOO_LARGE,
                        f"{where}: over {limit} notifications waiting; reconnecting",
                    )
                )

        def terminated(_connection: object) -> None:
            queue.put_nowait(
                TransportError(FailureReason.CONNECTION_LOST, f"{where}: the connection closed")
            )

        connection.add_termination_listener(terminated)
        # A notification that arrives before add_listener has registered the callback (right
        # after LISTEN commits) is dropped by asyncpg, but its transaction committed before the
        # snapshot query is sent, so the snapshot holds it: nothing is lost.
        await connection.add_listener(self._channel, notified)
        rows = await connection.fetch(self._snapshot_query)
        snapshot = []
        for row in rows:
            if len(row) != 1 or not isinstance(row[0], str | bytes):
                raise TransportError(
                    FailureReason.QUERY,
                    f"{self._snapshot_query!r} must return rows of one text value, got"
                    f" {tuple(row)!r:.80}",
                )
            snapshot.append(row[0])
        return PgNotifySession(
            connection,
            queue,
            server=peer(connection),
            tiers=tiers,
            snapshot=snapshot,
            ping_interval=self._ping_interval,
            timeout=self._timeout,
        )


def _tiers(query: str, rows: Sequence[Any]) -> dict[str, int]:
    tiers: dict[str, int] = {}
    for row in rows:
        name, count = (row[0], row[1]) if len(row) == 2 else (None, None)
        if (
            not isinstance(name, str)
            or not name
            or isinstance(count, bool)
            or not isinstance(count, int)
            or not 0 <= count <= _MAX_BUCKET_COUNT
            or name in tiers
        ):
            raise TransportError(
                FailureReason.MALFORMED_ROW,
                f"{query!r} must return distinct (name, bucket_count) rows, got {tuple(row)!r:.80}",
            )
        tiers[name] = count
    return tiers


async def _close(connection: asyncpg.Connection) -> None:
    try:
        await connection.close(timeout=CLOSE_TIMEOUT)
    except Exception:  # closing a broken connection: drop it
        connection.terminate()
