"""How long a source's reads and applies take, as fixed-bucket histograms
(``state.read_durations``, ``state.apply_durations``; ``shardline_source_read_seconds``,
``shardline_source_apply_seconds``), and the WARNING about a bucket map left empty that a
source's ``run`` logs; down to a real PostgreSQL catalog polled and scraped."""

from __future__ import annotations

import asyncio
import logging
import re
from bisect import bisect_left

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from shardline import BucketEvent, InstanceEvent, ReplicasetEvent, Topology
from shardline._histogram import DURATION_BUCKETS, LAG_BUCKETS, Histogram
from shardline.metrics import register
from shardline.picodata import connect
from shardline.topology.sources import EMPTY_MAP_WARNING_AFTER, PollingSource
from shardline.topology.sources.empty_maps import EmptyMapWatch
from shardline.topology.sources.state import REPEAT_WARNING_INTERVAL
from support.forwarded_cluster import cluster
from support.notify_cluster import NotifyCluster, caught_up, install
from support.pg_server import PgServer
from support.picodata_catalog import Catalog
from support.polling import seed_tier
from support.prometheus import scrape
from support.waiting import until

LOGGER = "shardline.topology.sources"


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == LOGGER]


# the histogram


@given(
    st.sampled_from([DURATION_BUCKETS, LAG_BUCKETS, (1.0,), (-1.0, 0.0, 2.5)]),
    st.lists(st.floats(-10, 1000, allow_nan=False), max_size=50),
)
def test_a_histogram_counts_as_a_sorted_list_would(
    bounds: tuple[float, ...], values: list[float]
) -> None:
    histogram = Histogram(bounds)
    for value in values:
        histogram.observe(value)
    snapshot = histogram.snapshot()
    assert snapshot.count == len(values)
    assert snapshot.sum == pytest.approx(sum(values))
    ordered = sorted(values)
    expected = [
        (repr(bound), bisect_left(ordered, bound + 0.0) + ordered.count(bound)) for bound in bounds
    ]
    assert snapshot.cumulative() == [*expected, ("+Inf", len(values))]


@pytest.mark.parametrize("bounds", [(), (1.0, 1.0), (2.0, 1.0), (1.0, float("inf"))])
def test_a_histogram_refuses_bounds_that_are_not_increasing_and_finite(
    bounds: tuple[float, ...],
) -> None:
    with pytest.raises(ValueError, match="histogram bounds"):
        Histogram(bounds)


# the empty-map warning, on a clock the test sets


def filled(topology: Topology, tier: str = "default") -> None:
    """A replicaset of ``tier`` (one per tier) owning buckets 1..5."""
    n = sorted(topology.tiers).index(tier) + 1
    master, replicaset = f"00000000-0000-0000-0001-{n:012x}", f"00000000-0000-0000-0002-{n:012x}"
    topology.apply(ReplicasetEvent("replace", replicaset, tier=tier, current_master_uuid=master))
    topology.apply(InstanceEvent("replace", master, replicaset, current_state="Online"))
    topology.apply(BucketEvent(tier, 1, 5, replicaset))


def cleared(topology: Topology, tier: str = "default") -> float:
    """Clears the tier's map (an overlapping range); the time it was left empty."""
    (start, end, owner), *_ = topology.ranges(tier)
    topology.apply(BucketEvent(tier, start, end + 1, owner, op="delete"))
    since = topology.map_stats(tier).empty_since
    assert since is not None
    return since


def test_a_map_left_empty_is_warned_about_once_then_at_most_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    topology = Topology()
    topology.apply_tiers({"default": 10, "other": 10})
    filled(topology)
    filled(topology, "other")
    watch = EmptyMapWatch("src", 30.0)
    caplog.set_level(logging.INFO, logger=LOGGER)
    since = cleared(topology)
    for at in (0.0, 29.9, 30.0, 31.0, 30.0 + REPEAT_WARNING_INTERVAL - 1):
        watch.check(topology, since + at)
    warning = (
        "src: the map of tier 'default' has been empty for {} s (cleared and not refilled): "
        "keyed routes of the tier miss"
    )
    assert lines(caplog) == [(logging.WARNING, warning.format("30.0"))]
    watch.check(topology, since + 30.0 + REPEAT_WARNING_INTERVAL)
    assert lines(caplog)[1:] == [
        (logging.WARNING, warning.format(f"{30 + REPEAT_WARNING_INTERVAL:.1f}"))
    ]
    caplog.clear()
    filled(topology)  # refilled: said once, and a later clear starts a new period
    watch.check(topology, since + 200.0)
    watch.check(topology, since + 201.0)
    assert lines(caplog) == [(logging.INFO, "src: the map of tier 'default' holds ranges again")]
    caplog.clear()
    again = cleared(topology)
    watch.check(topology, again + 29.0)
    watch.check(topology, again + 30.5)
    assert lines(caplog) == [(logging.WARNING, warning.format("30.5"))]


def test_a_map_that_never_held_ranges_is_not_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    topology = Topology()
    topology.apply_tiers({"default": 10, "fresh": 10, "arbiter": 0})
    filled(topology)
    watch = EmptyMapWatch("src", 1.0)
    caplog.set_level(logging.INFO, logger=LOGGER)
    since = cleared(topology)
    watch.check(topology, since + 5.0)
    assert [line.split(":")[1] for _, line in lines(caplog)] == [
        " the map of tier 'default' has been empty for 5.0 s (cleared and not refilled)"
    ]


@pytest.mark.parametrize("after", [0, -1.0, float("nan"), float("inf"), "30"])
async def test_run_refuses_a_threshold_that_is_not_a_positive_time(after: object) -> None:
    source = PollingSource("postgresql://127.0.0.1:1/nowhere")
    with pytest.raises(ValueError, match="warn_empty_after"):
        await source.run(Topology(), warn_empty_after=after)  # type: ignore[arg-type]


def test_the_default_threshold_is_half_a_minute() -> None:
    assert EMPTY_MAP_WARNING_AFTER == 30.0


# a polled catalog: durations scraped, an empty map warned about while the source runs


async def test_a_polled_catalog_is_timed_and_its_empty_map_warned_about(
    catalog: Catalog, caplog: pytest.LogCaptureFixture
) -> None:
    seed_tier(catalog, 2)
    caplog.set_level(logging.INFO, logger=LOGGER)

    topology = Topology()
    source = PollingSource(catalog.dsn, interval=60.0)
    registry = CollectorRegistry()
    register(registry, sources={"catalog": source})
    task = asyncio.create_task(source.run(topology, warn_empty_after=0.2))
    try:
        await until(lambda: source.state.attempts > 0)
        assert await source.refresh()
        assert topology.map_stats("default").ranges == 2
        with catalog.transaction():  # r2 leaves: the map is cleared; its buckets fail
            catalog.expel_replicaset("r2")
            catalog.fail_buckets("default")
        assert not await source.refresh()
        assert topology.map_stats("default").empty_since is not None
        await until(
            lambda: any(
                level == logging.WARNING and "has been empty" in line
                for level, line in lines(caplog)
            )
        )
        with catalog.transaction():
            catalog.heal_buckets("default")
            catalog.rebalance("default")
        assert await source.refresh()
        await until(lambda: any("holds ranges again" in line for _, line in lines(caplog)))
        state = source.state
        samples = scrape(registry)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await source.aclose()
    name = (("source", "catalog"),)
    assert state.read_durations.count == state.attempts >= 4
    assert samples["shardline_source_read_seconds_count", name] == state.attempts
    assert samples["shardline_source_read_seconds_sum", name] == pytest.approx(
        state.read_durations.sum
    )
    assert (
        samples["shardline_source_read_seconds_bucket", (("le", "+Inf"), *name)] == state.attempts
    )
    # each change handed out was applied and timed (none refused here)
    assert state.apply_durations.count == state.events_emitted > 0
    assert samples["shardline_source_apply_seconds_count", name] == state.events_emitted
    assert 0 < samples["shardline_source_apply_seconds_sum", name] < 10
    warnings = [line for level, line in lines(caplog) if level == logging.WARNING]
    assert sum("has been empty" in line for line in warnings) == 1


# a notification stream: the map cleared by a pushed event, then nothing more arrives


@pytest.fixture
def notify_dsn(pg: PgServer) -> str:
    dsn = pg.create_database()
    install(dsn)
    return dsn


async def test_a_map_cleared_by_a_notification_is_warned_about_while_the_stream_is_quiet(
    notify_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    r1, r2 = "00000000-0000-0000-0002-000000000001", "00000000-0000-0000-0002-000000000002"
    m1, m2 = "00000000-0000-0000-0001-000000000001", "00000000-0000-0000-0001-000000000002"
    caplog.set_level(logging.INFO, logger=LOGGER)
    with NotifyCluster(notify_dsn) as cluster:
        cluster.publish(
            ReplicasetEvent("replace", r1, tier="default", current_master_uuid=m1),
            InstanceEvent("replace", m1, replicaset_uuid=r1, current_state="Online"),
            ReplicasetEvent("replace", r2, tier="default", current_master_uuid=m2),
            InstanceEvent("replace", m2, replicaset_uuid=r2, current_state="Online"),
            BucketEvent("default", 1, 1500, r1),
            BucketEvent("default", 1501, 3000, r2),
        )

        topology = Topology()
        source = cluster.source()
        registry = CollectorRegistry()
        register(registry, sources={"pushed": source})
        task = asyncio.create_task(source.run(topology, warn_empty_after=0.2))
        try:
            await caught_up(source, cluster.position)
            assert topology.map_stats("default").ranges == 2
            cluster.publish(ReplicasetEvent("delete", r2))  # clears the map; then quiet
            await caught_up(source, cluster.position)
            assert topology.map_stats("default").empty_since is not None
            await until(lambda: any("has been empty" in line for _, line in lines(caplog)))
            cluster.publish(BucketEvent("default", 1, 3000, r1))
            await caught_up(source, cluster.position)
            await until(lambda: any("holds ranges again" in line for _, line in lines(caplog)))
            state, samples = source.state, scrape(registry)
        finally:
            await source.aclose()
            await asyncio.wait_for(task, 5)
        name = (("source", "pushed"),)
        # one session: its connect and snapshot read once; every change applied was timed
        assert state.read_durations.count == state.attempts == 1
        assert samples["shardline_source_read_seconds_count", name] == 1
        assert state.apply_durations.count == state.events_emitted == 3
        assert samples["shardline_source_apply_seconds_count", name] == 3
        deliveries = source.deliveries
        notified = "shardline_source_notifications_total"
        assert samples[notified, (("outcome", "handed-out"), *name)] == 2
        assert samples[notified, (("outcome", "duplicate"), *name)] == deliveries.duplicates
        assert samples["shardline_source_notification_snapshots_total", name] == 1
        assert samples["shardline_source_last_notification_timestamp_seconds", name] == (
            deliveries.last_event
        )
    warnings = [line for level, line in lines(caplog) if level == logging.WARNING]
    assert len(warnings) == 1
    assert re.fullmatch(
        r"NotificationSource\(.*\): the map of tier 'default' has been empty for \d+\.\d s "
        r"\(cleared and not refilled\): keyed routes of the tier miss",
        warnings[0],
    )


@pytest.mark.async_timeout(60)
async def test_a_picodata_clients_polls_are_timed(pg: PgServer) -> None:
    async with cluster(pg) as c, connect(c.url, tier="default") as db:
        registry = CollectorRegistry()
        register(registry, client=db)
        await db.refresh()
        stats, samples = db.stats(), scrape(registry)
        assert stats.poll_durations.count == stats.polls >= 2
        assert samples["shardline_picodata_poll_seconds_count", ()] == stats.polls
        assert samples["shardline_picodata_poll_seconds_bucket", (("le", "+Inf"),)] == (stats.polls)
        assert 0 < samples["shardline_picodata_poll_seconds_sum", ()] < 60
