"""shardline.metrics: a real prometheus_client registry scraped (``generate_latest``) after a
scripted run, and the numbers it exposes checked against what the run did; the map counters
behind it (``Topology.map_stats``); the extra's absence reported as ``MissingExtra``."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

import shardline
from shardline import (
    BucketEvent,
    DeadlineExceeded,
    InstanceEvent,
    ReplicasetEvent,
    RoundRobinLoadBalancer,
    Topology,
    WorkerProxy,
)
from shardline._histogram import DURATION_BUCKETS, Histogram
from shardline.discovery import InProcessDiscovery
from shardline.metrics import ShardlineCollector, register
from shardline.picodata import ClientStats, PoolStats, connect
from shardline.registration import KeeperStats, MemoryRecordStore, RegistrationKeeper
from shardline.topology.sources import FailureReason, NotificationSource, PollingSource
from support.fakes import Harness, Stream
from support.forwarded_cluster import cluster
from support.paths import ROOT
from support.pg_server import PgServer
from support.picodata_catalog import Catalog, name_uuid
from support.polling import run_polled, seed_tier, started
from support.prometheus import scrape
from support.replicasets import rs_uuid

CAUSES = (
    "replicaset-deleted",
    "replicaset-joined",
    "replicaset-moved",
    "bucket-overlap",
    "topology-cleared",
)


def member(topology: Topology, n: int, tier: str = "default") -> None:
    """Replicaset n of ``tier`` with one online master."""
    master = f"00000000-0000-0000-0001-{n:012x}"
    topology.apply(ReplicasetEvent("replace", rs_uuid(n), tier=tier, current_master_uuid=master))
    topology.apply(InstanceEvent("replace", master, rs_uuid(n), current_state="Online"))


def test_a_scripted_topology_run_is_scraped_as_it_happened() -> None:
    start = time.time()
    topology = Topology()
    topology.apply_tiers({"default": 3000, "other": 10})
    registry = CollectorRegistry()
    register(registry, topology=topology)
    member(topology, 1)  # new to an empty map: nothing removed, no clear counted
    topology.apply(BucketEvent("default", 1, 1500, rs_uuid(1)))
    member(topology, 2)  # joins the tier holding ranges: a clear
    topology.apply(BucketEvent("default", 1, 1500, rs_uuid(1)))
    topology.apply(BucketEvent("default", 1000, 3000, rs_uuid(2)))  # overlaps: a clear
    before_empty = time.time()
    topology.apply(ReplicasetEvent("delete", rs_uuid(1)))  # deleted: a clear, the map empty
    after_empty = time.time()
    topology.apply(ReplicasetEvent("delete", rs_uuid(2)))  # the map holds nothing: no clear

    samples = scrape(registry)
    default = (("tier", "default"),)
    assert samples["shardline_bucket_map_epoch", default] == topology.epoch("default")
    assert samples["shardline_bucket_map_ranges", default] == 0
    counted = {
        cause: samples["shardline_bucket_map_clears_total", (("cause", cause), *default)]
        for cause in CAUSES
    }
    assert counted == {
        "replicaset-deleted": 1,
        "replicaset-joined": 1,
        "replicaset-moved": 0,
        "bucket-overlap": 1,
        "topology-cleared": 0,
    }
    assert all(
        samples["shardline_bucket_map_clears_total", (("cause", cause), ("tier", "other"))] == 0
        for cause in CAUSES
    )
    assert samples["shardline_topology_membership_version", ()] == topology.membership_version
    assert samples["shardline_topology_instances", ()] == 2
    assert samples["shardline_topology_replicasets", ()] == 0
    # the map was left empty by the delete of replicaset 1, and still is
    stats = topology.map_stats("default")
    assert stats.empty_since is not None
    assert before_empty <= stats.empty_since <= after_empty
    first = samples["shardline_bucket_map_empty_seconds_total", default]
    assert first <= time.time() - stats.empty_since
    member(topology, 3)
    before_fill = time.time()
    topology.apply(BucketEvent("default", 1, 3000, rs_uuid(3)))
    filled = topology.map_stats("default")
    assert filled.empty_since is None
    assert filled.ranges == 1
    # the period closed when the range arrived (the map was also empty between replicaset 2's
    # join and the next event, a period counted too)
    assert before_fill - stats.empty_since <= filled.empty_seconds <= time.time() - start
    assert scrape(registry)["shardline_bucket_map_empty_seconds_total", default] == (
        filled.empty_seconds
    )
    assert first <= filled.empty_seconds


def test_moving_a_replicaset_and_clearing_the_topology_are_counted_on_each_map() -> None:
    topology = Topology()
    topology.apply_tiers({"a": 100, "b": 100})
    member(topology, 1, "a")
    member(topology, 2, "b")
    topology.apply(BucketEvent("a", 1, 100, rs_uuid(1)))
    topology.apply(BucketEvent("b", 1, 100, rs_uuid(2)))
    member(topology, 1, "b")  # moves from a to b: both maps cleared
    assert topology.map_stats("a").clears["replicaset-moved"] == 1
    assert topology.map_stats("b").clears["replicaset-moved"] == 1
    topology.apply(BucketEvent("b", 1, 100, rs_uuid(2)))
    topology.clear()
    assert topology.map_stats("a").clears["topology-cleared"] == 0  # already empty
    assert topology.map_stats("b").clears["topology-cleared"] == 1


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["replace", "delete"]),
            st.integers(1, 20),
            st.integers(0, 5),
            st.integers(1, 3),
        ),
        max_size=30,
    )
)
def test_clears_match_a_model_of_which_events_empty_a_map(
    events: list[tuple[str, int, int, int]],
) -> None:
    # Bucket events only: a replace or delete of [start, start + length] clears the map when
    # it overlaps anything but an identical range; the model keeps the ranges, counts the
    # clears that removed any, and knows when the map is empty after having held ranges.
    topology = Topology()
    topology.apply_tiers({"t": 30})
    for n in (1, 2, 3):
        member(topology, n, "t")
    model: list[tuple[int, int, int]] = []
    clears = 0
    held = False  # whether the map ever held a range
    for op, start, length, owner in events:
        end = start + length
        hits = [r for r in model if r[0] <= end and start <= r[1]]
        same = hits == [(start, end, owner)]
        if op == "replace":
            if hits and not same:
                clears += 1
                model = []
            if not same:
                model.append((start, end, owner))
        elif same:
            model.remove((start, end, owner))
        elif hits:
            clears += 1
            model = []
        topology.apply(BucketEvent("t", start, end, rs_uuid(owner), op=op))
        held = held or bool(model)
    stats = topology.map_stats("t")
    assert stats.clears["bucket-overlap"] == clears
    assert stats.ranges == len(model)
    assert (stats.empty_since is not None) == (held and not model)


async def test_a_polling_source_is_scraped_with_its_state(catalog: Catalog) -> None:
    seed_tier(catalog, 2)

    async def scenario(topology: Topology, source: PollingSource) -> None:
        loop = asyncio.get_running_loop()
        began = loop.time()  # the source times its reads on the loop's clock
        registry = CollectorRegistry()
        registry.register(ShardlineCollector(topology=topology, sources={"catalog": source}))
        await started(source)
        assert await source.refresh()
        with catalog.transaction():
            catalog.expel_replicaset("r2")
            catalog.rebalance("default")
        assert await source.refresh()
        state = source.state
        samples = scrape(registry)
        name = (("source", "catalog"),)
        assert samples["shardline_source_connected", name] == 1
        assert samples["shardline_source_refreshes_total", name] == state.refreshes >= 2
        assert samples["shardline_source_attempts_total", name] == state.attempts
        assert samples["shardline_source_events_applied_total", name] == state.events_applied
        assert samples["shardline_source_events_emitted_total", name] == state.events_emitted
        assert samples["shardline_source_connects_total", name] == 1
        read = samples["shardline_source_read_seconds_sum", name]
        assert 0 < read == state.read_durations.sum <= loop.time() - began
        assert samples["shardline_source_read_seconds_count", name] == state.attempts
        assert samples["shardline_source_last_refresh_timestamp_seconds", name] == (
            state.last_refresh
        )
        assert samples["shardline_source_failures_total", (("reason", "connect"), *name)] == 0
        # the expelled replicaset cleared the map, the same poll's snapshot refilled it
        default = (("tier", "default"),)
        assert (
            samples[
                "shardline_bucket_map_clears_total", (("cause", "replicaset-deleted"), *default)
            ]
            == 1
        )
        assert samples["shardline_bucket_map_ranges", default] == 1
        assert samples["shardline_bucket_map_epoch", default] == topology.epoch("default")

    await run_polled(catalog.dsn, scenario)


def test_map_stats_of_an_unknown_tier_raises_unknown_tier() -> None:
    topology = Topology()
    topology.apply_tiers({"a": 10})
    with pytest.raises(shardline.UnknownTier, match="'nope'"):
        topology.map_stats("nope")


def test_without_prometheus_client_the_module_raises_missing_extra(
    child_python: Callable[[str], str],
) -> None:
    probe = (
        "import sys\nsys.modules['prometheus_client'] = None\n"
        "from shardline import MissingExtra\n"
        "try:\n    import shardline.metrics\n"
        "except MissingExtra as error:\n    print(error.extra, error.name)\n"
    )
    assert child_python(probe).split() == ["metrics", "prometheus_client"]


def test_importing_shardline_does_not_load_prometheus_client(
    child_python: Callable[[str], str],
) -> None:
    probe = "import sys, shardline; print('prometheus_client' in sys.modules)"
    assert child_python(probe) == "False"


async def test_a_picodata_clients_routing_and_pools_are_scraped(pg: PgServer) -> None:
    async def main() -> None:
        async with cluster(pg) as c, connect(c.url, tier="default") as db:
            registry = CollectorRegistry()
            register(registry, client=db)  # the client's topology comes with it
            keys = [key for key in range(40) if c.master_of(key) == "r2_1"][:3]
            for key in keys:
                assert await db.fetchval("SELECT $1::bigint", key, key=key) == key
            await db.fetchval("SELECT 1")
            samples = scrape(registry)
            stats = db.stats()
            assert samples["shardline_picodata_queries_total", (("kind", "keyed"),)] == 3
            assert samples["shardline_picodata_queries_total", (("kind", "unkeyed"),)] == 1
            assert samples["shardline_picodata_polls_total", ()] == stats.polls >= 1
            assert samples["shardline_picodata_retries_total", ()] == 0
            with pytest.raises(DeadlineExceeded):
                await db.fetchval("SELECT pg_sleep(10)", key=keys[0], timeout=0.05)
            samples, stats = scrape(registry), db.stats()
            assert samples["shardline_picodata_deadlines_total", ()] == 1
            assert samples["shardline_picodata_ejections_total", ()] == 0
            assert samples["shardline_picodata_readmissions_total", ()] == 0
            assert samples["shardline_picodata_ejected_instances", ()] == 0
            r2_1 = (("instance", name_uuid("r2_1")),)
            assert (
                samples["shardline_picodata_pool_queries_total", r2_1]
                == (stats.pools[name_uuid("r2_1")].queries)
                >= 3
            )
            assert (
                samples["shardline_picodata_pool_size", r2_1] == stats.pools[name_uuid("r2_1")].size
            )
            assert samples["shardline_picodata_pool_down", r2_1] == 0
            default = (("tier", "default"),)
            assert samples["shardline_bucket_map_epoch", default] == db.topology.epoch("default")
            assert samples["shardline_bucket_map_ranges", default] == len(
                db.topology.ranges("default")
            )

    await asyncio.wait_for(main(), 60)


async def test_a_proxys_pool_size_is_scraped() -> None:
    async def main() -> list[float]:
        harness = Harness()
        proxy = harness.proxy(1, 2, 3, loadbalancer=RoundRobinLoadBalancer())
        registry = CollectorRegistry()
        register(registry, proxies={"workers": proxy})
        sizes = [scrape(registry)["shardline_proxy_workers", (("proxy", "workers"),)]]
        async with proxy:
            sizes.append(scrape(registry)["shardline_proxy_workers", (("proxy", "workers"),)])
        return sizes

    assert await main() == [0, 3]


DOC = ROOT / "docs" / "metrics.md"


class _StubClient:
    """What the collector reads of a Picodata client: its topology and ``stats()``."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology

    def stats(self) -> ClientStats:
        pool = PoolStats("u", "h:1", 8, 1, 1, 0, 0, 0, 1, 0, 0, False, 3)
        return ClientStats(
            routed={"keyed": 3, "read-only": 0, "unkeyed": 0},
            misses={"no range": 1},
            fallbacks={"no range": 1},
            retries=0,
            unavailable=0,
            pools={"u": pool},
            polls=1,
            poll_failures={},
            last_poll=1.0,
            epochs={},
            last_poll_failure=None,
            poll_durations=Histogram(DURATION_BUCKETS).snapshot(),
            deadlines=0,
            ejections=0,
            readmissions=0,
            ejected=0,
        )


async def _never_called() -> Any:
    raise AssertionError("not called")


def test_the_metric_table_lists_every_metric_with_its_type_and_labels() -> None:
    rows = re.findall(
        r"^\| `(shardline_\w+)` \| (\w+) \|([^|]*)\|", DOC.read_text(encoding="utf-8"), re.M
    )
    documented = {
        name: (kind, tuple(re.findall(r"`(\w+)`", labels))) for name, kind, labels in rows
    }
    topology = Topology()
    topology.apply_tiers({"default": 10})
    source = PollingSource("postgresql://127.0.0.1:1/nowhere")
    source._recorder.refreshed()  # a last refresh, so that its timestamp has a sample
    source._recorder.failure(FailureReason.BUCKETS, "rebalancing", tier="default")
    pushed = NotificationSource("postgresql://127.0.0.1:1/nowhere")
    pushed._counters.last_event = 1.0  # an event handed out, so that its timestamp has a sample
    proxy = WorkerProxy(discovery=Stream(), connect=Harness().connect)
    keeper = RegistrationKeeper(
        "svc",
        None,
        MemoryRecordStore(),
        register=_never_called,
        probe=_never_called,
        is_ready=lambda: False,
    )
    collector = ShardlineCollector(
        topology=topology,
        sources={"s": source, "n": pushed},
        client=_StubClient(topology),  # type: ignore[arg-type]
        proxies={"p": proxy},
        keepers={"k": keeper},
        discoveries={"d": InProcessDiscovery("metric-table").subscribe()},
    )
    exposed = {}
    for family in collector.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        # a histogram's `le` belongs to the exposition, not to the labels the table documents
        labels = {label for sample in family.samples for label in sample.labels} - {"le"}
        exposed[name] = (family.type, labels)
    assert set(documented) == set(exposed)
    for name, (kind, labels) in exposed.items():
        assert (documented[name][0], set(documented[name][1])) == (kind, labels), name


def test_the_metrics_docs_example_prints_what_it_says(child_python: Callable[[str], str]) -> None:
    text = DOC.read_text(encoding="utf-8")
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    said = code.split("print(", 1)[1].split("\n# ", 1)[1].strip()
    assert child_python(code) == said


async def test_a_keepers_counters_are_scraped_by_result() -> None:
    async def main() -> tuple[dict[tuple[str, tuple[tuple[str, str], ...]], float], KeeperStats]:
        async def register_here() -> str:
            return "127.0.0.1:1"

        async def not_served() -> bool:
            return False

        keeper = RegistrationKeeper(
            "svc",
            "me",
            MemoryRecordStore(),
            register=register_here,
            probe=not_served,
            is_ready=lambda: True,
            probe_interval=1e-9,  # due at the next tick
            tick=1e-9,
        )
        registry = CollectorRegistry()
        register(registry, keepers={"svc": keeper})
        await keeper.start()
        while keeper.stats.probe_failures == 0:
            await asyncio.sleep(0)  # the keeper's ticks run between these turns
        await keeper.deregister()
        return scrape(registry), keeper.stats

    samples, stats = await asyncio.wait_for(main(), 10)
    name = ("keeper", "svc")

    def counted(metric: str, result: str) -> float:
        return samples[f"shardline_keeper_{metric}_total", (name, ("result", result))]

    assert samples["shardline_keeper_registered", (name,)] == 0  # deregistered
    assert counted("registrations", "ok") == stats.registrations >= 1
    assert counted("registrations", "failed") == stats.registration_failures == 0
    assert counted("probes", "failed") == stats.probe_failures >= 1
    assert counted("probes", "served") == stats.probes == 0
    assert counted("reports", "ok") == stats.reports >= 1
    assert counted("reports", "failed") == stats.report_failures == 0


def test_a_second_collector_with_the_same_names_is_refused_by_the_registry() -> None:
    topology = Topology()
    topology.apply_tiers({"a": 10})
    registry = CollectorRegistry()
    collector = register(registry, topology=topology)
    with pytest.raises(ValueError, match="shardline_bucket_map_epoch"):
        register(registry, topology=topology)
    registry.unregister(collector)
    register(registry, topology=topology)


def test_map_stats_read_as_python_writes_its_values() -> None:
    topology = Topology()
    topology.apply_tiers({"a": 10})
    assert repr(topology.map_stats("a")) == (
        "MapStats(tier='a', epoch=0, ranges=0, clears={'replicaset-deleted': 0,"
        " 'replicaset-joined': 0, 'replicaset-moved': 0, 'bucket-overlap': 0,"
        " 'topology-cleared': 0}, empty_seconds=0.0, empty_since=None)"
    )
    topology.apply(ReplicasetEvent("replace", rs_uuid(1), tier="a"))
    topology.apply(BucketEvent("a", 1, 10, rs_uuid(1)))
    topology.apply(ReplicasetEvent("delete", rs_uuid(1)))
    stats = topology.map_stats("a")
    assert stats.empty_since is not None
    assert f"empty_since={stats.empty_since!r})" in repr(stats)
