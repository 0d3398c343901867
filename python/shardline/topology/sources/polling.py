"""``PollingSource``: the topology read from Picodata's system tables over pgwire, on a timer.

It imports asyncpg (the ``pg`` extra) and loads only on first use; shardline works without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

from shardline._extras import requires_extra

with requires_extra("pg", __name__):
    import asyncpg

from shardline._core import BucketPayload
from shardline.checks import check_count, check_seconds, refusal
from shardline.errors import InvalidArgumentType
from shardline.topology.sources import pg_connect
from shardline.topology.sources.changes import BucketSnapshot, TopologyChange, TopologySnapshot
from shardline.topology.sources.membership import (
    ADDRESSES_OF_TYPE_QUERY,
    ADDRESSES_QUERY,
    INSTANCES_QUERY,
    REPLICASETS_QUERY,
    TIERS_QUERY,
    CatalogError,
    Membership,
)
from shardline.topology.sources.source import TopologySource
from shardline.topology.sources.state import CountedFailure, FailureReason

__all__ = ["BUCKETS_QUERY", "PollingSource"]

BUCKETS_QUERY = "SELECT _pico_bucket($1) AS buckets"

Rows = list[tuple[Any, ...]]


class _Failure(CountedFailure):
    """One part of a poll failed; ``fatal``: the connection is unusable, stop the poll."""

    def __init__(self, reason: FailureReason, message: str, *, fatal: bool = False) -> None:
        super().__init__(reason, message)
        self.fatal = fatal


class PollingSource(TopologySource):
    """The topology of a Picodata cluster, polled over one pgwire connection.

    Each poll reads ``_pico_tier``, ``_pico_replicaset``, ``_pico_instance`` and
    ``_pico_peer_address``, then ``SELECT _pico_bucket($1) AS buckets`` for each tier, and
    hands out what changed since the previous poll: replicasets, then instances (those that
    vanished as ``"delete"`` events), then a :class:`BucketSnapshot` per tier carrying the map
    as a :class:`BucketPayload`: its JSON text, read once (the topology recognises an unchanged
    one in microseconds). The first poll
    on each connection hands out one :class:`TopologySnapshot` instead, which rebuilds the
    view from scratch — so after a reconnect, to the same server or another one, the view is
    whatever that server says.

    Picodata keeps expelled members in its tables: an ``expelled`` replicaset, an instance
    whose ``current_state`` is ``["Expelled", n]``, and the instances of an expelled replicaset
    are handed out as ``"delete"`` events (the tier's map is then cleared until its bucket map
    of the same poll is applied). A ``to-be-expelled`` replicaset is still a member, routable
    for the buckets ``_pico_bucket`` still maps to it: Picodata marks it so while its governor
    moves its buckets away. A tier whose ``bucket_count`` is 0 (an "arbiter" tier) is followed
    for its members and never asked for its buckets; routing in it raises
    :class:`shardline.TierWithoutBuckets`.

    A poll changes nothing it did not fully read. If the tables cannot all be read (no
    connection, connection lost, timeout, an error, a malformed row, a result over the
    bounds), the poll hands out nothing. If they can, they are handed out, and so is every
    tier whose bucket map was read and is valid; a tier whose ``_pico_bucket`` raised (during
    a rebalance, or before the tier's buckets are bootstrapped) or returned an unusable map
    keeps its map, and the other tiers of the poll apply all the same. Each failure is
    counted by reason in :attr:`state`, and in ``state.tier_failures`` for its tier when it
    concerns one tier alone; a poll with a failure is retried after ``retry`` seconds,
    doubling up to ``interval``. The source never clears a map by itself.

    Args:
        dsn: a ``postgresql://`` (or ``postgres://``) URI, as asyncpg reads it, e.g.
            ``postgresql://user:secret@host:4327/db?sslmode=verify-full&sslrootcert=ca.crt``;
            several ``host:port`` pairs separated by commas are tried in turn. libpq's
            ``key=value`` strings are not accepted. Credentials and TLS (``sslmode``,
            ``sslrootcert``, …) go here or in ``connect_kwargs`` (``password=``, ``ssl=``);
            query parameters asyncpg does not know are sent to the server as settings.
        interval: seconds between polls.
        tiers: the tiers to follow (default: every tier in ``_pico_tier``); replicasets and
            instances of other tiers are left out.
        timeout: seconds a poll (connecting included) may take.
        retry: seconds before the first retry of a failed poll.
        min_interval: the least time between the starts of two polls that :meth:`trigger`
            asked for; :meth:`refresh` does not wait for it.
        address_type: the ``_pico_peer_address.connection_type`` whose address an instance
            gets (``None``: the table has no such column, take its only address).
        max_rows: the most rows accepted from one table.
        max_payload: the longest ``_pico_bucket`` text accepted, in characters.
        connect_kwargs: passed to ``asyncpg.connect`` (not ``dsn`` nor ``timeout``, which the
            source sets; the ``application_name`` in ``server_settings`` defaults to
            ``"shardline"`` unless the DSN names one).

    Raises ``ValueError`` naming the argument for an invalid one.

    Implementation notes:
        Statements run outside any transaction block (asyncpg's autocommit), one after the
        other, so each sees the latest committed catalog; Picodata's system tables are not
        read in one transaction. Rows
        are validated whole into a :class:`~shardline.topology.sources.membership.Membership`
        before anything is handed out; the previous poll's membership is the baseline the
        events are computed from. A bucket map whose text differs from the last one accepted
        for its tier is read into a :class:`BucketPayload`, which validates it with the rules
        the topology applies, so an invalid map is never handed out, and the topology applies
        the ranges already read instead of reading the text again. A text equal to the last
        one accepted hands out that payload again, unread. asyncpg hands ``json`` and ``jsonb``
        values over as text (no codec is set for them), so the map's text reaches the parser
        undecoded whatever type the server gives ``_pico_bucket``.
    """

    def __init__(
        self,
        dsn: str,
        *,
        interval: float = 1.0,
        tiers: Iterable[str] | None = None,
        timeout: float = 5.0,
        retry: float = 0.1,
        min_interval: float = 0.05,
        address_type: str | None = "pgproto",
        max_rows: int = 100_000,
        max_payload: int = 16 << 20,
        connect_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        where, dsn_settings = pg_connect.parse_dsn(dsn)
        self._interval = check_seconds("interval", interval)
        self._timeout = check_seconds("timeout", timeout)
        self._retry = check_seconds("retry", retry)
        self._min_interval = check_seconds("min_interval", min_interval, zero=True)
        self._scope = _tier_names(tiers)
        if address_type is not None and (not isinstance(address_type, str) or not address_type):
            raise refusal(address_type, str)(
                f"address_type must be a non-empty str or None, got {address_type!r}"
            )
        self._address_type = address_type
        self._max_rows = check_count("max_rows", max_rows)
        self._max_payload = check_count("max_payload", max_payload)
        kwargs = pg_connect.connect_kwargs(connect_kwargs, dsn_settings)
        self._dsn = dsn
        self._connect_kwargs = kwargs
        super().__init__(f"PollingSource({where})")

        self._connection: asyncpg.Connection | None = None
        self._baseline: Membership | None = None
        self._tier_config: dict[str, int] | None = None
        # tier → (the bucket count it was validated for, the last map accepted)
        self._accepted: dict[str, tuple[int, BucketPayload]] = {}

        self._triggered = False
        self._started = 0
        self._finished = 0
        self._last_ok = False
        self._last_start = -math.inf
        self._failed_in_a_row = 0

    # the TopologySource interface

    async def refresh(self) -> bool:
        """Polls now, without waiting for ``interval`` or ``min_interval``; returns once the
        poll's changes have been handed out (under :meth:`run`: applied), True if the poll
        read everything and the topology accepted it. Raises RuntimeError if nothing
        iterates the source (a :meth:`run` task created just before is given the chance to
        start)."""
        self._check_open()
        target = self._started + 1  # the first poll to start after this call
        await self._require_consumer()
        if self._finished >= target:  # it started and finished meanwhile
            return self._last_ok
        future = self._waiter(target)
        if self._started < target:
            self._urgent = True
            self._wake.set()
        return await future

    def trigger(self) -> None:
        """Asks for a poll as soon as ``min_interval`` has passed since the last one started."""
        self._triggered = True
        self._wake.set()

    def resync(self) -> None:
        self._baseline = None

    async def aclose(self) -> None:
        self._closed = True
        self._wake.set()
        self._finish_waiters(None)
        await self._disconnect(polite=True)

    # the poll loop

    async def _changes(self) -> AsyncIterator[TopologyChange]:
        try:
            delay = 0.0
            while True:
                await self._pause(delay)
                if self._closed:
                    return
                self._triggered = self._urgent = False
                self._started += 1
                cycle, rejections = self._started, self._rejections
                self._last_start = asyncio.get_running_loop().time()
                try:
                    changes, complete = await self._poll()
                except Exception as error:
                    # nothing a poll reads may end the loop: only closing or cancelling does
                    self._recorder.failure(
                        FailureReason.UNEXPECTED, f"poll failed: {type(error).__name__}: {error}"
                    )
                    await self._disconnect()
                    changes, complete = [], False
                finally:
                    self._recorder.read(asyncio.get_running_loop().time() - self._last_start)
                if self._closed:
                    return
                for change in changes:
                    self._recorder.events_emitted += 1
                    yield change
                ok = complete and self._rejections == rejections
                if ok:
                    self._recorder.refreshed()
                    self._failed_in_a_row = 0
                    delay = self._interval
                else:
                    self._failed_in_a_row += 1
                    delay = min(self._interval, self._retry * 2 ** (self._failed_in_a_row - 1))
                self._finish_waiters(cycle, ok)
        finally:
            self._iterating = False
            self._finish_waiters(None)
            await self._disconnect(polite=True)

    def _due(self, planned: float) -> float:
        # triggered: no later than min_interval after the last poll started
        return min(planned, self._last_start + self._min_interval) if self._triggered else planned

    def _finish_waiters(self, read: int | None, ok: bool = False) -> None:
        if read is not None:  # remembered for a refresh() whose poll finished before it waited
            self._finished, self._last_ok = read, ok
        super()._finish_waiters(read, ok)

    # one poll

    async def _poll(self) -> tuple[list[TopologyChange], bool]:
        self._recorder.attempts += 1
        deadline = asyncio.get_running_loop().time() + self._timeout
        try:
            connection = await self._connect(deadline)
            membership = await self._read_membership(connection, deadline)
        except _Failure as failure:
            await self._failed(failure)
            return [], False

        complete = True
        config = self._tier_config if self._tier_config is not None else dict(membership.tiers)
        for name in sorted(self._scope or ()):
            if name not in membership.tiers:
                complete = False
                self._recorder.failure(
                    FailureReason.UNKNOWN_TIER, f"tier {name!r} is not in _pico_tier", tier=name
                )
        payloads: dict[str, BucketPayload] = {}
        for tier, count in sorted(membership.tiers.items()):
            if config.get(tier) != count:
                complete = False
                self._recorder.failure(
                    FailureReason.UNKNOWN_TIER,
                    f"tier {tier!r} (bucket_count {count}) is not in the tier configuration"
                    f" set at the first poll ({config.get(tier)}); its buckets are not followed",
                    tier=tier,
                )
                continue
            if count == 0:
                continue  # a tier without buckets: _pico_bucket raises for it
            try:
                payloads[tier] = await self._read_buckets(connection, tier, config, deadline)
            except _Failure as failure:
                complete = False
                # a lost connection or a timeout is not this tier's failure
                await self._failed(failure, tier=None if failure.fatal else tier)
                if failure.fatal:
                    break

        changes: list[TopologyChange] = []
        buckets = [BucketSnapshot(tier, payload) for tier, payload in payloads.items()]
        if self._baseline is None:
            replicasets, instances = membership.events()
            changes.append(
                TopologySnapshot(
                    tiers=config,
                    replicasets=replicasets,
                    instances=instances,
                    buckets=tuple(buckets),
                    scope=self._scope,
                )
            )
            self._tier_config = config
        else:
            changes.extend(membership.events_since(self._baseline))
            changes.extend(buckets)
        self._baseline = membership
        return changes, complete

    async def _failed(self, failure: _Failure, *, tier: str | None = None) -> None:
        self._recorder.failure(failure.reason, str(failure), tier=tier)
        if failure.fatal:
            await self._disconnect()

    async def _connect(self, deadline: float) -> asyncpg.Connection:
        if self._connection is not None and not self._connection.is_closed():
            return self._connection
        await self._disconnect()
        try:
            async with asyncio.timeout_at(deadline):
                connection = await asyncpg.connect(self._dsn, **self._connect_kwargs)
        except TimeoutError:
            raise _Failure(
                FailureReason.CONNECT, f"no connection within {self._timeout} s", fatal=True
            ) from None
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as error:
            # a refused or failed socket, TLS or authentication, or a bad connect argument
            raise _Failure(FailureReason.CONNECT, pg_connect.message(error), fatal=True) from None
        self._connection = connection
        self._baseline = None  # a new connection: rebuild the view from a full poll
        self._recorder.connected(pg_connect.peer(connection))
        return connection

    async def _disconnect(self, *, polite: bool = False) -> None:
        """Drops the connection: ``polite``, it says goodbye (bounded: a server busy with a
        query reads it late); otherwise, after a failure, its socket is closed at once."""
        connection, self._connection = self._connection, None
        if connection is not None:
            self._recorder.disconnected()
            if polite:
                with contextlib.suppress(Exception):  # a close that fails aborts the socket
                    await connection.close(timeout=pg_connect.CLOSE_TIMEOUT)
            else:
                connection.terminate()

    async def _fetch(
        self,
        connection: asyncpg.Connection,
        query: str,
        params: tuple[Any, ...],
        deadline: float,
        *,
        what: str,
        error_reason: FailureReason = FailureReason.QUERY,
    ) -> Rows:
        try:
            async with asyncio.timeout_at(deadline):
                # The whole result is read, then checked against max_rows: asyncpg's public API
                # bounds the rows of a statement only through a cursor, which needs a
                # transaction block, and the statements run outside one (the contract above,
                # and Picodata's pgproto). The poll's deadline bounds how much can arrive.
                records = await connection.fetch(query, *params)
        except TimeoutError:
            raise _Failure(
                FailureReason.TIMEOUT, f"{what}: no answer within {self._timeout} s", fatal=True
            ) from None
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as error:
            if connection.is_closed() or _ends_the_session(error):
                # ConnectionDoesNotExistError, a reset socket, a FATAL error (the backend was
                # terminated): the connection is gone, whether or not asyncpg has seen it close
                raise _Failure(
                    FailureReason.CONNECTION_LOST,
                    f"{what}: {pg_connect.message(error)}",
                    fatal=True,
                ) from None
            raise _Failure(error_reason, f"{what}: {pg_connect.message(error)}") from None
        rows = [tuple(record) for record in records]
        if len(rows) > self._max_rows:
            raise _Failure(
                FailureReason.TOO_LARGE, f"{what}: more than max_rows={self._max_rows} rows"
            )
        return rows

    async def _read_membership(self, connection: asyncpg.Connection, deadline: float) -> Membership:
        tiers = await self._fetch(connection, TIERS_QUERY, (), deadline, what="_pico_tier")
        replicasets = await self._fetch(
            connection, REPLICASETS_QUERY, (), deadline, what="_pico_replicaset"
        )
        instances = await self._fetch(
            connection, INSTANCES_QUERY, (), deadline, what="_pico_instance"
        )
        if self._address_type is None:
            addresses = await self._fetch(
                connection, ADDRESSES_QUERY, (), deadline, what="_pico_peer_address"
            )
        else:
            addresses = await self._fetch(
                connection,
                ADDRESSES_OF_TYPE_QUERY,
                (self._address_type,),
                deadline,
                what="_pico_peer_address",
            )
        try:
            return Membership.from_rows(tiers, replicasets, instances, addresses, scope=self._scope)
        except CatalogError as error:
            raise _Failure(error.reason, str(error)) from None
        except Exception as error:  # rows no check anticipated are malformed rows all the same
            raise _Failure(
                FailureReason.MALFORMED_ROW, f"catalog rows: {type(error).__name__}: {error}"
            ) from None

    async def _read_buckets(
        self,
        connection: asyncpg.Connection,
        tier: str,
        config: Mapping[str, int],
        deadline: float,
    ) -> BucketPayload:
        what = f"_pico_bucket({tier!r})"
        rows = await self._fetch(
            connection,
            BUCKETS_QUERY,
            (tier,),
            deadline,
            what=what,
            error_reason=FailureReason.BUCKETS,
        )
        if len(rows) != 1 or len(rows[0]) != 1:
            raise _Failure(FailureReason.MALFORMED_BUCKETS, f"{what}: not one value")
        payload = rows[0][0]
        if not isinstance(payload, str | bytes):
            raise _Failure(
                FailureReason.MALFORMED_BUCKETS,
                f"{what}: expected JSON text, got {type(payload).__name__}",
            )
        if len(payload) > self._max_payload:
            raise _Failure(
                FailureReason.TOO_LARGE,
                f"{what}: {len(payload)} characters, over max_payload={self._max_payload}",
            )
        count = config[tier]
        accepted = self._accepted.get(tier)
        if accepted is not None and accepted[0] == count and accepted[1].text == payload:
            return accepted[1]
        try:
            parsed = BucketPayload(tier, payload, count)
        except Exception as error:  # whatever the map makes the parser raise, it is unusable
            raise _Failure(FailureReason.MALFORMED_BUCKETS, f"{what}: {error}") from None
        self._accepted[tier] = (count, parsed)
        return parsed


def _ends_the_session(error: Exception) -> bool:
    if not isinstance(error, asyncpg.PostgresError):
        return True
    # severity_en is the untranslated severity; servers before 9.6 send only the other
    severity = getattr(error, "severity_en", None) or getattr(error, "severity", None)
    return severity in ("FATAL", "PANIC")


def _tier_names(tiers: Iterable[str] | None) -> frozenset[str] | None:
    if tiers is None:
        return None
    if isinstance(tiers, str | bytes):
        raise InvalidArgumentType(
            f"tiers must be an iterable of tier names, not a single {tiers!r}"
        )
    names = frozenset(tiers)
    bad = sorted(repr(name) for name in names if not isinstance(name, str) or not name)
    if bad or not names:
        raise ValueError(f"tiers must be non-empty tier names, got {sorted(map(repr, names))}")
    return names
