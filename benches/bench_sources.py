"""Topology sources over a real PostgreSQL (issue 6): poll cost and notification apply rate.

Both groups start one PostgreSQL (``tests/support/pg_server.py``; a server that cannot start fails
the module, it never skips) and time each thing beside its floor *in the same round*, so both see
the same moment of a shared machine: ``extra_info`` holds each one's median, minimum and
p90 per round (``ours_*``, ``floor_*``) and the median over the rounds of ours / floor
(``ratio``, with its quartiles ``ratio_q1_q3``). The round time pytest-benchmark reports is the
sum of the two.

``poll {N} ranges/tier, {unchanged|changed}``: one ``PollingSource.refresh()`` under
``source.run(topology)`` (``interval`` of a minute, so it polls only when asked), against the
Picodata-like catalog of ``tests/support/picodata_catalog.py``: 2 tiers of 3,000 buckets, 8
replicasets per tier with a master and a replica each (32 instances, 64 peer addresses), each
tier's buckets cut into ``N`` equal ranges (1, 16 or 256) owned in turn by its replicasets.
*Unchanged*: the catalog stays as it is, so the poll reads it and hands out nothing new (the
topology's ``events_applied`` must not move). *Changed*: before each round (untimed) one
committed transaction switches the master of one replicaset per tier and moves every range of
both tiers to the next replicaset, so each poll hands out 2 replicaset events and 2 new bucket
maps, and the topology must then hold exactly the maps just written. The floor is the bare
reads: the same four SELECTs and ``SELECT _pico_bucket($1) AS buckets`` per tier, on the
source's own asyncpg connection (so with the statements it has prepared and cached), rows
fetched, nothing converted or applied. The floor runs first in even rounds and second in odd
ones. Before timing and after it, the topology must equal ``Catalog.expected()``.

``notify burst of {N}``: ``NotificationSource`` under ``run(topology)``, subscribed on a channel
of ``tests/support/notify_cluster.py``. A round sends ``N`` event documents (a third each: a
replicaset's master switch, an instance's new address, a bucket range moved to another
replicaset) in one ``SELECT pg_notify(channel, d) FROM unnest(documents)`` statement on a
connection of its own, and is timed from just before that statement to the moment
``source.position`` reaches the burst's last raft position (a coroutine that yields to the
event loop in a loop, ``asyncio.sleep(0)``, watches it: the source updates its position and
``run`` applies the event in one step of its task). The documents were made and the cluster's
state (reference topology, stored snapshot) advanced before the round, untimed, with
``NotifyCluster.publish(..., notify=False)``. The floor is the same documents parsed with
``parse_event_document`` and applied with ``Topology.apply`` to a topology in the same state,
in process, no transport. After every round the source's topology, the floor's and the
cluster's reference must be equal, and the source must have handed out exactly ``N`` new
events with no duplicate, stale or skipped one and no second snapshot. ``extra_info`` has
events/s of both (``ours_events_per_s``, ``floor_events_per_s``, from the medians).
"""

from __future__ import annotations

import asyncio
import itertools
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pytest_benchmark")

import psycopg

from shardline import BucketEvent, InstanceEvent, ReplicasetEvent, Topology
from shardline.topology.sources import PollingSource
from shardline.topology.sources.membership import (
    ADDRESSES_OF_TYPE_QUERY,
    INSTANCES_QUERY,
    REPLICASETS_QUERY,
    TIERS_QUERY,
)
from shardline.topology.sources.notification_documents import parse_event_document
from shardline.topology.sources.polling import BUCKETS_QUERY

# The test suite's helpers, used as they are (a missing PostgreSQL raises PgUnavailable).
sys.path.append(str(Path(__file__).resolve().parent.parent / "tests"))
from support.notify_cluster import NotifyCluster, install, view
from support.notify_documents import Event
from support.pg_server import PgServer
from support.picodata_catalog import Catalog, topology_state

TIERS = ("default", "storage")
BUCKETS = 3000
REPLICASETS = 8  # per tier, a master and a replica each
RANGES = [1, 16, 256]
POLL_ROUNDS = 300
POLL_WARMUP = 20
BURSTS = [100, 1000]
BURST_ROUNDS = {100: 150, 1000: 40}
BURST_WARMUP = 5
WAIT = 10.0  # seconds a refresh or a burst may take before the benchmark fails
SEED = 20_251_202


@pytest.fixture(scope="module")
def pg() -> Iterator[PgServer]:
    server = PgServer()  # raises PgUnavailable, with the reason, if PostgreSQL cannot run
    try:
        server.start()
        yield server
    finally:
        server.close()


def summarize(benchmark: Any, ours: Sequence[int], floor: Sequence[int], **info: Any) -> None:
    """Per-way median, minimum and p90 of the timed rounds (ns), and the median ratio."""
    ratios = [o / f for o, f in zip(ours, floor, strict=True)]

    def p90(values: Sequence[int]) -> float:
        return statistics.quantiles(values, n=10, method="inclusive")[8]

    benchmark.extra_info.update(
        rounds_timed=len(ours),
        ours_ns=statistics.median(ours),
        ours_min_ns=min(ours),
        ours_p90_ns=p90(ours),
        floor_ns=statistics.median(floor),
        floor_min_ns=min(floor),
        floor_p90_ns=p90(floor),
        ratio=round(statistics.median(ratios), 3),
        ratio_q1_q3=[round(q, 3) for q in statistics.quantiles(ratios, n=4)[::2]],
        **info,
    )


def interleave(
    ours: Callable[[], Any], floor: Callable[[], Any]
) -> tuple[Callable[[], None], list[int], list[int]]:
    """A round timing ``floor`` and ``ours`` back to back, floor first in even rounds."""
    ours_ns: list[int] = []
    floor_ns: list[int] = []
    flip = itertools.cycle([True, False])
    clock = time.perf_counter_ns

    def timed(fn: Callable[[], Any], into: list[int]) -> None:
        t0 = clock()
        fn()
        into.append(clock() - t0)

    def round_() -> None:
        if next(flip):
            timed(floor, floor_ns)
            timed(ours, ours_ns)
        else:
            timed(ours, ours_ns)
            timed(floor, floor_ns)

    return round_, ours_ns, floor_ns


# --- poll cost ---------------------------------------------------------------------------------


def ranges_of(owners: Sequence[str], n_ranges: int, shift: int) -> list[Any]:
    """``n_ranges`` equal ranges of the tier, owned in turn by ``owners`` (shifted by one in
    the changed map); adjacent ranges always have different owners."""
    bounds = [BUCKETS * k // n_ranges for k in range(n_ranges + 1)]
    return [
        (bounds[k] + 1, bounds[k + 1], owners[(k + shift) % len(owners)]) for k in range(n_ranges)
    ]


class PolledCatalog:
    """The catalog, a ``PollingSource`` running into a topology, and the two maps it flips."""

    def __init__(self, pg: PgServer, n_ranges: int) -> None:
        self.catalog = Catalog(pg.create_schema())
        self.n_ranges = n_ranges
        self.maps: list[dict[str, list[Any]]] = [{}, {}]
        self.step = 0
        with self.catalog.transaction():
            for tier in TIERS:
                self.catalog.add_tier(tier, BUCKETS)
                owners = [
                    self.catalog.add_replicaset(f"{tier}_r{k}", tier, instances=2)
                    for k in range(REPLICASETS)
                ]
                for shift in (0, 1):
                    self.maps[shift][tier] = ranges_of(owners, n_ranges, shift)
                self.catalog.set_buckets(tier, self.maps[0][tier])
        self.loop = asyncio.new_event_loop()
        self.topology = Topology()
        self.source = PollingSource(self.catalog.dsn, interval=60.0, timeout=WAIT)
        self.task = self.loop.create_task(self.source.run(self.topology))
        assert self.refresh(), self.source.state
        self.check_catalog()

    def refresh(self) -> bool:
        ok: bool = self.loop.run_until_complete(self.source.refresh())
        return ok

    def check_catalog(self) -> None:
        expected = self.catalog.expected()
        assert topology_state(self.topology) == expected
        assert {t: len(r) for t, r in expected.maps.items()} == dict.fromkeys(TIERS, self.n_ranges)

    def change(self) -> None:
        """One committed change: a master switch per tier, every range to the next owner."""
        self.step += 1
        with self.catalog.transaction():
            for tier in TIERS:
                self.catalog.switch_master(f"{tier}_r0", f"{tier}_r0_{1 + self.step % 2}")
                self.catalog.set_buckets(tier, self.maps[self.step % 2][tier])

    def holds_current_maps(self) -> bool:
        return self.topology.bucket_maps == self.maps[self.step % 2]

    def bare_reads(self) -> list[Any]:
        """The poll's SELECTs on the source's own connection, rows fetched, nothing else."""
        connection = self.source._connection  # the source is idle between refreshes
        assert connection is not None
        assert not connection.is_closed()

        async def reads() -> list[Any]:
            fetched = []
            for query, params in (
                (TIERS_QUERY, ()),
                (REPLICASETS_QUERY, ()),
                (INSTANCES_QUERY, ()),
                (ADDRESSES_OF_TYPE_QUERY, ("pgproto",)),
                *((BUCKETS_QUERY, (tier,)) for tier in TIERS),
            ):
                fetched.append(await connection.fetch(query, *params))
            return fetched

        result: list[Any] = self.loop.run_until_complete(reads())
        return result

    def close(self) -> None:
        self.loop.run_until_complete(self.source.aclose())
        self.loop.run_until_complete(asyncio.wait_for(self.task, WAIT))
        self.loop.close()
        self.catalog.close()


@pytest.mark.parametrize("mode", ["unchanged", "changed"])
@pytest.mark.parametrize("n_ranges", RANGES)
def test_poll_cost(benchmark: Any, pg: PgServer, n_ranges: int, mode: str) -> None:
    polled = PolledCatalog(pg, n_ranges)
    try:
        # the floor reads what the source reads
        fetched = polled.bare_reads()
        assert [row[0] for row in fetched[4]] == [polled.catalog.pico_bucket(TIERS[0])]
        assert [row[0] for row in fetched[5]] == [polled.catalog.pico_bucket(TIERS[1])]
        assert len(fetched[2]) == len(TIERS) * REPLICASETS * 2
        applied = [polled.source.state.events_applied]
        refreshes = [polled.source.state.refreshes]
        results: list[bool] = []

        def verify() -> None:
            """The previous round's poll happened and did what it should (untimed)."""
            state = polled.source.state
            assert not state.failures, state.failures
            assert state.refreshes == refreshes[-1] + (1 if results else 0)
            assert all(results), results
            assert polled.holds_current_maps()
            if results and mode == "unchanged":
                assert state.events_applied == applied[-1], "an unchanged poll applied events"
            elif results:
                assert state.events_applied == applied[-1] + 2 * len(TIERS), (
                    state.events_applied - applied[-1]
                )
            applied.append(state.events_applied)
            refreshes.append(state.refreshes)
            results.clear()

        def setup() -> None:
            verify()
            if mode == "changed":
                polled.change()

        round_, ours_ns, floor_ns = interleave(
            lambda: results.append(polled.refresh()), polled.bare_reads
        )
        benchmark.group = f"poll {n_ranges} ranges/tier, {mode}"
        benchmark.pedantic(
            round_, setup=setup, rounds=POLL_ROUNDS, warmup_rounds=POLL_WARMUP, iterations=1
        )
        verify()  # the last round
        polled.check_catalog()
        summarize(
            benchmark,
            ours_ns[-POLL_ROUNDS:],
            floor_ns[-POLL_ROUNDS:],
            impl=f"PollingSource.refresh() vs bare SELECTs, {mode}",
            calls_per_round=1,
        )
    finally:
        polled.close()


# --- notification apply rate -------------------------------------------------------------------


@pytest.fixture(scope="module")
def notify_dsn(pg: PgServer) -> str:
    dsn = pg.create_database()
    install(dsn)
    return dsn


def uuid_of(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


class Burst:
    """A cluster of one tier (8 replicasets, master + replica, 16 ranges), a source running
    into a topology, a floor topology in the same state, and a connection to notify on."""

    def __init__(self, dsn: str, size: int) -> None:
        self.size = size
        self.rng = random.Random(f"{SEED}/burst/{size}")
        self.cluster = NotifyCluster(dsn, tiers={"default": BUCKETS})
        self.replicasets = [uuid_of(self.rng) for _ in range(REPLICASETS)]
        self.instances = {rs: [uuid_of(self.rng), uuid_of(self.rng)] for rs in self.replicasets}
        self.bounds = [BUCKETS * k // 16 for k in range(17)]
        setup: list[Event] = []
        for n, rs in enumerate(self.replicasets):
            master, replica = self.instances[rs]
            setup.append(ReplicasetEvent("replace", rs, tier="default", current_master_uuid=master))
            for k, instance in enumerate((master, replica)):
                setup.append(
                    InstanceEvent(
                        "replace",
                        instance,
                        replicaset_uuid=rs,
                        current_state="Online",
                        address=f"127.0.0.1:{5000 + 2 * n + k}",
                    )
                )
        setup += [
            BucketEvent("default", self.bounds[k] + 1, self.bounds[k + 1], self.replicasets[k % 8])
            for k in range(16)
        ]
        self.cluster.publish(*setup, notify=False)
        self.floor = Topology()
        self.floor.apply_tiers({"default": BUCKETS})
        for event in setup:
            self.floor.apply(event)
        self.loop = asyncio.new_event_loop()
        self.topology = Topology()
        self.source = self.cluster.source()
        self.task = self.loop.create_task(self.source.run(self.topology))
        self.notifier = self.loop.run_until_complete(
            psycopg.AsyncConnection.connect(dsn, autocommit=True)
        )
        self.loop.run_until_complete(self.reach(self.cluster.position))
        assert view(self.topology) == view(self.cluster.reference) == view(self.floor)
        self.documents: list[str] = []
        self.handed_out = self.source.deliveries.handed_out
        self.counter = itertools.count()

    def events(self) -> list[Event]:
        """The next ``size`` events: master switches, new addresses, ranges moved, in turn."""
        made: list[Event] = []
        for _ in range(self.size):
            n = next(self.counter)
            rs = self.replicasets[self.rng.randrange(REPLICASETS)]
            if n % 3 == 0:
                master = self.instances[rs][self.rng.randrange(2)]
                made.append(ReplicasetEvent("replace", rs, current_master_uuid=master))
            elif n % 3 == 1:
                instance = self.instances[rs][self.rng.randrange(2)]
                made.append(InstanceEvent("replace", instance, address=f"10.0.0.1:{n % 60000 + 1}"))
            else:
                k = self.rng.randrange(16)
                made.append(BucketEvent("default", self.bounds[k] + 1, self.bounds[k + 1], rs))
        return made

    async def reach(self, position: tuple[int, int]) -> None:
        loop = self.loop
        deadline = loop.time() + WAIT
        while True:
            at = self.source.position
            if at is not None and (at.term, at.index) >= position:
                return
            if loop.time() > deadline:
                raise AssertionError(f"position {position} not reached (at {at})")
            await asyncio.sleep(0)

    def prepare(self) -> None:
        """The next burst's documents, the cluster's state advanced past them (untimed); and
        the previous burst's checks."""
        self.check()
        self.documents = self.cluster.publish(*self.events(), notify=False)
        assert len(self.documents) == self.size

    def check(self) -> None:
        assert view(self.topology) == view(self.cluster.reference) == view(self.floor)
        stats, state = self.source.deliveries, self.source.state
        assert stats.handed_out == self.handed_out + (self.size if self.documents else 0)
        assert (stats.duplicates, stats.stale, stats.skipped, stats.snapshots) == (0, 0, 0, 1)
        assert not state.failures, state.failures
        self.handed_out = stats.handed_out

    def send(self) -> None:
        async def burst() -> None:
            await self.notifier.execute(
                "SELECT count(pg_notify(%s, d)) FROM unnest(%s::text[]) AS d",
                (self.cluster.channel, self.documents),
            )
            await self.reach(self.cluster.position)

        self.loop.run_until_complete(burst())

    def apply_in_process(self) -> None:
        apply, parse = self.floor.apply, parse_event_document
        for document in self.documents:
            apply(parse(document).event)

    def close(self) -> None:
        self.loop.run_until_complete(self.notifier.close())
        self.loop.run_until_complete(self.source.aclose())
        self.loop.run_until_complete(asyncio.wait_for(self.task, WAIT))
        self.loop.close()
        self.cluster.close()


@pytest.mark.parametrize("size", BURSTS)
def test_notification_apply_rate(benchmark: Any, notify_dsn: str, size: int) -> None:
    burst = Burst(notify_dsn, size)
    try:
        round_, ours_ns, floor_ns = interleave(burst.send, burst.apply_in_process)
        benchmark.group = f"notify burst of {size:,}"
        rounds = BURST_ROUNDS[size]
        benchmark.pedantic(
            round_, setup=burst.prepare, rounds=rounds, warmup_rounds=BURST_WARMUP, iterations=1
        )
        burst.check()
        ours, floor = ours_ns[-rounds:], floor_ns[-rounds:]
        summarize(
            benchmark,
            ours,
            floor,
            impl="NotificationSource NOTIFY → applied vs parse + Topology.apply",
            calls_per_round=size,
            ours_events_per_s=round(size / statistics.median(ours) * 1e9),
            floor_events_per_s=round(size / statistics.median(floor) * 1e9),
        )
    finally:
        burst.close()
