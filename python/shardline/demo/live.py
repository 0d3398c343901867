"""``shardline demo --pg DSN``: the topology part against a live cluster.

Instead of replaying scenario events, a :func:`shardline.picodata.connect` client follows the
cluster's catalog over pgwire; the demo polls it a few times (:meth:`Client.refresh`), and
after each poll a stream of keys is routed in every tier with :meth:`Topology.route_many` on the
client's topology, then the first of them run a routed ``SELECT 1`` each (``key=``) through the
client. Each :class:`LivePoll` holds the topology's tables (the ones ``shardline inspect``
prints), the keys per master, the keys with no route, a few sample keys, what changed since the
previous poll (tiers, replicasets, masters, instances, epochs, maps, keys that now reach
another master), so a rebalancing cluster's maps are seen to move, and where the routed
queries ran (:class:`QueryBatch`): per master, the keys routed to it and the queries its
connections ran, which match.

asyncpg (the ``pg`` extra) is imported only when :meth:`LiveDemo.polls` runs.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import itertools
import logging
import math
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from shardline import Topology
from shardline._extras import require_extra
from shardline.demo.replay import MasterRequests, TierState
from shardline.demo.scenario import MAX_KEYS, KeyStream
from shardline.demo.tables import TableData, topology_tables
from shardline.errors import ShardlineError

if TYPE_CHECKING:
    from shardline.picodata import Client, ClientStats
    from shardline.topology.sources.polling import PollingSource

__all__ = [
    "DEFAULT_INTERVAL",
    "DEFAULT_KEYS",
    "DEFAULT_POLLS",
    "DEFAULT_QUERIES",
    "QUERY",
    "InstanceQueries",
    "LiveDemo",
    "LiveDemoError",
    "LivePoll",
    "LiveTier",
    "QueryBatch",
    "SampleKey",
    "between_polls",
]

DEFAULT_POLLS = 3
DEFAULT_INTERVAL = 1.0
DEFAULT_KEYS = 2000
DEFAULT_QUERIES = 100
MAX_POLLS = 10_000
MAX_INTERVAL = 3600.0
QUERY = "SELECT 1"
"""The routed query: plain SQL that Picodata and PostgreSQL both run."""
IN_FLIGHT = 8
"""Routed queries in flight at once: fewer than the client's connections per instance (16 by
default), so a master's queries never wait for one of its connections."""


class LiveDemoError(ShardlineError):
    """The live topology part cannot run: the cluster could not be read, or an argument is
    invalid (``usage`` is True then)."""

    def __init__(self, message: str | None = None, *, usage: bool = False) -> None:
        super().__init__(*(() if message is None else (message,)))
        self.usage = usage


@dataclass(frozen=True, slots=True)
class LiveTier(TierState):
    """One tier after a poll: its map, its epoch, and where the keys were routed, as a
    replayed step's; and which replicaset each master serves, and how many keys moved."""

    replicasets: Mapping[str, str]  # master instance uuid -> its replicaset uuid
    moved: int | None  # keys routed to another master than at the previous poll


@dataclass(frozen=True, slots=True)
class SampleKey:
    """Where one key goes in one tier: its bucket, the owning replicaset and its master."""

    key: str
    tier: str
    bucket: int
    replicaset: str | None
    master: str | None
    address: str | None


@dataclass(frozen=True, slots=True)
class InstanceQueries:
    """One instance in a poll's routed queries: ``keys`` of the queried keys the topology
    routes to it (it is the master owning their buckets), ``queries`` run on its connections
    during the batch, ``failed`` queries of its keys that raised. ``label`` is its name, or
    the first 8 characters of its uuid when the catalog has no name."""

    uuid: str
    label: str
    address: str | None
    tier: str | None
    keys: int
    queries: int
    failed: int


@dataclass(frozen=True, slots=True)
class QueryBatch:
    """The routed queries run after one poll: :data:`QUERY` with ``key=`` each of the first
    ``keys`` keys, in every tier with buckets.

    ``instances`` are the masters the keys were routed to and any other instance whose
    connections ran a query meanwhile (a fallback lands on any online instance); ``unrouted``
    counts the queried keys with no route at the poll and ``unrouted_failed`` those of their
    queries that raised. ``misses``, ``fallbacks`` and ``retries`` are what
    :meth:`Client.stats` counted during the batch (by reason), ``polls`` the catalog polls
    the queries triggered (a key without a route, an instance that could not be reached);
    ``failures`` the errors of the failed queries, as ``reason (n x)``.
    """

    keys: int
    sent: int
    elapsed: float
    instances: tuple[InstanceQueries, ...]
    unrouted: int
    unrouted_failed: int
    misses: Mapping[str, int]
    fallbacks: Mapping[str, int]
    retries: int
    polls: int
    failures: tuple[str, ...]

    @property
    def failed(self) -> int:
        return sum(row.failed for row in self.instances) + self.unrouted_failed


@dataclass(frozen=True, slots=True)
class LivePoll:
    """What one poll of the cluster read, and what changed since the previous one.

    ``changes`` is None for the first poll; ``failures`` lists the failures of catalog polls
    counted since the previous poll's report (``reason (n x)``; the previous poll's queries
    may have triggered some), and ``last_failure`` the latest one's message.
    ``membership_changed`` is True when a tier, replicaset or instance changed. ``queries``
    is None when no query is run (``queries=0``).
    """

    number: int
    total: int
    elapsed: float
    complete: bool
    server: str | None
    failures: tuple[str, ...]
    last_failure: str | None
    tables: list[TableData]
    tiers: tuple[LiveTier, ...]
    samples: tuple[SampleKey, ...]
    changes: tuple[str, ...] | None
    membership_changed: bool
    moves: tuple[tuple[str, int, int, str | None, str | None], ...] = ()
    queries: QueryBatch | None = None


async def between_polls(after: int, interval: float) -> None:
    """Waits between poll ``after`` and the next one (a seam for tests)."""
    await asyncio.sleep(interval)


class LiveDemo:
    """Polls the cluster at ``dsn`` ``polls`` times, ``interval`` seconds apart, routing
    ``keys`` keys after each poll and running a routed query for the first ``queries`` of them
    (0: none); iterate :meth:`polls` to drive it. Raises :class:`LiveDemoError` (``usage``)
    for a bad argument."""

    def __init__(
        self,
        dsn: str,
        *,
        polls: int = DEFAULT_POLLS,
        interval: float = DEFAULT_INTERVAL,
        keys: int = DEFAULT_KEYS,
        queries: int = DEFAULT_QUERIES,
        pattern: str = "user:{i}",
        samples: int = 3,
        timeout: float = 5.0,
    ) -> None:
        if isinstance(polls, bool) or not isinstance(polls, int) or not 1 <= polls <= MAX_POLLS:
            raise LiveDemoError(
                f"--polls must be an integer from 1 to {MAX_POLLS}, got {polls!r}", usage=True
            )
        if (
            isinstance(interval, bool)
            or not isinstance(interval, int | float)
            or not math.isfinite(interval)
            or not 0 <= interval <= MAX_INTERVAL
        ):
            raise LiveDemoError(
                f"--interval must be a number of seconds from 0 to {MAX_INTERVAL:g},"
                f" got {interval!r}",
                usage=True,
            )
        if isinstance(keys, bool) or not isinstance(keys, int) or not 1 <= keys <= MAX_KEYS:
            raise LiveDemoError(
                f"--keys must be an integer from 1 to {MAX_KEYS}, got {keys!r}", usage=True
            )
        if (
            isinstance(queries, bool)
            or not isinstance(queries, int)
            or not 0 <= queries <= MAX_KEYS
        ):
            raise LiveDemoError(
                f"--queries must be an integer from 0 to {MAX_KEYS}, got {queries!r}", usage=True
            )
        self.dsn = dsn
        self.total = polls
        self.interval = float(interval)
        self.keys = KeyStream(keys, pattern)
        self.queries = min(queries, keys)  # the first keys of the stream: there are no more
        self.samples = samples
        self.timeout = timeout

    def polls(self) -> Iterator[LivePoll]:
        """Connects, polls, routes the keys, runs the routed queries and yields each poll's
        report as it is read.

        Raises :class:`~shardline.MissingExtra` without the ``pg`` extra, and
        :class:`LiveDemoError` with the reason if the first poll cannot read the cluster
        (nothing has been yielded then in either case); a later poll that fails is reported,
        not raised, and so is a query that fails (an instance that cannot be reached, …).

        Implementation notes:
            The client needs its tier (the one plain ``key=`` values route in) before it
            connects, so the catalog is read once first by a :class:`PollingSource` of the
            demo's own, which also gives the first poll's failure when the cluster cannot be
            read. The client's tier is the first tier with buckets; keys of the other tiers
            are routed with a :class:`~shardline.picodata.ShardingKey` naming theirs. The
            client polls on its own only to retry a failed poll or when a query finds no
            route (its ``poll_interval`` is the longest), so the demo's polls are its
            :meth:`~shardline.picodata.Client.refresh` calls.
        """
        require_extra("pg", "--pg")
        from shardline.picodata import connect
        from shardline.topology.sources.polling import PollingSource

        # failures are shown in the output; the source's and the client's own warnings would
        # repeat them
        for name in ("shardline.topology.sources", "shardline.picodata"):
            logging.getLogger(name).addHandler(logging.NullHandler())
        try:
            probe = PollingSource(
                self.dsn, interval=MAX_INTERVAL, timeout=self.timeout, retry=MAX_INTERVAL
            )
        except ValueError as error:
            raise LiveDemoError(f"--pg: {error}", usage=True) from None
        keys = self.keys.keys()
        with asyncio.Runner() as runner:
            tiers, server = runner.run(_read_tiers(probe))
            with_buckets = sorted(tier for tier, count in tiers.items() if count)
            tier = (with_buckets or sorted(tiers))[0]
            client = connect(
                self.dsn,
                tier=tier,
                pool_size=IN_FLIGHT,
                acquire_timeout=self.timeout,
                poll_interval=MAX_INTERVAL,
            )
            try:
                try:
                    runner.run(_start(client))
                except ShardlineError as error:
                    counted = client.stats().poll_failures
                    raise LiveDemoError(_unreadable(counted, str(error))) from None
                topology = client.topology
                previous: _Snapshot | None = None
                failures: Counter[str] = Counter()
                started = time.monotonic()
                for number in range(1, self.total + 1):
                    at = 0.0
                    if number == 1:  # the client's first poll, as it connected
                        complete = client.stats().last_poll is not None
                    else:
                        runner.run(between_polls(number - 1, self.interval))
                        at = time.monotonic() - started
                        complete = runner.run(client.refresh())
                    stats = client.stats()
                    new = Counter(stats.poll_failures)
                    new.subtract(failures)
                    failures = Counter(stats.poll_failures)
                    failed = tuple(f"{r} ({n}x)" for r, n in sorted(new.items()) if n > 0)
                    snapshot = _Snapshot.of(topology, keys)
                    poll = LivePoll(
                        number=number,
                        total=self.total,
                        elapsed=at,
                        complete=complete,
                        server=server,
                        failures=failed,
                        last_failure=stats.last_poll_failure if failed else None,
                        tables=topology_tables(
                            topology.tiers,
                            topology.replicasets,
                            topology.instances,
                            topology.bucket_maps,
                        ),
                        tiers=snapshot.tier_states(previous),
                        samples=self._samples(topology),
                        changes=None if previous is None else snapshot.changes(previous),
                        membership_changed=previous is not None
                        and snapshot.membership != previous.membership,
                        moves=() if previous is None else snapshot.moves(previous),
                    )
                    # after the tables are taken: a query may trigger a poll that changes them
                    if self.queries:
                        batch = runner.run(self._run_queries(client, tier, keys, snapshot))
                        poll = dataclasses.replace(poll, queries=batch)
                    yield poll
                    previous = snapshot
            finally:
                runner.run(client.close())

    async def _run_queries(
        self, client: Client, tier: str, keys: list[str], snapshot: _Snapshot
    ) -> QueryBatch:
        """Runs :data:`QUERY` with ``key=`` each of the first ``self.queries`` keys in every
        tier with buckets, :data:`IN_FLIGHT` at a time; failures are counted, never raised."""
        from shardline.picodata import ShardingKey

        queried = keys[: self.queries]
        work: list[tuple[Any, str | None]] = []  # (the key= to pass, the master routed to)
        for name in sorted(snapshot.bucket_counts):
            if not snapshot.bucket_counts[name]:
                continue  # an arbiter tier: no key is routed in it
            masters = snapshot.routes[name][: self.queries]
            for key, master in zip(queried, masters, strict=True):
                # a plain key routes in the client's tier, a ShardingKey in the one it names;
                # the demo's keys belong to no table
                routed = key if name == tier else ShardingKey("", name, (key,))
                work.append((routed, master))
        errors: list[str | None] = [None] * len(work)
        pending = iter(enumerate(work))

        async def worker() -> None:
            for n, (key, _) in pending:
                try:
                    await client.fetchval(QUERY, key=key)
                except Exception as error:
                    errors[n] = f"{type(error).__name__}: {error}"

        before = client.stats()
        started = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(min(IN_FLIGHT, len(work)))))
        elapsed = time.monotonic() - started
        after = client.stats()
        return _batch(client.topology, work, errors, before, after, self.queries, elapsed)

    def _samples(self, topology: Topology) -> tuple[SampleKey, ...]:
        samples = []
        # a tier without buckets (an arbiter tier) routes no key
        for tier in sorted(tier for tier, count in topology.tiers.items() if count):
            for key in self.keys.keys()[: self.samples]:
                bucket = topology.bucket_id(tier, key)
                master = topology.find_bucket_master(tier, bucket)
                samples.append(
                    SampleKey(
                        key,
                        tier,
                        bucket,
                        topology.owner(tier, bucket),
                        None if master is None else master.uuid,
                        None if master is None else master.address,
                    )
                )
        return tuple(samples)


async def _read_tiers(source: PollingSource) -> tuple[dict[str, int], str | None]:
    """The catalog's tiers (name → bucket count) and the server that gave them, read by one
    poll of ``source``, closed then. Raises :class:`LiveDemoError` with the reason if no tier
    could be read."""
    topology = Topology()
    task = asyncio.create_task(source.run(topology))
    try:
        await source.refresh()
        state = source.state
    finally:
        await source.aclose()
        await task
    if not topology.tiers:
        raise LiveDemoError(_unreadable(state.failures, state.last_failure))
    return dict(topology.tiers), state.server


async def _start(client: Client) -> None:
    await client


def _unreadable(failures: Mapping[str, int], last: str | None) -> str:
    reasons = ", ".join(f"{r} ({n}x)" for r, n in sorted(failures.items()) if n > 0)
    return f"cannot read the cluster: {reasons or 'nothing read'}" + (f"; {last}" if last else "")


def _grown(before: Mapping[str, int], after: Mapping[str, int]) -> Mapping[str, int]:
    """What a counter by reason gained from ``before`` to ``after``."""
    grown = Counter(after)
    grown.subtract(before)
    return MappingProxyType({reason: n for reason, n in sorted(grown.items()) if n > 0})


def _batch(
    topology: Topology,
    work: list[tuple[Any, str | None]],
    errors: list[str | None],
    before: ClientStats,
    after: ClientStats,
    keys: int,
    elapsed: float,
) -> QueryBatch:
    """The report of a batch of routed queries: ``work`` (key, master routed to) and each
    query's error, the client's stats before and after."""
    routed: Counter[str] = Counter()
    failed: Counter[str | None] = Counter()
    reasons: Counter[str] = Counter()
    unrouted = 0
    for (_, master), error in zip(work, errors, strict=True):
        if master is None:
            unrouted += 1
        else:
            routed[master] += 1
        if error is not None:
            failed[master] += 1
            reasons[error] += 1
    # a pool is told by its uuid and address: an instance that moved meanwhile got a new
    # pool, counting from 0
    ran_before = {(uuid, pool.address): pool.queries for uuid, pool in before.pools.items()}
    ran: Counter[str] = Counter()
    pool_addresses: dict[str, str] = {}
    for uuid, pool in after.pools.items():
        pool_addresses[uuid] = pool.address
        ran[uuid] += pool.queries - ran_before.get((uuid, pool.address), 0)
    rows = []
    for uuid in routed.keys() | {uuid for uuid, n in ran.items() if n}:
        instance = topology.instances.get(uuid)
        name = address = replicaset = None
        if instance is not None:
            name, address = instance.name, instance.address
            if instance.replicaset_uuid is not None:
                replicaset = topology.replicasets.get(instance.replicaset_uuid)
        rows.append(
            InstanceQueries(
                uuid=uuid,
                label=name or uuid[:8],
                address=address or pool_addresses.get(uuid),
                tier=None if replicaset is None else replicaset.tier,
                keys=routed[uuid],
                queries=ran[uuid],
                failed=failed[uuid],
            )
        )
    rows.sort(key=lambda row: (row.tier or "", row.label, row.uuid))
    return QueryBatch(
        keys=keys,
        sent=len(work),
        elapsed=elapsed,
        instances=tuple(rows),
        unrouted=unrouted,
        unrouted_failed=failed[None],
        misses=_grown(before.misses, after.misses),
        fallbacks=_grown(before.fallbacks, after.fallbacks),
        retries=after.retries - before.retries,
        polls=after.polls - before.polls,
        failures=tuple(f"{reason} ({n}x)" for reason, n in reasons.most_common()),
    )


def short(uuid: str | None) -> str:
    return "-" if uuid is None else uuid


def bucket_moves(
    before: tuple[tuple[int, int, str], ...], after: tuple[tuple[int, int, str], ...]
) -> list[tuple[int, int, str | None, str | None]]:
    """The buckets whose owner differs between two maps of a tier, as (start, end, owner
    before, owner after) ranges; None: no owner (not mapped)."""
    bounds = sorted({b for start, end, _ in (*before, *after) for b in (start, end + 1)})
    starts_before = [start for start, _, _ in before]
    starts_after = [start for start, _, _ in after]

    def owner(
        ranges: tuple[tuple[int, int, str], ...], starts: list[int], bucket: int
    ) -> str | None:
        n = bisect.bisect_right(starts, bucket) - 1
        if n >= 0 and ranges[n][0] <= bucket <= ranges[n][1]:
            return ranges[n][2]
        return None

    moves: list[tuple[int, int, str | None, str | None]] = []
    for start, next_start in itertools.pairwise(bounds):
        was, now = owner(before, starts_before, start), owner(after, starts_after, start)
        if was == now:
            continue
        if moves and moves[-1][1] == start - 1 and moves[-1][2:] == (was, now):
            moves[-1] = (moves[-1][0], next_start - 1, was, now)
        else:
            moves.append((start, next_start - 1, was, now))
    return moves


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """What one poll left in the topology, for computing the next poll's changes."""

    bucket_counts: dict[str, int]
    membership: tuple[Any, ...]
    replicasets: dict[str, tuple[str, str | None]]  # uuid -> (tier, master uuid)
    instances: dict[str, tuple[str | None, str | None, str | None]]  # uuid -> (rs, state, addr)
    epochs: dict[str, int]
    maps: dict[str, tuple[tuple[int, int, str], ...]]
    routes: dict[str, list[str | None]]  # tier -> the master uuid of each key
    addresses: dict[str, str | None]  # master uuid -> its address

    @classmethod
    def of(cls, topology: Topology, keys: list[str]) -> _Snapshot:
        tiers = dict(topology.tiers)
        replicasets = {
            rs.uuid: (rs.tier, rs.current_master_uuid) for rs in topology.replicasets.values()
        }
        instances = {
            i.uuid: (i.replicaset_uuid, i.current_state, i.address)
            for i in topology.instances.values()
        }
        routes: dict[str, list[str | None]] = {}
        addresses: dict[str, str | None] = {}
        for tier in sorted(tiers):
            masters = topology.route_many(tier, keys) if tiers[tier] else []
            routes[tier] = [None if m is None else m.uuid for m in masters]
            addresses.update((m.uuid, m.address) for m in masters if m is not None)
        return cls(
            bucket_counts=tiers,
            membership=(tiers, replicasets, instances),
            replicasets=replicasets,
            instances=instances,
            epochs={tier: topology.epoch(tier) for tier in tiers},
            maps={tier: tuple(topology.ranges(tier)) for tier in tiers},
            routes=routes,
            addresses=addresses,
        )

    def tier_states(self, previous: _Snapshot | None) -> tuple[LiveTier, ...]:
        states = []
        for tier, count in sorted(self.bucket_counts.items()):
            routes = self.routes[tier]
            counts = Counter(uuid for uuid in routes if uuid is not None)
            moved = None
            if previous is not None and tier in previous.routes:
                moved = sum(
                    1
                    for now, before in zip(routes, previous.routes[tier], strict=True)
                    if now != before
                )
            states.append(
                LiveTier(
                    tier,
                    count,
                    self.epochs[tier],
                    self.maps[tier],
                    tuple(
                        MasterRequests(uuid, self.addresses[uuid], n)
                        for uuid, n in sorted(counts.items())
                    ),
                    len(routes) - counts.total(),
                    {
                        uuid: (self.instances.get(uuid) or (None, None, None))[0] or "-"
                        for uuid in counts
                    },
                    moved,
                )
            )
        return tuple(states)

    def moves(
        self, previous: _Snapshot
    ) -> tuple[tuple[str, int, int, str | None, str | None], ...]:
        return tuple(
            (tier, *move)
            for tier in sorted(self.maps.keys() & previous.maps.keys())
            for move in bucket_moves(previous.maps[tier], self.maps[tier])
        )

    def changes(self, previous: _Snapshot) -> tuple[str, ...]:
        lines: list[str] = []
        for tier in sorted(self.bucket_counts.keys() - previous.bucket_counts.keys()):
            lines.append(f"tier {tier} appeared ({self.bucket_counts[tier]} buckets)")
        for tier in sorted(previous.bucket_counts.keys() - self.bucket_counts.keys()):
            lines.append(f"tier {tier} is gone")
        for uuid, (tier, master) in sorted(self.replicasets.items()):
            if uuid not in previous.replicasets:
                lines.append(
                    f"replicaset {short(uuid)} added to tier {tier}, master {short(master)}"
                )
            elif previous.replicasets[uuid][1] != master:
                was = previous.replicasets[uuid][1]
                lines.append(f"replicaset {short(uuid)}: master {short(was)} -> {short(master)}")
        for uuid, (tier, _) in sorted(previous.replicasets.items()):
            if uuid not in self.replicasets:
                lines.append(f"replicaset {short(uuid)} removed from tier {tier}")
        for uuid, (rs, state, address) in sorted(self.instances.items()):
            if uuid not in previous.instances:
                lines.append(
                    f"instance {short(uuid)} added to replicaset {short(rs)}, {state or '-'},"
                    f" at {address or '-'}"
                )
                continue
            was_rs, was_state, was_address = previous.instances[uuid]
            if was_state != state:
                lines.append(f"instance {short(uuid)}: {was_state or '-'} -> {state or '-'}")
            if was_address != address:
                lines.append(f"instance {short(uuid)}: address {was_address} -> {address}")
            if was_rs != rs:
                lines.append(f"instance {short(uuid)}: replicaset {short(was_rs)} -> {short(rs)}")
        for uuid, (rs, _, _) in sorted(previous.instances.items()):
            if uuid not in self.instances:
                lines.append(f"instance {short(uuid)} removed from replicaset {short(rs)}")
        for tier in sorted(self.bucket_counts.keys() & previous.bucket_counts.keys()):
            epoch, was_epoch = self.epochs[tier], previous.epochs[tier]
            ranges, was_ranges = self.maps[tier], previous.maps[tier]
            if epoch != was_epoch or ranges != was_ranges:
                line = f"{tier}: epoch {was_epoch} -> {epoch}"
                if ranges != was_ranges:
                    moved = sum(
                        end - start + 1 for start, end, _, _ in bucket_moves(was_ranges, ranges)
                    )
                    line += (
                        f", {len(ranges)} ranges (was {len(was_ranges)}),"
                        f" {moved} buckets changed owner (see bucket moves)"
                    )
                lines.append(line)
            routes, was_routes = self.routes[tier], previous.routes[tier]
            moved = sum(1 for a, b in zip(routes, was_routes, strict=True) if a != b)
            if moved:
                lost = sum(1 for a in routes if a is None) - sum(1 for b in was_routes if b is None)
                line = f"{tier}: {moved} of {len(routes)} keys now reach another master"
                if lost:
                    line += f" (keys with no route {'+' if lost > 0 else ''}{lost})"
                lines.append(line)
        return tuple(lines)
