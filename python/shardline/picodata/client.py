"""``connect`` and ``Client``: SQL on a Picodata cluster, each keyed query sent over pgwire to
the master of the replicaset that owns its key."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping
from types import MappingProxyType, TracebackType
from typing import Any, Final, Literal, Protocol, Self, TypeVar

from shardline._extras import requires_extra

with requires_extra("pg", __name__):
    import asyncpg

from shardline._core import Instance, RouteExplanation, Topology, WorkerPool
from shardline._tasks import cancel_and_wait
from shardline.checks import check_count, check_seconds, refusal
from shardline.errors import (
    DeadlineExceeded,
    InstanceUnavailable,
    InvalidAddress,
    InvalidArgument,
    InvalidArgumentType,
    NotPicodata,
    NoWorkersAvailable,
    TierWithoutBuckets,
    UnknownTier,
)
from shardline.host_port import split_host_port
from shardline.picodata.driver_shortcut import CACHE_ERRORS, after_cache_error, shortcut_allowed
from shardline.picodata.instance_pool import InstancePool
from shardline.picodata.pipeline import NOT_PIPELINED, Pipeline
from shardline.picodata.query_metadata import (
    MAX_STATEMENTS,
    SESSION_SETTINGS,
    STALE_STATEMENT,
    UNKEYED,
    StatementRouting,
    metadata_supported,
    read_notice,
)
from shardline.picodata.sharding_keys import ShardingKey, TableDistribution, key_of, load_tables
from shardline.picodata.stats import ClientStats, Explanation
from shardline.pool.health import HealthPolicy
from shardline.topology.sources import EMPTY_MAP_WARNING_AFTER, PollingSource, pg_connect

__all__ = ["DEFAULT_TIMEOUT", "HEALTH_POLICY", "Client", "connect"]

logger = logging.getLogger("shardline.picodata")

WARNING_INTERVAL = 60.0
"""Seconds between two warnings of the same kind (a fallback for the same reason)."""

DEFAULT_TIMEOUT = 5.0
"""The deadline, in seconds, of a query made without ``timeout=``, unless :func:`connect` was
given another. Finite, so that no query waits forever on an instance that stalled: its
deadline is what ejects a stalled instance for reads and what a write to a stalled master
raises at. Five times the worker proxy's 1 s (``shardline.proxy.DEFAULT_TIMEOUT``), because a
healthy SQL query's duration spans far more than a task's: a keyed lookup takes a millisecond,
a scan, an aggregate or a DDL statement seconds, and a default that cut those off would break
queries that run today; and the same 5 s as ``acquire_timeout``, the client's bound on the
other wait a query can have (for a connection of a busy instance). A longer query says so with
``timeout=``."""

_OFF = 1e9
"""A stuck floor (seconds, 31 years) and a latency ratio no instance reaches: the rule is off."""

HEALTH_POLICY = HealthPolicy(stuck_floor=_OFF, latency_outlier=_OFF)
"""When the client ejects an instance for reads: the pool's rules and defaults
(:class:`~shardline.pool.health.HealthPolicy`: 5 failures or deadline misses in a row, or a
success rate under 0.6; ejected 1 s times its ejections, at most 30 s; re-admitted by a probe
query that succeeds; at most 10% of the instances, always one, ejected at once), with the
stuck-call and latency-outlier rules off. Those two compare a query's time with the recent
ones: a worker's calls take about as long as each other, an instance's queries do not (a
keyed lookup and a scan on the same instance differ a thousandfold, a master runs the writes
and its replicas the reads), so a long query would pass for a stall. A query past its
deadline is the stall signal here."""

_NO_KEY: Any = object()
_UNLEARNED: Any = object()  # a statement text whose metadata has not come yet
_RAISE: Any = object()  # an error that is the caller's: nothing to send again

_NOT_ONLINE = "master-not-online"
_NO_ADDRESS = "no-address"

_OTHER_TIER = "other-tier"
"""The fallback reason of a query sent to another tier because none of its own could be
reached."""

_TIERS_QUERY = "SELECT * FROM _pico_tier"
_VERSIONS_QUERY = "SELECT picodata_version FROM _pico_instance"

_FORWARD_REFUSAL = 'cannot satisfy "forward = off"'
"""What an instance's error says when ``forward=off`` refused a query whose buckets it does not
hold (picodata/picodata ``test/int/sql/explain_forward.sql``; SQLSTATE XX000, an sbroad
error): nothing ran."""

Forward = Literal["on", "ro_to_rw", "off"]
_FORWARDS = ("on", "ro_to_rw", "off")

_DEFAULT_TIER = "default"
"""The default tier's name before Picodata 26.1 (``src/tier.rs`` ``DEFAULT_TIER``), and the
default tier when no ``_pico_tier`` row says ``is_default``."""

_T_co = TypeVar("_T_co", covariant=True)

_SHORTCUT = shortcut_allowed(asyncpg.__version__)

# How a query ended, for the health registry (WorkerPool.finish_dispatch)
_SUCCESS: Final = WorkerPool.OUTCOME_SUCCESS
_FAILURE: Final = WorkerPool.OUTCOME_FAILURE
_DEADLINE: Final = WorkerPool.OUTCOME_DEADLINE
_NEUTRAL: Final = WorkerPool.OUTCOME_NEUTRAL

_DEADLINE_STEPS = 10
"""The client's deadline sweeper runs this many times per ``timeout``: a query made without
``timeout=`` raises between 1 and 1.1 times it."""

_PRISTINE = 0.999
"""The success rate from which a healthy instance without a failure in a row is no longer
watched (its successes no longer reported): the average comes back toward 1 without ever
reaching it, and from here one more failure weighs within 0.1% as it would from 1."""

_Shape = Literal["rows", "row", "value"]
"""What a query method returns of the rows: all of them, the first, its first column."""


class _Query(Protocol[_T_co]):
    """``execute``, ``fetch`` and ``fetchrow`` of :class:`Client`."""

    def __call__(
        self,
        query: str,
        *args: Any,
        key: Any = ...,
        read_only: bool = False,
        strict: bool | None = None,
        timeout: float | None = None,
    ) -> Coroutine[Any, Any, _T_co]: ...


class _FetchVal(Protocol):
    """``fetchval`` of :class:`Client`."""

    def __call__(
        self,
        query: str,
        *args: Any,
        key: Any = ...,
        column: int = 0,
        read_only: bool = False,
        strict: bool | None = None,
        timeout: float | None = None,
    ) -> Coroutine[Any, Any, Any]: ...


def _query_method(run: Callable[..., Awaitable[Any]], doc: str, shape: _Shape | None = None) -> Any:
    """One of :class:`Client`'s query methods: asyncpg's ``run`` on the connection that the
    arguments choose (see the class), the connection given back once it returns. ``shape``
    (for ``fetch``, ``fetchrow`` and ``fetchval``) says what ``run`` returns of the rows, so
    that the hot path may await ``Connection._execute`` in its place (see
    :mod:`shardline.picodata.driver_shortcut`).

    Implementation notes:
        The method built here is the only frame of Python between the caller and the driver
        on the hot path: a keyed write, or a query without a key, whose instance is not
        watched for its health and has an idle connection that is open. It routes the key,
        pops that connection from the pool's ``idle`` list, stores the deadline sweeper's
        tick for it, and appends it back (when :meth:`InstancePool.release` would do no
        more) itself, calling no function written in Python but asyncpg's ``is_closed()`` and
        ``is_in_transaction()``; anything else goes through :meth:`Client._connection` and
        :meth:`InstancePool.release`. Each Python call it saves is a frame entered at every
        query: with a routing helper, ``InstancePool.take`` and ``release`` called, a query
        cost about 2,500 more instructions (callgrind, 16 in flight; see benches/RESULTS.md),
        some 3% of the client's work. A shared ``_run`` coroutine awaited by each method would add
        a second frame resumed at every wake-up of the query (about 1 µs per query); four
        hand-written methods would repeat the logic four times. Where the driver shortcut
        applies, awaiting asyncpg's ``_execute`` instead of ``run`` removes asyncpg's own
        frame too (the connection's ``is_closed()``, which ``run`` would check first, has
        just been checked), and a statement already in the connection's cache is run by the
        protocol's ``bind_execute`` itself, four more frames fewer (see
        :mod:`shardline.picodata.driver_shortcut`).
    """
    limit = 0 if shape in ("rows", None) else 1
    status = shape is None  # execute: the status of the command, not rows

    async def query(
        self: Client,
        query: str,
        *args: Any,
        key: Any = _NO_KEY,
        read_only: bool = False,
        strict: bool | None = None,
        timeout: float | None = None,
        **options: Any,
    ) -> Any:
        if key is _NO_KEY:
            routing = self._statements.get(query, self._unlearned) if args else UNKEYED
            if routing is UNKEYED:
                online = self._online
                self._turn += 1
                pool = online[self._turn % len(online)] if online else None
            elif routing is _UNLEARNED or (values := routing.values(args)) is None:
                pool = None  # the slow path learns the statement, or sends it unkeyed
            else:  # routed by the statement's metadata, as key= would be
                key = routing
                pool = (
                    None if read_only else self._routes.get(id(self._route(routing.tier, values)))
                )
        elif read_only:
            pool = None
        elif key.__class__ is ShardingKey:
            pool = self._routes.get(id(self._route(key.tier, key.values)))
        else:
            pool = self._routes.get(id(self._route(self._tier, key)))
        if (
            status
            and self._pipelining
            and args
            and pool is not None
            and not pool.watched
            and timeout is None
            and not options
        ):
            pipeline = pool.pipeline
            if pipeline is None or pipeline.closed:
                pool.start_pipeline()  # this query goes as before
            else:
                try:
                    result = await pipeline.execute(query, args, self._tick)
                except BaseException as error:
                    self._count(pool, key)
                    again = self._pipeline_failed(pool, pipeline, error, key, query)
                    if again is _RAISE:
                        raise
                    await self._poll_if_refused(error)
                    return await self._rerun(
                        run, query, args, again, read_only, strict, timeout, options
                    )
                if result is not NOT_PIPELINED:
                    self._count(pool, key)
                    return result
        if (
            pool is not None
            and not pool.watched
            and (idle := pool.idle)
            and not idle[-1].is_closed()
        ):
            connection = idle.pop()
            self._count(pool, key)
            # execute without arguments takes the simple-query protocol: asyncpg's own path
            direct = _SHORTCUT and not options and (args or not status)
            started = 0
        else:
            pool, connection, key = await self._connection(key, read_only, strict, query, args)
            direct = False
            started = self._report_start(pool) if pool.watched else 0
        # the client's deadline, kept by its sweeper, unless the driver's timeout bounds it
        pool.lent[connection] = self._tick if timeout is None else None
        try:
            if direct:
                statement = (
                    connection._stmt_cache.get(
                        (query, connection._protocol.get_record_class(), False)
                    )
                    if timeout is None and self._untimed
                    else None
                )
                if statement is not None:
                    try:
                        rows = await connection._protocol.bind_execute(
                            statement, args, "", limit, status, None
                        )
                    except CACHE_ERRORS as error:
                        rows = await after_cache_error(
                            connection, error, query, args, limit, status
                        )
                else:
                    rows = await connection._execute(
                        query, args, limit, timeout, return_status=status
                    )
                if status:
                    result = rows[1].decode()
                elif shape == "rows":
                    result = rows
                elif not rows:
                    result = None
                else:
                    result = rows[0] if shape == "row" else rows[0][0]
            elif timeout is None and not options:
                # asyncpg's defaults: no keyword dict to build and parse (~1,000 instructions)
                result = await run(connection, query, *args)
            else:
                result = await run(connection, query, *args, timeout=timeout, **options)
        except BaseException as error:
            if isinstance(error, asyncpg.PostgresError) and not connection.is_closed():
                again = self._resend(error, connection._drop_local_statement_cache, key, query)
            else:
                again = _RAISE
            raised = self._failed(
                pool, connection, error, started, key is not _NO_KEY and not read_only, timeout
            )
            if raised is None:
                if again is not _RAISE:
                    await self._poll_if_refused(error)
                    return await self._rerun(
                        run, query, args, again, read_only, strict, timeout, options
                    )
                raise
            raise raised from error
        if started:
            self._finish(pool, started, _SUCCESS)
        if pool.waiters or pool.closing or connection.is_in_transaction():
            pool.release(connection)
        else:
            pool.idle.append(connection)
        return result

    query.__name__ = run.__name__
    query.__qualname__ = f"Client.{run.__name__}"
    query.__doc__ = doc
    return query


def connect(
    dsn: str,
    *,
    tier: str | None = None,
    pool_size: int = 16,
    acquire_timeout: float = 5.0,
    route_wait: float = 1.0,
    strict: bool = False,
    poll_interval: float = 1.0,
    connect_kwargs: Mapping[str, Any] | None = None,
    warn_empty_after: float | None = EMPTY_MAP_WARNING_AFTER,
    timeout: float = DEFAULT_TIMEOUT,
    query_metadata: bool | None = None,
    forward: Forward | None = None,
    pipeline: bool = False,
) -> Client:
    """A client of the Picodata cluster whose catalog ``dsn`` reaches; use it as
    ``async with connect(...) as db:`` or ``db = await connect(...)`` (then ``await
    db.close()``). Nothing is dialled before it is awaited or entered.

    Args:
        dsn: a ``postgresql://`` URL of any instance's pgproto port; its user, password,
            database and TLS settings (``sslmode``, …) are used for every instance.
        tier: the client's tier: the tier ``key=`` routes in (a :class:`ShardingKey` carries
            its own), whose instances serve the queries without a key. Default: the cluster's
            default tier, as Picodata defines it: the ``_pico_tier`` row whose ``is_default``
            is true (Picodata 26.1 and later: the first tier of the cluster's configuration),
            else the tier named ``"default"`` (earlier versions). A tier without buckets (an
            arbiter tier) is refused.
        pool_size: the most connections open to one instance (opened on demand, so a light
            load holds fewer; 16 lets 16 queries in flight on one master run without waiting).
        acquire_timeout: seconds a query waits for a connection of a busy instance (or for
            a connection to open) before :class:`~shardline.errors.PoolTimeout`.
        route_wait: seconds a key without a route waits for a fresh poll of the catalog.
        strict: what a key still without a route after ``route_wait`` does: ``False`` sends
            the query to an online instance of the key's tier (the server routes it), ``True``
            raises :class:`~shardline.errors.NoWorkersAvailable`. Each query may override it.
        poll_interval: seconds between two polls of the catalog.
        connect_kwargs: more keyword arguments for ``asyncpg.connect`` of every instance
            and of the catalog's connection (``ssl=`` an ``SSLContext``,
            ``server_settings``, …; ``timeout`` bounds a connect to an instance, default
            ``acquire_timeout``).
        warn_empty_after: seconds a tier's bucket map may stay empty (cleared and not
            refilled) before a WARNING on ``shardline.topology.sources`` says so; ``None``:
            never (see :meth:`~shardline.topology.sources.TopologySource.run`).
        timeout: the deadline in seconds of every query made without ``timeout=`` (see
            :data:`DEFAULT_TIMEOUT` and the class); finite.
        query_metadata: whether the instance sessions ask for Picodata's query metadata
            (``pico_query_metadata``) and stale-statement errors (``pico_stmt_invalidation``),
            which route a query with arguments and no ``key=`` by the arguments that make its
            sharding key (see the class). ``None``: when every instance of the catalog runs
            Picodata 26.1 or later (``_pico_instance.picodata_version``), the first release
            that has them; a plain PostgreSQL refuses these startup parameters.
        forward: Picodata's ``forward`` option (26.2) for every query of the client's sessions
            (sent in the startup ``options``): ``"off"`` makes an instance refuse a query
            whose buckets are not its own, so a query routed to a master that no longer owns
            the key is refused (not run) and sent once more to the new owner (see the class);
            Picodata allows it with reads on the leader only, so ``read_only=True`` queries go
            to the master too. ``None`` leaves the server's default (``"on"``).
        pipeline: whether ``execute(query, *args)`` on the hot path shares one connection per
            instance with the other callers' and is sent without waiting for their answers
            (PostgreSQL's pipelining: each query still its own implicit transaction, an
            error in one touching no other; see the class). At most ``pool_size`` queries
            per instance wait on it, and none is added while the server is not reading it:
            the others go pooled. Not over TLS, nor with a ``client_encoding`` other than
            UTF8.

    Raises ``ValueError`` naming the argument for an invalid one (an
    :class:`~shardline.errors.InvalidArgumentType`, also a ``TypeError``, for one of the
    wrong type). Awaiting the client raises :class:`~shardline.errors.NotPicodata` if the
    DSN's server has no Picodata catalog (a plain PostgreSQL),
    :class:`~shardline.errors.UnknownTier` for a tier the catalog does not have,
    :class:`~shardline.errors.TierWithoutBuckets` for an arbiter tier.
    """
    return Client(
        dsn,
        tier=tier,
        pool_size=pool_size,
        acquire_timeout=acquire_timeout,
        route_wait=route_wait,
        strict=strict,
        poll_interval=poll_interval,
        connect_kwargs=connect_kwargs,
        warn_empty_after=warn_empty_after,
        timeout=timeout,
        query_metadata=query_metadata,
        forward=forward,
        pipeline=pipeline,
    )


class Client:
    """SQL on a Picodata cluster, routed by sharding key; made by :func:`connect`.

    ``execute``, ``fetch``, ``fetchrow`` and ``fetchval`` take asyncpg's arguments, plus:

    - ``key=``: a value or tuple of values (hashed by Picodata's scheme in the client's tier),
      or a :class:`ShardingKey` from :meth:`key_for`. The query goes to the current master of
      the replicaset owning the key's bucket. With ``read_only=True`` it goes to that
      replicaset's online replicas in turn, the master when none is reachable. A write never
      goes to a replica, and never to another instance because the master's connections are
      busy: it waits up to ``acquire_timeout`` (counted), then raises
      :class:`~shardline.errors.PoolTimeout`.
    - No key, with arguments: a statement whose query metadata (Picodata's NOTICE to its
      Parse, see :mod:`shardline.picodata.query_metadata`) names the parameters that make its
      sharding key (a single-row ``INSERT ... VALUES``, say) is routed as ``key=`` those
      arguments would be, in the statement's tier (counted in ``stats().from_metadata``
      besides ``routed["keyed"]``). The first execution of a statement text prepares it on an
      instance of the tier to learn its metadata, then routes; the metadata is kept by
      statement text. ``key=`` wins when given; a statement whose metadata names no
      parameter (a ``SELECT``, several rows, a key given as a literal) goes as below.
    - No key otherwise: the online instances of the client's tier, in turn (the server routes the
      query); only when none of them can be reached (or none is online), the online instances
      of the other tiers (counted in ``stats().fallbacks["other-tier"]``, warned about at most
      once a minute). An arbiter tier's instances (a tier of bucket count 0: they hold no
      data) are never contacted.
    - A key without a route (the map was cleared, the range or the master is unknown or not
      online) triggers a poll of the catalog and waits for it up to ``route_wait``, then
      routes again; if there is still no route, the query goes to an online instance of its
      tier (counted as a fallback by reason, warned about at most once a minute per reason), or
      with ``strict`` raises :class:`~shardline.errors.NoWorkersAvailable` naming the tier,
      the bucket and why.
    - If the instance cannot be reached before the query is sent (no connection opens), the
      client refreshes the topology and tries once more on the instance that serves the key
      then; if that fails too, :class:`~shardline.errors.InstanceUnavailable`. An error after
      the query was sent is the driver's, raised as it is: the query is never repeated. If
      the connection broke, it is discarded and a poll is triggered.
    - ``timeout=``: the query's deadline in seconds, from when it has a connection (the wait
      for one is ``acquire_timeout``'s); without it, the client's (:func:`connect`'s
      ``timeout``, :data:`DEFAULT_TIMEOUT` 5 s). A query still unanswered at its deadline
      raises :class:`~shardline.errors.DeadlineExceeded` (a ``TimeoutError``) naming the
      instance, with ``may_have_run`` true: it was sent, so it may have run, or may still run.
      With ``timeout=`` the driver bounds the query and asks the server to cancel it; without
      it, the client's deadline falls between 1 and 1.1 times the default, and the client
      closes the query's connection then (the server may finish the statement: PostgreSQL
      notices a closed connection when it next writes to it). Either way the connection is
      discarded and the query never sent again. A keyed write's deadline also triggers a
      poll of the catalog (its master may have failed over).
    - Health: each instance's queries feed the rules of the pool's passive health
      (:data:`HEALTH_POLICY`). A failure is a query whose connection broke, or a connect
      that failed; a deadline miss counts as one; a server's error (a SQL error, a
      constraint) is a success: the instance answered. After 5 failures in a row (or a
      success rate under 0.6) the instance is ejected for reads: reads and unkeyed queries
      skip it while any other candidate can serve them (a read still goes to its replicaset's
      replicas in turn, then the master). Once its ejection (1 s, longer each time) has
      passed, the next query handed to it is a probe: if it succeeds the instance is
      re-admitted, else ejected again. A keyed write always goes to the master, ejected or
      not: to a sick master it raises at its deadline. Ejections and re-admissions are
      logged at INFO on ``shardline.picodata``, counted in :meth:`stats`, and shown by
      :meth:`explain`.
    - Pipelining (``connect(pipeline=True)``): an ``execute`` with arguments and without
      ``timeout=`` or driver options, to an instance not watched for its health (see below),
      goes on the instance's one pipelined connection (opened in the background at the first
      such query, which goes pooled meanwhile), shared with the other callers' and sent
      without waiting for their answers; the queries of one turn of the event loop leave in
      one write. It holds at most ``pool_size`` queries sent and unanswered, and takes none
      while the server is not reading the connection (its socket full); a query that finds
      it so goes pooled, as without pipelining (bounded by ``pool_size`` and
      ``acquire_timeout``), so no crowd of callers piles up on one connection. Each is its
      own implicit transaction, as on a pooled connection: a server error fails that query
      alone. The rules above hold for each query: a server's error is raised as asyncpg's
      exception (a stale statement or ``forward=off`` refusal is sent once more, pooled); a
      query sent when the connection breaks raises ``asyncpg.ConnectionDoesNotExistError``
      and is never sent again (it may have run), and the broken connection is one failure of
      the instance however many queries it held; at the deadline the connection is closed, and
      the queries sent in the same sweep interval as the oldest raise
      :class:`~shardline.errors.DeadlineExceeded`, those sent later the connection error. A
      caller cancelled after sending leaves its query to run; the connection stays. What the
      pipeline cannot encode exactly as asyncpg's default codecs would (parameter types other
      than ``bool``, ``bytea``, ``int2/4/8``, ``text``, ``varchar``, ``float8``; values of
      other classes, subclasses included) goes pooled. Session state set through the pipelined
      connection (``set_config`` in a query with arguments) stays there, as it would on a
      pooled one. Notices of pipelined queries are not read.

    A client works on the event loop it was started on. :meth:`close` (or leaving ``async
    with``) waits for the queries in flight, then closes every connection.

    Implementation notes:
        The topology is a :class:`shardline.Topology` fed by a
        :class:`~shardline.topology.sources.PollingSource` in a background task. A keyed
        query costs, before any I/O, one ``Topology.route`` call (hash and lookup in Rust),
        one dict lookup of the instance's pool by the identity of the ``Instance`` object
        the topology returned (it returns the same object while the instance is unchanged,
        and a new one when anything about it changes, so a cached decision is never stale),
        and a pop of the pool's idle list. The pools are one :class:`InstancePool` per
        instance (lean: see its notes on asyncpg's ``Pool``). What derives from membership
        (pools of instances that left or changed address to close, the online members of
        each replicaset, the online instances) is rebuilt when
        ``Topology.membership_version`` has moved: checked on every path but the hot one,
        and once per ``poll_interval`` in the background. A miss waits on
        ``PollingSource.refresh``, which joins a poll not started yet, so concurrent misses
        share one poll.

        Health is a :class:`shardline.WorkerPool` used as a registry: one entry per
        instance's pool (uid: the instance's uuid), never asked to balance; the rules are
        its own, in Rust. Reporting every query would cost the hot path two calls into it
        (its start and end, about 1,900 instructions of a query's 80,000), so an instance is
        reported only while it is *watched* (``InstancePool.watched``): from its first
        failure or deadline miss until, healthy again, it has no failure in a row and a
        success rate back above 0.999. The hot path serves only unwatched instances and
        costs one attribute test for it; a watched instance's queries take the slow path,
        which reports their start (``start_dispatch``: the probe of an instance whose
        ejection has passed is claimed there) and their end. An unwatched instance is healthy
        in the registry: only a failure or a deadline miss, reported whether watched or not,
        can change that (the stuck-call and latency-outlier rules are off). Ejected
        instances are found by the registry's live view of the visible ones.

        The default deadline is not asyncpg's ``timeout``: that arms and cancels an event
        loop timer and reads the clock three times per query, about 22,700 instructions
        (callgrind, one connection, ``SELECT $1::bigint``: 92,900 against 115,600), a quarter
        of a query. Instead the hot path writes the sweeper's tick into ``InstancePool.lent``
        for the connection it lends (one dict store), and a sweeper task, ``DEADLINE_STEPS``
        times per ``timeout``, closes each connection still lent since more than that many
        ticks, marking it in ``InstancePool.expired`` so that the query's error is read as its
        deadline. The gate and the store together cost the hot path about 620 instructions
        per query (callgrind, one caller, 1,000 keyed ``fetchrow``: 100,965 before, 101,510
        to 101,585 after).

        Pipelining is :class:`~shardline.picodata.pipeline.Pipeline`'s, one per instance in
        ``InstancePool.pipeline`` (outside the pool's ``size``); the hot path awaits its
        ``execute`` before looking for an idle connection, and a query it returns
        ``NOT_PIPELINED`` for (full at ``size`` unanswered, or its transport paused) goes on
        as without it. Its deadline is the sweeper's: ``Pipeline.expire`` closes the
        connection when its oldest query is as old as a lent connection's would be. On the
        stand-in cluster it halves the server's CPU per keyed INSERT at 16 in flight
        (benches/RESULTS.md, issue 27's pipelining section): the backend reads a batch in one
        wake-up.
    """

    def __init__(
        self,
        dsn: str,
        *,
        tier: str | None = None,
        pool_size: int = 16,
        acquire_timeout: float = 5.0,
        route_wait: float = 1.0,
        strict: bool = False,
        poll_interval: float = 1.0,
        connect_kwargs: Mapping[str, Any] | None = None,
        warn_empty_after: float | None = EMPTY_MAP_WARNING_AFTER,
        timeout: float = DEFAULT_TIMEOUT,
        query_metadata: bool | None = None,
        forward: Forward | None = None,
        pipeline: bool = False,
    ) -> None:
        self._catalog, dsn_settings = pg_connect.parse_dsn(dsn)
        if tier is not None and (not isinstance(tier, str) or not tier):
            raise refusal(tier, str)(f"tier must be a non-empty str or None, got {tier!r}")
        if not isinstance(strict, bool):
            raise InvalidArgumentType(f"strict must be a bool, got {strict!r}")
        if query_metadata is not None and not isinstance(query_metadata, bool):
            raise InvalidArgumentType(
                f"query_metadata must be a bool or None, got {query_metadata!r}"
            )
        if forward is not None and forward not in _FORWARDS:
            raise ValueError(f"forward must be one of {_FORWARDS} or None, got {forward!r}")
        self._query_metadata = query_metadata
        self._forward = forward
        if not isinstance(pipeline, bool):
            raise InvalidArgumentType(f"pipeline must be a bool, got {pipeline!r}")
        self._dsn = dsn
        # empty until the catalog's default tier is read (at the start), if not given
        self._tier: str = tier or ""
        self._pool_size = check_count("pool_size", pool_size)
        self._acquire_timeout = check_seconds("acquire_timeout", acquire_timeout)
        self._route_wait = check_seconds("route_wait", route_wait, zero=True)
        self._strict = strict
        self._poll_interval = check_seconds("poll_interval", poll_interval)
        self._timeout = check_seconds("timeout", timeout)
        self._warn_empty_after = (
            None
            if warn_empty_after is None
            else check_seconds("warn_empty_after", warn_empty_after)
        )
        given = dict(connect_kwargs or {})
        # a connect to an instance is bounded like a wait for a busy pool, unless the caller
        # says otherwise; the catalog's connection is bounded by the source itself
        timeout = given.pop("timeout", self._acquire_timeout)
        managed = sorted(name for name in ("host", "port") if name in given)
        if managed:
            raise ValueError(
                f"connect_kwargs must not set {', '.join(managed)}: the catalog's addresses do"
            )
        # the same credentials, TLS and settings for the catalog and every instance
        kwargs = pg_connect.connect_kwargs(given, dsn_settings)
        # the catalog's own connections; the instances' get Picodata's session settings too
        self._catalog_kwargs = {**kwargs, "timeout": timeout}
        self._connect_kwargs = self._catalog_kwargs
        # whether a query without timeout= is unbounded for the driver (the hot path's
        # shortcut past asyncpg's statement lookup applies only then)
        self._untimed = self._catalog_kwargs.get("command_timeout") is None
        # the pipeline reads asyncpg's transport and bounds its queries by the sweeper (see
        # shardline.picodata.pipeline)
        self._pipelining = pipeline and _SHORTCUT and self._untimed
        self._dsn_options = dsn_settings.get("options")

        self._topology = Topology()
        self._route = self._topology.route
        self._source = PollingSource(dsn, interval=self._poll_interval, connect_kwargs=given)
        self._runner: asyncio.Task[None] | None = None
        self._maintenance: asyncio.Task[None] | None = None
        self._started = False
        self._closed = False
        self._closing: asyncio.Task[None] | None = None

        self._pools: dict[str, InstancePool] = {}
        self._retiring: set[asyncio.Task[None]] = set()
        # id(Instance) -> its pool, or None when it cannot be dialled; _pinned keeps each of
        # these Instance objects alive, so no other object can have its id meanwhile
        self._routes: dict[int, InstancePool | None] = {}
        self._pinned: dict[int, Instance] = {}
        self._version = -1  # the topology's membership_version the caches below reflect
        self._instances = 0
        # replicaset uuid -> its online instances with an address: (uuid, pool), filled on
        # first use
        self._members: dict[str, list[tuple[str, InstancePool]]] = {}
        # the online instances of the client's tier, and of every tier with buckets, by tier
        self._online: list[InstancePool] = []
        self._online_in: dict[str, list[InstancePool]] = {}
        self._turn = 0  # of the unkeyed queries, over the online instances
        self._read_turn = 0  # of the reads, over a replicaset's replicas
        self._tables: dict[str, TableDistribution] | None = None
        # statement text -> how its executions are routed (from its query metadata)
        self._statements: dict[str, StatementRouting] = {}
        # what the hot path takes a statement it has no metadata of for: one to learn, or,
        # without query metadata, an unkeyed one
        self._unlearned: Any = UNKEYED
        self._from_metadata = 0
        self._reprepared = 0
        self._forward_repaired = 0

        self._keyed = 0
        self._read_only = 0
        self._unkeyed = 0
        self._misses: Counter[str] = Counter()
        self._fallbacks: Counter[str] = Counter()
        self._retries = 0
        self._unavailable = 0
        self._deadlines = 0
        self._warned: dict[str, float] = {}
        self._tick = 0  # of the deadline sweeper: how many sweeps so far
        self._sweeper: asyncio.Task[None] | None = None

        # the instances' health: one entry per pool (uid = the instance's uuid), its rules in
        # Rust; _visible is the live view of the instances not ejected now
        self._health = WorkerPool()
        self._health.configure_health(HEALTH_POLICY)
        self._visible = self._health.workers

    # life cycle

    def __await__(self) -> Generator[Any, None, Self]:
        return self._start().__await__()

    async def __aenter__(self) -> Self:
        return await self._start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def _start(self) -> Self:
        """Reads the catalog once (bounded by the source's poll timeout) and starts following
        it. Raises :class:`~shardline.errors.InstanceUnavailable` if the catalog could not be
        read at all, :class:`~shardline.errors.UnknownTier` if ``tier`` is not in it."""
        if self._started:
            return self
        if self._closed:
            raise RuntimeError("the client is closed")
        self._started = True
        self._runner = asyncio.get_running_loop().create_task(
            self._source.run(self._topology, warn_empty_after=self._warn_empty_after)
        )
        try:
            await self._source.refresh()
            tiers = self._topology.tiers
            if not tiers:
                await self._read_catalog()  # raises NotPicodata for a server without it
                state = self._source.state
                raise InstanceUnavailable(
                    f"cannot read the catalog at {self._catalog}: {state.last_failure}",
                    instance=None,
                    address=self._catalog,
                )
            if not self._tier or self._query_metadata is None:
                rows, versions = await self._read_catalog()
                if not self._tier:
                    self._tier = _default_tier(rows, tiers)
                if self._query_metadata is None:
                    self._query_metadata = metadata_supported(versions)
            self._connect_kwargs = self._session_kwargs()
            if self._query_metadata:
                self._unlearned = _UNLEARNED
            if self._tier not in tiers:
                raise UnknownTier(
                    f"tier {self._tier!r} is not in the catalog (its tiers: {sorted(tiers)})"
                )
            if not tiers[self._tier]:
                raise TierWithoutBuckets(
                    f"tier {self._tier!r} has no buckets (bucket_count 0, an arbiter tier):"
                    " no query can be routed in it"
                )
        except BaseException:
            await self.close()
            raise
        self._sync()
        loop = asyncio.get_running_loop()
        self._maintenance = loop.create_task(self._maintain())
        self._sweeper = loop.create_task(self._sweep())
        return self

    async def _read_catalog(self) -> tuple[list[Any], list[Any]]:
        """``_pico_tier``'s rows (every column) and the instances' ``picodata_version``, read
        over a connection of their own to the DSN's server. Raises :class:`NotPicodata` if
        the server has no ``_pico_tier``, :class:`InstanceUnavailable` if it cannot be
        read."""
        try:
            async with asyncio.timeout(self._acquire_timeout):
                connection = await asyncpg.connect(self._dsn, **self._catalog_kwargs)
                try:
                    rows: list[Any] = await connection.fetch(_TIERS_QUERY)
                    versions = [row[0] for row in await connection.fetch(_VERSIONS_QUERY)]
                finally:
                    await connection.close()
        except asyncpg.UndefinedTableError as error:
            raise NotPicodata(
                f"{self._catalog} is not a Picodata instance: it has no _pico_tier table, the"
                f" catalog every Picodata instance serves (the server says: {error})",
                address=self._catalog,
            ) from error
        except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
            raise InstanceUnavailable(
                f"cannot read _pico_tier at {self._catalog}: {pg_connect.message(error)}",
                instance=None,
                address=self._catalog,
            ) from error
        return rows, versions

    def _session_kwargs(self) -> dict[str, Any]:
        """``asyncpg.connect``'s arguments for an instance: the catalog's, with Picodata's
        session settings (query metadata, ``forward`` in ``options`` beside the DSN's)."""
        settings = dict(self._catalog_kwargs["server_settings"])
        if self._query_metadata:
            settings.update(SESSION_SETTINGS)
        if self._forward is not None:
            # Picodata reads options as name=value pairs separated by commas
            # (src/pgproto/client/startup.rs); the DSN's own options stay in front
            options = settings.get("options", self._dsn_options)
            forward = f"forward={self._forward}"
            settings["options"] = f"{options},{forward}" if options else forward
        return {**self._catalog_kwargs, "server_settings": settings}

    async def close(self) -> None:
        """Stops following the catalog, waits for the queries in flight, and closes every
        connection. Queries started after it raise ``RuntimeError``. Idempotent: every call
        returns once the client is closed. A call whose caller is cancelled raises
        ``CancelledError`` at once while the closing goes on; a later call waits for it.

        Implementation notes: the closing runs in a task of its own that every call waits
        on through ``asyncio.shield``, so a cancelled caller cannot leave connections open."""
        if self._closing is None:
            self._closed = True
            self._closing = asyncio.get_running_loop().create_task(self._shut_down())
        await asyncio.shield(self._closing)

    async def _shut_down(self) -> None:
        for task in (self._maintenance, self._sweeper, self._runner):
            if task is not None:
                task.cancel()
        await self._source.aclose()
        for task in (self._maintenance, self._sweeper, self._runner):
            if task is not None:
                await cancel_and_wait(task)
        pools, self._pools = list(self._pools.values()), {}
        self._online, self._members = [], {}
        self._forget_routes()
        await asyncio.gather(*(pool.aclose() for pool in pools), *self._retiring)

    async def _maintain(self) -> None:
        """Every ``poll_interval``: follows membership, and dials the instances that could not
        be reached again (each waits out its own backoff)."""
        while True:
            await asyncio.sleep(self._poll_interval)
            self._sync()
            await asyncio.gather(*(pool.probe() for pool in list(self._pools.values())))

    async def _sweep(self) -> None:
        """Every ``timeout / DEADLINE_STEPS`` seconds: closes the connections whose query,
        made without ``timeout=``, has run for ``timeout`` or more (see the class's notes)."""
        interval = self._timeout / _DEADLINE_STEPS
        while True:
            await asyncio.sleep(interval)
            self._tick = tick = self._tick + 1
            for pool in list(self._pools.values()):
                if pool.pipeline is not None:
                    pool.pipeline.expire(tick - _DEADLINE_STEPS - 1)
                if not pool.lent:
                    continue
                idle = {id(connection) for connection in pool.idle}
                for connection, lent in list(pool.lent.items()):
                    # lent at tick `lent`, after that sweep: it has run for more than
                    # tick - lent - 1 intervals
                    if (
                        lent is not None
                        and tick - lent > _DEADLINE_STEPS
                        and id(connection) not in idle
                        and connection not in pool.expired
                    ):
                        pool.expired.add(connection)
                        connection.terminate()

    @property
    def topology(self) -> Topology:
        """The topology the client routes with (kept current in the background)."""
        return self._topology

    async def refresh(self) -> bool:
        """Polls the catalog now and applies what it says; True if the poll read everything
        and the topology accepted it."""
        self._check_open()
        ok = await self._source.refresh()
        self._sync()
        return ok

    # queries

    # The four query methods are built by _query_method (below the class), each typed by a
    # protocol: one coroutine frame between the caller and the driver, written once.

    execute: _Query[str] = _query_method(
        asyncpg.Connection.execute,
        """Runs ``query`` (see the class for ``key``, ``read_only`` and ``strict``); returns
        the status of its last command, as ``asyncpg.Connection.execute`` does.""",
    )
    fetch: _Query[list[Any]] = _query_method(
        asyncpg.Connection.fetch,
        """Runs ``query`` and returns its rows (``asyncpg.Record``).""",
        "rows",
    )
    fetchrow: _Query[Any] = _query_method(
        asyncpg.Connection.fetchrow,
        """Runs ``query`` and returns its first row (``asyncpg.Record``), or None.""",
        "row",
    )
    fetchval: _FetchVal = _query_method(
        asyncpg.Connection.fetchval,
        """Runs ``query`` and returns ``column`` (default 0) of its first row, or None.""",
        "value",
    )

    async def _connection(
        self, key: Any, read_only: bool, strict: bool | None, query: str, args: tuple[Any, ...]
    ) -> tuple[InstancePool, Any, Any]:
        """(pool, connection, key) for a query the hot path could not serve (see
        :func:`_query_method`); ``key`` is the statement's :class:`StatementRouting` when its
        metadata routes it."""
        if key is _NO_KEY and args and self._query_metadata:
            routing = self._statements.get(query)
            if routing is None:
                routing = await self._learn(query)
            if routing.values(args) is not None:
                key = routing
        if key is _NO_KEY:
            return (*await self._unkeyed_connection(), key)
        target = key
        if key.__class__ is StatementRouting:
            values = key.values(args)
            target = ShardingKey("", key.tier, values if len(key.positions) > 1 else (values,))
        # forward=off goes with read_preference leader only (Picodata's ADR): a read of a
        # client whose sessions carry it goes to the master, as a write does
        if read_only and self._forward != "off":
            pool, connection = await self._read_connection(target, strict)
        else:
            pool, connection = await self._keyed_connection(target, strict)
        if target is not key:
            self._from_metadata += 1
        return pool, connection, key

    def _resend(
        self, error: BaseException, forget: Callable[[], None], key: Any, query: str
    ) -> Any:
        """The key to send ``query`` once more with after the server answered ``error`` and
        ran nothing (``_NO_KEY``: as a query without a key), or ``_RAISE`` to raise it: a
        stale statement (42999) is prepared again (statement caches dropped, ``forget`` those
        of the connection it ran on, its metadata
        forgotten, so the resend learns it anew); a routed query an instance refused under
        ``forward=off`` (not its bucket) goes to the owner after a poll. Counts what it
        resends."""
        sqlstate = getattr(error, "sqlstate", None)
        if sqlstate == STALE_STATEMENT and self._query_metadata:
            # a DDL made the statements stale on every instance: the idle connections forget
            # theirs too, so that the resend prepares afresh wherever it lands (what the
            # public reload_schema_state() does to a connection outside an asyncpg pool,
            # without its yield; a connection in use finds out on its own)
            forget()
            for pool in self._pools.values():
                for idle in pool.idle:
                    idle._drop_local_statement_cache()
                if pool.pipeline is not None:
                    pool.pipeline.forget_statements()
            self._statements.pop(query, None)
            self._reprepared += 1
            return _NO_KEY if key.__class__ is StatementRouting else key
        if key is not _NO_KEY and _FORWARD_REFUSAL in str(getattr(error, "message", "")):
            self._forward_repaired += 1
            return key
        return _RAISE

    async def _poll_if_refused(self, error: BaseException) -> None:
        """After a ``forward=off`` refusal, the map is stale: waits for a poll (as a miss
        does, up to ``route_wait``)."""
        if getattr(error, "sqlstate", None) != STALE_STATEMENT:
            await self._poll()

    async def _rerun(
        self,
        run: Callable[..., Awaitable[Any]],
        query: str,
        args: tuple[Any, ...],
        key: Any,
        read_only: bool,
        strict: bool | None,
        timeout: float | None,
        options: Mapping[str, Any],
    ) -> Any:
        """Runs the query once more, on the slow path, with no further resend: a second
        refusal is the caller's."""
        pool, connection, key = await self._connection(key, read_only, strict, query, args)
        started = self._report_start(pool) if pool.watched else 0
        pool.lent[connection] = self._tick if timeout is None else None
        try:
            result = await run(connection, query, *args, timeout=timeout, **options)
        except BaseException as error:
            raised = self._failed(
                pool, connection, error, started, key is not _NO_KEY and not read_only, timeout
            )
            if raised is None:
                raise
            raise raised from error
        if started:
            self._finish(pool, started, _SUCCESS)
        pool.release(connection)
        return result

    async def _learn(self, query: str) -> StatementRouting:
        """Prepares ``query`` on an instance of the client's tier so that its query metadata
        arrives (:meth:`_on_notice`), and returns how it is routed (:data:`UNKEYED` if no
        metadata came). Raises what preparing raises (a SQL error is the query's)."""
        pool, connection = await self._any_connection()
        pool.lent[connection] = None  # not the sweeper's: bounded here
        try:
            async with asyncio.timeout(self._timeout):
                await connection.prepare(query)
        except BaseException as error:
            raised = self._failed(pool, connection, error, 0, False, self._timeout)
            if raised is None:
                raise
            raise raised from error
        pool.release(connection)
        # the notice came before ParseComplete: its listener ran before prepare() returned
        return self._statements.setdefault(query, UNKEYED)

    def _on_notice(self, connection: Any, message: Any) -> None:
        """asyncpg's log listener of every instance connection: keeps the query metadata a
        Parse was answered with."""
        found = read_notice(message.message or "", self._topology.tiers, self._tier)
        if found is None:
            return
        query, routing = found
        if len(self._statements) >= MAX_STATEMENTS:
            self._statements.clear()
        self._statements[query] = routing

    async def _keyed_connection(self, key: Any, strict: bool | None) -> tuple[Any, Any]:
        """A connection to the master serving ``key``, after the waits, fallbacks and the one
        retry the class describes."""
        self._check_open()
        self._sync()
        tier, values = self._split(key)

        def master(attempt: int) -> list[InstancePool]:
            pool = self._pool_of(self._route(tier, values))
            return [] if pool is None else [pool]

        pool, connection = await self._two_attempts(
            master,
            lambda last: self._fallback(tier, values, strict),
            miss=lambda: self._why(tier, values),
        )
        self._keyed += 1
        return pool, connection

    async def _fallback(self, tier: str, values: Any, strict: bool | None) -> tuple[Any, Any]:
        """No route after the wait for a poll: an online instance of the tier (another tier's
        only if none of it can be reached), or NoWorkersAvailable."""
        route = self._topology.explain(tier, values)
        reason = self._reason(route)
        bucket = route.bucket
        if self._strict if strict is None else strict:
            raise NoWorkersAvailable(
                f"no route for bucket {bucket} of tier {tier!r}: {reason}: {route.detail} (after"
                f" waiting up to route_wait={self._route_wait} s for a poll of the catalog)"
            )
        self._fallbacks[reason] += 1
        self._warn(
            f"fallback:{reason}",
            "no route for bucket %s of tier %r (%s): queries go to any online instance of the tier",
            bucket,
            tier,
            reason,
        )
        return await self._any_connection(tier=tier)

    async def _read_connection(self, key: Any, strict: bool | None) -> tuple[Any, Any]:
        """A connection for a read of ``key``: an online replica of the owning replicaset in
        turn, the master when no replica can be reached."""
        self._check_open()
        tier, values = self._split(key)
        pool, connection = await self._two_attempts(
            lambda attempt: self._read_candidates(tier, values),
            lambda last: self._fallback(tier, values, strict),
            miss=lambda: self._why(tier, values),
        )
        self._read_only += 1
        return pool, connection

    def _read_candidates(self, tier: str, values: Any) -> list[InstancePool]:
        """The owning replicaset's online replicas, starting at the next in turn, then its
        master (if it can be dialled)."""
        master = self._route(tier, values)
        if master is not None:
            replicaset = master.replicaset_uuid
            master_uuid = master.uuid
        else:
            replicaset = self._topology.owner(tier, self._topology.bucket_id(tier, values))
            master_uuid = None
        members = self._members_of(replicaset) if replicaset is not None else []
        replicas = [pool for uuid, pool in members if uuid != master_uuid]
        if replicas:
            self._read_turn += 1
            start = self._read_turn % len(replicas)
            replicas = replicas[start:] + replicas[:start]
        master_pool = self._pool_of(master)
        if master_pool is not None:
            replicas.append(master_pool)
        return replicas

    async def _unkeyed_connection(self) -> tuple[InstancePool, Any]:
        """A connection to the online instance whose turn it is, or the next one that can be
        reached."""
        self._check_open()
        pool, connection = await self._any_connection(self._turn)
        self._unkeyed += 1
        return pool, connection

    async def _any_connection(
        self, turn: int | None = None, tier: str | None = None
    ) -> tuple[Any, Any]:
        """A connection to an online instance of ``tier`` (default: the client's), starting at
        the one whose turn it is (or ``turn``, on the first attempt), with one refresh and
        retry; if none of the tier can be reached, to an online instance of another tier with
        buckets (a fallback)."""
        self._sync()
        tier = self._tier if tier is None else tier

        def in_turn(attempt: int) -> list[InstancePool]:
            nonlocal turn
            online = self._online_in.get(tier, [])
            if not online:
                return online
            if turn is None or attempt == 2:
                self._turn += 1
                turn = self._turn
            start = turn % len(online)
            return online[start:] + online[:start]

        async def other_tiers(last: InstanceUnavailable | None) -> tuple[Any, Any]:
            others = [
                pool for name, pools in self._online_in.items() if name != tier for pool in pools
            ]
            if not others:
                self._unavailable += 1
                if last is not None:
                    raise last
                raise NoWorkersAvailable(
                    f"no instance of tier {tier!r} (nor of another tier with buckets) is online"
                    " with a pgproto address"
                )
            self._fallbacks[_OTHER_TIER] += 1
            self._warn(
                f"fallback:{_OTHER_TIER}:{tier}",
                "no instance of tier %r can be reached: queries without a route go to other tiers",
                tier,
            )
            self._turn += 1
            start = self._turn % len(others)
            try:
                return await self._first_reachable(others[start:] + others[:start], redial=True)
            except InstanceUnavailable:
                self._unavailable += 1
                raise

        return await self._two_attempts(in_turn, other_tiers, unreachable_too=True)

    async def _two_attempts(
        self,
        candidates: Callable[[int], list[InstancePool]],
        none_left: Callable[[InstanceUnavailable | None], Awaitable[tuple[Any, Any]]],
        *,
        miss: Callable[[], str] | None = None,
        unreachable_too: bool = False,
    ) -> tuple[Any, Any]:
        """The flow of every connection the client hands out, and what it counts: attempt
        1's ``candidates``; none (a miss, counted by the reason ``miss`` gives) waits for a
        poll and looks again, and still none is ``none_left(the InstanceUnavailable of an
        attempt before, or None)``. When none of the candidates can be reached: a poll (a
        retry, counted) and attempt 2, redialling; when none can be reached again, its
        InstanceUnavailable is raised (counted), or with ``unreachable_too`` handed to
        ``none_left``. A client closed meanwhile raises at once."""
        last: InstanceUnavailable | None = None
        for attempt in (1, 2):
            found = candidates(attempt)
            if not found:
                if miss is not None:
                    self._misses[miss()] += 1
                await self._poll()
                found = candidates(attempt)
                if not found:
                    return await none_left(last)
            try:
                return await self._first_reachable(found, redial=attempt == 2)
            except InstanceUnavailable as error:
                if self._closed or (attempt == 2 and not unreachable_too):
                    self._unavailable += 1
                    raise
                last = error
                if attempt == 2:
                    return await none_left(last)
                self._retries += 1
                await self._poll()
        raise AssertionError("unreachable")

    async def _first_reachable(
        self, candidates: list[InstancePool], *, redial: bool
    ) -> tuple[Any, Any]:
        """A connection from the first candidate that gives one, in order but for those
        ejected for their health (tried last) and those in their connect backoff (tried
        after the others of their kind). Raises the last candidate's InstanceUnavailable if
        none does."""
        ordered = sorted(candidates, key=lambda pool: (self._ejected(pool), pool.down))
        last: InstanceUnavailable | None = None
        for pool in ordered:
            try:
                return pool, await self._acquire(pool, redial=redial)
            except InstanceUnavailable as error:
                last = error
        assert last is not None  # candidates is never empty
        raise last

    async def _acquire(self, pool: InstancePool, *, redial: bool) -> Any:
        """``pool.acquire``, a connect that fails reported to the health registry."""
        try:
            return await pool.acquire(redial=redial)
        except InstanceUnavailable as error:
            # dialled and failed (the driver's error chained), not refused during the backoff
            # or because the pool closed
            if error.__cause__ is not None:
                self._finish(pool, 0, _FAILURE)
            raise

    # health

    def _ejected(self, pool: InstancePool) -> bool:
        """Whether reads skip ``pool``'s instance now (ejected, or its probe running)."""
        return pool.watched and pool.uid not in self._visible

    def _report_start(self, pool: InstancePool) -> int:
        """Starts reporting a query on the watched ``pool`` to the health registry: the
        registry's ``started`` reading, or 0 when the instance is hidden (ejected, or another
        query is its probe) and the query is not reported. The first query handed an
        instance whose ejection has passed is its probe."""
        try:
            return self._health.start_dispatch(pool.uid)[2]
        except KeyError:
            return 0

    def _finish(self, pool: InstancePool, started: int, outcome: int) -> None:
        """Reports how a query on ``pool`` ended (``started`` from :meth:`_report_start`; 0
        for one that was not reported from its start, whose failure is then reported as a
        query of no duration); logs and counts what changed."""
        health = self._health
        uid = pool.uid
        if outcome in (_FAILURE, _DEADLINE):
            pool.watched = True
        if not started:
            if outcome == _NEUTRAL:
                return
            started = self._report_start(pool)
            if not started:
                return
        if health.finish_dispatch(uid, started, outcome):
            self._log_health()
        if outcome == _SUCCESS and pool.watched:
            state = health.health(uid)
            if state is None or (
                state.state == "healthy"
                and not state.consecutive_failures
                and state.success_rate >= _PRISTINE
            ):
                pool.watched = False

    def _log_health(self) -> None:
        """Logs the health registry's events (ejections, re-admissions) at INFO."""
        for _, pool, kind, reason, seconds in self._health.drain_health_events():
            if kind == "ejected":
                logger.info(
                    "instance %s at %s ejected for reads for %g s (%s)",
                    pool.label,
                    pool.address,
                    seconds,
                    reason,
                )
            else:
                logger.info(
                    "instance %s at %s re-admitted for reads: its probe query succeeded",
                    pool.label,
                    pool.address,
                )

    def _failed(
        self,
        pool: InstancePool,
        connection: Any,
        error: BaseException,
        started: int,
        write: bool,
        timeout: float | None,
    ) -> DeadlineExceeded | None:
        """A query raised after it was sent: keep the connection if the server answered and
        the session is intact, else discard it and ask for a poll (the instance may be gone),
        and report the outcome to the health registry (see the class). Returns the error to
        raise instead of ``error``: :class:`DeadlineExceeded` when the deadline passed (a
        keyed write's triggers a poll, the master may have changed), else None."""
        if isinstance(error, asyncpg.PostgresError) and not connection.is_closed():
            pool.release(connection)
            if started:
                self._finish(pool, started, _SUCCESS)
            return None
        broken = connection.is_closed()
        # the driver's timeout, or the sweeper closed the connection at the client's deadline
        deadline = isinstance(error, TimeoutError) or connection in pool.expired
        pool.release(connection, broken=True)
        if deadline and not isinstance(error, asyncio.CancelledError):
            return self._deadline_exceeded(pool, started, write, timeout)
        if isinstance(error, asyncio.CancelledError):
            self._finish(pool, started, _NEUTRAL)
            return None
        # a broken connection is the instance's failure; an error that left it open was
        # the driver's or the caller's (arguments it cannot encode, ...): no signal
        self._finish(pool, started, _FAILURE if broken else _NEUTRAL)
        self._source.trigger()
        return None

    def _deadline_exceeded(
        self, pool: InstancePool, started: int, write: bool, timeout: float | None
    ) -> DeadlineExceeded:
        """A query on ``pool`` passed its deadline: reports and counts it, triggers a poll
        for a write (the master may have changed), returns the error to raise."""
        timeout = self._timeout if timeout is None else timeout
        self._finish(pool, started, _DEADLINE)
        self._deadlines += 1
        if write:
            self._source.trigger()
        return DeadlineExceeded(
            f"the query on instance {pool.label} at {pool.address} passed its deadline"
            f" of {timeout:g} s: it was sent, so it may have run there (or may still run)"
            + ("; a poll of the catalog was triggered" if write else ""),
            timeout=timeout,
            tried=((pool.uuid, pool.address, "deadline"),),
            may_have_run=True,
            address=pool.address,
        )

    def _pipeline_failed(
        self, pool: InstancePool, pipeline: Pipeline, error: BaseException, key: Any, query: str
    ) -> Any:
        """A pipelined query raised ``error``: the key to run it once more with on a pooled
        connection (the server answered and ran nothing: a stale statement, a ``forward=off``
        refusal, a cached statement whose result type changed), or ``_RAISE`` to raise it.
        Raises :class:`DeadlineExceeded` in its place if it passed its deadline. Reports a
        dropped connection to the health registry as :meth:`_failed` does, once for all the
        queries it failed: one broken connection is one failure of the instance."""
        if isinstance(error, CACHE_ERRORS):
            pipeline.forget_statements()
            return key
        if isinstance(error, asyncpg.ConnectionDoesNotExistError):  # a PostgresError too
            if pipeline.claim_drop():
                self._finish(pool, 0, _FAILURE)
                self._source.trigger()
            return _RAISE
        if isinstance(error, asyncpg.PostgresError):
            return self._resend(error, pipeline.forget_statements, key, query)
        if isinstance(error, TimeoutError):
            write = key is not _NO_KEY
            raise self._deadline_exceeded(pool, 0, write, None) from error
        return _RAISE  # cancelled

    def _count(self, pool: InstancePool, key: Any) -> None:
        """Counts a query the hot path sends, on a pooled connection or pipelined."""
        pool.queries += 1
        if key is _NO_KEY:
            self._unkeyed += 1
        else:
            self._keyed += 1
            if key.__class__ is StatementRouting:
                self._from_metadata += 1

    # routing helpers

    def _split(self, key: Any) -> tuple[str, Any]:
        if isinstance(key, ShardingKey):
            return key.tier, key.values
        return self._tier, key

    def _pool_of(self, instance: Instance | None) -> InstancePool | None:
        """The pool of ``instance``, None if it cannot be dialled (not online, no address);
        the decision is cached for this very object."""
        if instance is None:
            return None
        if id(instance) in self._routes:
            return self._routes[id(instance)]
        pool = None
        address = instance.address
        if address is not None and _undialable(instance) is None:
            pool = self._pools.get(instance.uuid)
            if pool is None or pool.address != address:
                if pool is not None:
                    self._retire(pool)
                pool = InstancePool(
                    instance.uuid,
                    address,
                    connect=self._dial,
                    size=self._pool_size,
                    acquire_timeout=self._acquire_timeout,
                    name=instance.name,
                )
                self._pools[instance.uuid] = pool
                self._health.add_worker(pool, pool)
        if len(self._routes) > 4 * self._instances + 64:
            # the Instance objects of past states are of no use any more
            self._forget_routes()
        self._routes[id(instance)] = pool
        self._pinned[id(instance)] = instance
        return pool

    def _forget_routes(self) -> None:
        self._routes.clear()
        self._pinned.clear()

    def _why(self, tier: str, values: Any) -> str:
        """Why ``values`` has no instance to go to in ``tier`` now (the reasons misses and
        fallbacks are counted by): :meth:`_reason` of the topology's explanation."""
        return self._reason(self._topology.explain(tier, values))

    def _reason(self, route: RouteExplanation) -> str:
        """Why the client cannot send a query to what ``route`` routes to: the core's reason
        (``map-cleared``, ``no-range``, ``replicaset-unknown``, ``master-unknown``), or else
        why :meth:`_pool_of` gives its master no pool (:func:`_undialable`)."""
        return route.reason or _undialable(route.routed) or _NO_ADDRESS

    async def _poll(self) -> None:
        """Asks for a poll and waits for it up to ``route_wait``, then reconciles the pools."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._route_wait):
                await self._source.refresh()
        self._sync()

    async def _dial(self, host: str, port: int) -> Any:
        connection = await asyncpg.connect(self._dsn, host=host, port=port, **self._connect_kwargs)
        if self._query_metadata:
            connection.add_log_listener(self._on_notice)
        return connection

    def _sync(self) -> None:
        """Reconciles the pools with the topology's instances, if its membership moved since
        the last time: closes the pools of instances that left or changed address (once
        their queries end), and lists every online instance afresh."""
        if self._closed:
            return
        version = self._topology.membership_version  # read before the state it vouches for
        if version == self._version:
            return
        self._version = version
        instances = self._topology.instances
        self._instances = len(instances)
        self._forget_routes()
        self._members = {}
        for uuid, pool in list(self._pools.items()):
            instance = instances.get(uuid)
            if instance is None or instance.address != pool.address:
                del self._pools[uuid]
                self._retire(pool)
        tiers = self._topology.tiers
        replicasets = self._topology.replicasets
        online: dict[str, list[InstancePool]] = {}
        for _, instance in sorted(instances.items()):
            replicaset = replicasets.get(instance.replicaset_uuid or "")
            # an arbiter tier's instances (no buckets, no data) and those of an unknown tier
            # are never dialled for a query
            if replicaset is None or not tiers.get(replicaset.tier):
                continue
            member = self._pool_of(instance)
            if member is not None:
                online.setdefault(replicaset.tier, []).append(member)
        self._online_in = online
        self._online = online.get(self._tier, [])

    def _members_of(self, replicaset: str) -> list[tuple[str, InstancePool]]:
        """The online members of ``replicaset`` that can be dialled, as (uuid, pool)."""
        if self._topology.membership_version != self._version:
            self._sync()
        members = self._members.get(replicaset)
        if members is None:
            members = []
            for instance in self._topology.replicaset_instances(replicaset):
                pool = self._pool_of(instance)
                if pool is not None:
                    members.append((instance.uuid, pool))
            self._members[replicaset] = members
        return members

    def _retire(self, pool: InstancePool) -> None:
        self._health.remove_worker(pool)
        task = asyncio.get_running_loop().create_task(pool.aclose())
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the client is closed")
        if not self._started:
            raise RuntimeError("the client is not connected: await it or use async with")

    def _warn(self, kind: str, message: str, *args: Any) -> None:
        now = time.monotonic()
        last = self._warned.get(kind)
        if last is None or now - last >= WARNING_INTERVAL:
            self._warned[kind] = now
            logger.warning(message, *args)

    # sharding keys

    async def key_for(self, table: str, row: Mapping[str, Any]) -> ShardingKey:
        """The sharding key of ``row`` (field name → value) of ``table``, to pass as ``key=``.

        The tables' distributions are read from ``_pico_table`` once, and again when ``table``
        is not among them. Raises :class:`~shardline.errors.InvalidArgument` for a table the
        catalog does not have, a global table, a table sharded by an explicit bucket id or by
        another hash function than murmur3, or a row without a key field (naming it).
        """
        self._check_open()
        tables = self._tables
        if tables is None or table not in tables:
            pool, connection = await self._any_connection()
            pool.lent[connection] = None  # not the sweeper's: these queries are the client's
            try:
                tables = await load_tables(connection)
            except BaseException as error:
                self._failed(pool, connection, error, 0, False, None)
                raise
            pool.release(connection)
            self._tables = tables
        distribution = tables.get(table)
        if distribution is None:
            raise InvalidArgument(f"table {table!r} is not in _pico_table")
        return key_of(distribution, row)

    # reports

    def stats(self) -> ClientStats:
        """A snapshot of the client's counters (see :class:`ClientStats`)."""
        state = self._source.state
        health = self._health
        pools = {uuid: pool.stats(health.health(pool.uid)) for uuid, pool in self._pools.items()}
        ejections, readmissions, ejected = health.health_counts()
        return ClientStats(
            routed=MappingProxyType(
                {"keyed": self._keyed, "read-only": self._read_only, "unkeyed": self._unkeyed}
            ),
            misses=MappingProxyType(dict(self._misses)),
            fallbacks=MappingProxyType(dict(self._fallbacks)),
            retries=self._retries,
            unavailable=self._unavailable,
            pools=MappingProxyType(pools),
            polls=state.attempts,
            poll_failures=state.failures,
            last_poll=state.last_refresh,
            epochs=MappingProxyType(
                {tier: self._topology.epoch(tier) for tier in self._topology.tiers}
            ),
            last_poll_failure=state.last_failure,
            poll_durations=state.read_durations,
            deadlines=self._deadlines,
            ejections=ejections,
            readmissions=readmissions,
            ejected=ejected,
            from_metadata=self._from_metadata,
            reprepared=self._reprepared,
            forward_repaired=self._forward_repaired,
        )

    def explain(self, key: Any, *, tier: str | None = None) -> Explanation:
        """Where a query with ``key`` would go now, and why (see :class:`Explanation`; its
        ``str()`` reads as a few lines for people). ``tier`` overrides the client's tier (a
        :class:`ShardingKey` carries its own).

        Implementation notes:
            The chain (bucket, range, replicaset, master, the reason of a miss) is
            :meth:`shardline.Topology.explain`'s, read once; the client adds what only it
            knows: whether it can dial that master (online, with a valid address), and the
            health of the replicaset's instances."""
        key_tier, values = self._split(key)
        if tier is not None and not isinstance(key, ShardingKey):
            key_tier = tier
        route = self._topology.explain(key_tier, values)
        routable = self._pool_of(route.routed) is not None
        found = route.range
        replicaset = route.replicaset
        master = route.master
        master_uuid = route.master_uuid
        owner = route.replicaset_uuid
        master_pool = self._pools.get(master_uuid) if master_uuid is not None else None
        members = (
            [p for _, p in self._members_of(owner)] if owner is not None and self._started else []
        )
        if master_pool is not None and master_pool not in members:
            members.append(master_pool)
        return Explanation(
            tier=key_tier,
            bucket=route.bucket,
            range=(found.start, found.end) if found is not None else None,
            replicaset=owner,
            replicaset_name=replicaset.name if replicaset is not None else None,
            master=master_uuid,
            master_name=master.name if master is not None else None,
            address=route.master_address,
            state=route.master_state,
            epoch=route.epoch,
            range_epoch=found.epoch if found is not None else None,
            range_set_at=found.set_at if found is not None else None,
            range_set_by=found.set_by if found is not None else None,
            routable=routable,
            reason=None if routable else self._reason(route),
            master_health=(
                self._health.health(master_pool.uid) if master_pool is not None else None
            ),
            ejected=tuple(sorted(p.uuid for p in members if self._ejected(p))),
            detail=route.detail,
            route=route,
        )

    async def ping(self, instance: str, *, timeout: float | None = None) -> None:
        """Runs ``SELECT 1`` on the instance whose uuid is ``instance``, as any query of the
        client: a connection from its pool (dialled even during its connect backoff), the
        client's deadline unless ``timeout=`` gives one, and its outcome reported to the
        health registry (see the class): a deadline miss or a failed connect counts towards
        an ejection, a success towards re-admission, and the ping of an instance whose
        ejection has passed is its probe. Raises what a query would:
        :class:`~shardline.errors.DeadlineExceeded`,
        :class:`~shardline.errors.InstanceUnavailable`, or
        :class:`~shardline.errors.NoWorkersAvailable` for an instance the topology does not
        have online with a valid pgproto address. ``shardline inspect --probe`` is built on
        it."""
        self._check_open()
        self._sync()
        pool = self._pool_of(self._topology.instances.get(instance))
        if pool is None:
            raise NoWorkersAvailable(
                f"instance {instance!r} is not online with a pgproto address in the topology"
            )
        connection = await self._acquire(pool, redial=True)
        started = self._report_start(pool) if pool.watched else 0
        pool.lent[connection] = self._tick if timeout is None else None
        try:
            await connection.execute("SELECT 1", timeout=timeout)
        except BaseException as error:
            raised = self._failed(pool, connection, error, started, False, timeout)
            if raised is None:
                raise
            raise raised from error
        if started:
            self._finish(pool, started, _SUCCESS)
        pool.release(connection)


def _undialable(instance: Instance | None) -> str | None:
    """Why the client does not dial ``instance``, in the client's two reasons beside the
    core's: ``master-not-online`` (the topology routes to a master whatever its state; the
    client dials only an online one; no instance at all reads the same) and ``no-address`` (no
    valid pgproto address); None if it dials it."""
    if instance is None or not instance.is_online:
        return _NOT_ONLINE
    address = instance.address
    if address is None or not _valid_address(address):
        return _NO_ADDRESS
    return None


def _default_tier(rows: list[Any], tiers: Mapping[str, int]) -> str:
    """The cluster's default tier from ``_pico_tier``'s rows: the one whose ``is_default`` is
    true (a column of Picodata 26.1 and later, ``src/tier.rs`` ``Tier::is_default``), else the
    tier named ``default``. Raises :class:`UnknownTier` if neither exists."""
    # Record.get: None when the column is absent (before 26.1) as when the value is null
    flagged = [row["name"] for row in rows if row.get("is_default")]
    if len(flagged) == 1:
        return str(flagged[0])
    if _DEFAULT_TIER in tiers:
        return _DEFAULT_TIER
    raise UnknownTier(
        f"the catalog names no default tier (is_default is true for {sorted(flagged)}, and no"
        f" tier is named {_DEFAULT_TIER!r}; its tiers: {sorted(tiers)}): pass tier="
    )


def _valid_address(address: str) -> bool:
    try:
        split_host_port(address)
    except InvalidAddress:
        return False
    return True
