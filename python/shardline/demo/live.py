"""``shardline demo --pg DSN``: the topology part against a live cluster.

Instead of replaying scenario events, a :class:`~shardline.topology.sources.polling.PollingSource`
polls the cluster's catalog over pgwire into a :class:`shardline.Topology` a few times, and after
each poll a stream of keys is routed in every tier with :meth:`Topology.route_many`. Each
:class:`LivePoll` holds the topology's tables (the ones ``shardline inspect`` prints), the keys
per master, the keys with no route, a few sample keys, and what changed since the previous poll
(tiers, replicasets, masters, instances, epochs, maps, keys that now reach another master), so a
rebalancing cluster's maps are seen to move.

asyncpg (the ``pg`` extra) is imported only when :meth:`LiveDemo.polls` runs.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import logging
import math
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from shardline import Topology
from shardline.demo.replay import MasterRequests
from shardline.demo.scenario import MAX_KEYS, KeyStream
from shardline.demo.tables import TableData, topology_tables
from shardline.errors import ShardlineError

__all__ = [
    "DEFAULT_INTERVAL",
    "DEFAULT_KEYS",
    "DEFAULT_POLLS",
    "LiveDemo",
    "LiveDemoError",
    "LivePoll",
    "LiveTier",
    "SampleKey",
    "between_polls",
]

DEFAULT_POLLS = 3
DEFAULT_INTERVAL = 1.0
DEFAULT_KEYS = 2000
MAX_POLLS = 10_000
MAX_INTERVAL = 3600.0


class LiveDemoError(ShardlineError):
    """The live topology part cannot run: the cluster could not be read, or an argument is
    invalid (``usage`` is True then)."""

    def __init__(self, message: str, *, usage: bool = False) -> None:
        super().__init__(message)
        self.usage = usage


@dataclass(frozen=True, slots=True)
class LiveTier:
    """One tier after a poll: its map, its epoch, and where the keys were routed."""

    tier: str
    bucket_count: int
    epoch: int
    ranges: tuple[tuple[int, int, str], ...]
    routed: tuple[MasterRequests, ...]
    unrouted: int
    replicasets: Mapping[str, str]  # master instance uuid -> its replicaset uuid
    moved: int | None  # keys routed to another master than at the previous poll

    @property
    def mapped(self) -> int:
        return sum(end - start + 1 for start, end, _ in self.ranges)


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
class LivePoll:
    """What one poll of the cluster read, and what changed since the previous one.

    ``changes`` is None for the first poll; ``failures`` lists the failures counted during
    this poll (``reason (n x)``), and ``last_failure`` the latest one's message.
    ``membership_changed`` is True when a tier, replicaset or instance changed.
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


async def between_polls(after: int, interval: float) -> None:
    """Waits between poll ``after`` and the next one (a seam for tests)."""
    await asyncio.sleep(interval)


class LiveDemo:
    """Polls the cluster at ``dsn`` ``polls`` times, ``interval`` seconds apart; iterate
    :meth:`polls` to drive it. Raises :class:`LiveDemoError` (``usage``) for a bad argument."""

    def __init__(
        self,
        dsn: str,
        *,
        polls: int = DEFAULT_POLLS,
        interval: float = DEFAULT_INTERVAL,
        keys: int = DEFAULT_KEYS,
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
        self.dsn = dsn
        self.total = polls
        self.interval = float(interval)
        self.keys = KeyStream(keys, pattern)
        self.samples = samples
        self.timeout = timeout

    def polls(self) -> Iterator[LivePoll]:
        """Connects, polls, routes the keys and yields each poll's report as it is read.

        Raises :class:`LiveDemoError` with the reason if the first poll cannot read the cluster
        (nothing has been yielded then); a later poll that fails is reported, not raised.
        """
        try:
            from shardline.topology.sources.polling import PollingSource
        except ImportError:
            raise LiveDemoError("--pg needs asyncpg: pip install 'shardline[pg]'") from None
        # failures are shown in the output; the source's own warnings would repeat them
        logging.getLogger("shardline.topology.sources").addHandler(logging.NullHandler())
        try:
            source = PollingSource(self.dsn, interval=3600.0, timeout=self.timeout, retry=3600.0)
        except ValueError as error:
            raise LiveDemoError(f"--pg: {error}", usage=True) from None
        topology = Topology()
        keys = self.keys.keys()
        with asyncio.Runner() as runner:
            running: list[asyncio.Task[None]] = []

            async def poll() -> bool:
                # the first poll starts the run() task: it polls at once, and that poll
                # answers the refresh
                if not running:
                    running.append(asyncio.create_task(source.run(topology)))
                return await source.refresh()

            try:
                previous: _Snapshot | None = None
                failures: Counter[str] = Counter()
                started = time.monotonic()
                for number in range(1, self.total + 1):
                    if number > 1:
                        runner.run(between_polls(number - 1, self.interval))
                    at = time.monotonic() - started
                    complete = runner.run(poll())
                    state = source.state
                    new = Counter(state.failures)
                    new.subtract(failures)
                    failures = Counter(state.failures)
                    failed = tuple(f"{r} ({n}x)" for r, n in sorted(new.items()) if n > 0)
                    if previous is None and not (topology.tiers or topology.replicasets):
                        reasons = ", ".join(failed) or "nothing read"
                        raise LiveDemoError(
                            f"cannot read the cluster: {reasons}"
                            + (f"; {state.last_failure}" if state.last_failure else "")
                        )
                    snapshot = _Snapshot.of(topology, keys)
                    yield LivePoll(
                        number=number,
                        total=self.total,
                        elapsed=at,
                        complete=complete,
                        server=state.server,
                        failures=failed,
                        last_failure=state.last_failure if failed else None,
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
                    previous = snapshot
            finally:

                async def stop() -> None:
                    await source.aclose()
                    for task in running:
                        await task

                runner.run(stop())

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
