"""The empty-map threshold (``warn_empty_after``) set through ``TopologyDiscovery`` and
``shardline.picodata.connect``, and the INFO line about a tier whose map was never filled after
the source's first complete refresh (its buckets not bootstrapped yet)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from shardline import BucketEvent, InstanceEvent, ReplicasetEvent, Topology
from shardline.discovery.topology import TopologyDiscovery
from shardline.picodata import connect
from shardline.topology.sources import (
    EMPTY_MAP_WARNING_AFTER,
    BucketSnapshot,
    TopologyChange,
    TopologySnapshot,
)
from shardline.topology.sources.empty_maps import EmptyMapWatch
from support.picodata_catalog import Catalog
from support.polling import seed_tier
from support.queued_source import QueuedSource
from support.waiting import until

LOGGER = "shardline.topology.sources"
RS1, RS2 = "00000000-0000-0000-0002-000000000001", "00000000-0000-0000-0002-000000000002"
M1, M2 = "00000000-0000-0000-0001-000000000001", "00000000-0000-0000-0001-000000000002"
BAD_THRESHOLDS = [0, -1.0, float("nan"), float("inf"), "30", True]


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == LOGGER]


class ScriptedSource(QueuedSource):
    """A queued snapshot counts as a complete refresh, as a real source's first read does;
    ``run`` records the threshold it was given."""

    def __init__(self, *changes: Any) -> None:
        super().__init__(*changes)
        self.thresholds: list[float | None] = []

    async def run(self, topology: Topology, *, warn_empty_after: float | None = 1.0) -> None:
        self.thresholds.append(warn_empty_after)
        await super().run(topology, warn_empty_after=warn_empty_after)

    def _handing_out(self, change: TopologyChange) -> None:
        if isinstance(change, TopologySnapshot):
            self._recorder.refreshed()


def snapshot(*tiers: str) -> TopologySnapshot:
    """Tiers ``default`` (two replicasets owning buckets 1..10) and ``tiers``, never filled."""
    return TopologySnapshot(
        tiers={"default": 10, **dict.fromkeys(tiers, 10)},
        replicasets=(
            ReplicasetEvent("replace", RS1, tier="default", current_master_uuid=M1),
            ReplicasetEvent("replace", RS2, tier="default", current_master_uuid=M2),
        ),
        instances=(
            InstanceEvent(
                "replace", M1, replicaset_uuid=RS1, current_state="Online", address="127.0.0.1:1"
            ),
            InstanceEvent(
                "replace", M2, replicaset_uuid=RS2, current_state="Online", address="127.0.0.1:2"
            ),
        ),
        buckets=(
            BucketSnapshot(
                "default", [BucketEvent("default", 1, 5, RS1), BucketEvent("default", 6, 10, RS2)]
            ),
        ),
    )


# TopologyDiscovery


async def test_topology_discovery_passes_its_threshold_to_the_sources_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)

    source = ScriptedSource(snapshot())
    discovery = TopologyDiscovery(source, interval=0.01, warn_empty_after=0.1)
    try:
        await asyncio.wait_for(anext(discovery), 10)
        source.queue.put_nowait(ReplicasetEvent("delete", RS2))  # clears the map
        await until(lambda: any("has been empty" in line for _, line in lines(caplog)))
    finally:
        await discovery.aclose()
        await source.aclose()
    assert source.thresholds == [0.1]
    (warning,) = [(level, line) for level, line in lines(caplog) if "has been empty" in line]
    assert warning[0] == logging.WARNING
    assert "scripted: the map of tier 'default' has been empty for" in warning[1]


@pytest.mark.parametrize(("given", "passed"), [({}, EMPTY_MAP_WARNING_AFTER), ({"x": None}, None)])
async def test_topology_discovery_passes_the_default_or_none(
    given: dict[str, None], passed: float | None
) -> None:
    source = ScriptedSource(snapshot())
    kwargs: dict[str, Any] = {"warn_empty_after": None} if given else {}
    discovery = TopologyDiscovery(source, interval=0.01, **kwargs)
    try:
        await asyncio.wait_for(anext(discovery), 10)
    finally:
        await discovery.aclose()
        await source.aclose()
    assert source.thresholds == [passed]


@pytest.mark.parametrize("after", BAD_THRESHOLDS)
def test_topology_discovery_refuses_a_threshold_that_is_not_a_positive_time(after: Any) -> None:
    source = ScriptedSource()
    with pytest.raises(ValueError, match=r"warn_empty_after must be a positive, finite number"):
        TopologyDiscovery(source, warn_empty_after=after)


def test_topology_discovery_refuses_a_threshold_for_an_origin_without_run() -> None:
    async def changes() -> AsyncIterator[Any]:
        yield snapshot()

    with pytest.raises(ValueError, match="warn_empty_after"):
        TopologyDiscovery(Topology(), warn_empty_after=5.0)
    with pytest.raises(ValueError, match="warn_empty_after"):
        TopologyDiscovery(changes(), warn_empty_after=5.0)
    with pytest.raises(ValueError, match="warn_empty_after"):
        TopologyDiscovery(ScriptedSource(), apply=Topology.apply, warn_empty_after=5.0)


# shardline.picodata.connect


@pytest.mark.parametrize("after", BAD_THRESHOLDS)
def test_connect_refuses_a_threshold_that_is_not_a_positive_time(after: Any) -> None:
    with pytest.raises(ValueError, match=r"warn_empty_after must be a positive, finite number"):
        connect("postgresql://127.0.0.1:1/nowhere", tier="default", warn_empty_after=after)


@pytest.mark.async_timeout(60)
async def test_a_picodata_client_warns_after_its_threshold(
    catalog: Catalog, caplog: pytest.LogCaptureFixture
) -> None:
    seed_tier(catalog, 2)
    caplog.set_level(logging.INFO, logger=LOGGER)

    async with connect(catalog.dsn, tier="default", warn_empty_after=0.2) as db:
        with catalog.transaction():  # r2 leaves: the map is cleared; its buckets fail
            catalog.expel_replicaset("r2")
            catalog.fail_buckets("default")
        await db.refresh()
        await until(lambda: any("has been empty" in line for _, line in lines(caplog)))
    (warning,) = [line for level, line in lines(caplog) if "has been empty" in line]
    assert "the map of tier 'default' has been empty for" in warning


# a tier whose map was never filled


def test_a_tier_never_filled_after_the_first_complete_refresh_is_said_once_at_info(
    caplog: pytest.LogCaptureFixture,
) -> None:
    topology = Topology()
    topology.apply_tiers({"default": 10, "fresh": 10, "arbiter": 0})
    topology.apply(ReplicasetEvent("replace", RS1, tier="default", current_master_uuid=M1))
    topology.apply(BucketEvent("default", 1, 10, RS1))
    watch = EmptyMapWatch("src", 30.0)
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    watch.check(topology, 1000.0)  # no complete refresh yet: nothing to say
    watch.check(topology, 1000.0, first_refresh=990.0)
    assert lines(caplog) == []
    for now in (1020.0, 1020.5, 2000.0):
        watch.check(topology, now, first_refresh=990.0)
    assert lines(caplog) == [
        (
            logging.INFO,
            "src: the map of tier 'fresh' has held no ranges 30.0 s after the first complete "
            "refresh (its buckets not bootstrapped yet?): keyed routes of the tier miss",
        )
    ]
    # filled, then cleared: from then on it is any other map, warned about
    caplog.clear()
    topology.apply(ReplicasetEvent("replace", RS2, tier="fresh", current_master_uuid=M2))
    topology.apply(BucketEvent("fresh", 1, 10, RS2))
    topology.apply(ReplicasetEvent("delete", RS2))
    since = topology.map_stats("fresh").empty_since
    assert since is not None
    watch.check(topology, since + 31.0, first_refresh=990.0)
    assert [level for level, _ in lines(caplog)] == [logging.WARNING]
    assert "tier 'fresh' has been empty for 31.0 s" in lines(caplog)[0][1]


async def test_a_running_source_says_so_of_a_tier_never_filled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)

    topology = Topology()
    source = ScriptedSource(snapshot("fresh"))
    task = asyncio.create_task(source.run(topology, warn_empty_after=0.1))
    try:
        await until(lambda: any("held no ranges" in line for _, line in lines(caplog)))
    finally:
        await source.aclose()
        await asyncio.wait_for(task, 10)
    said = [(level, line) for level, line in lines(caplog) if "tier 'fresh'" in line]
    assert [level for level, _ in said] == [logging.INFO]
    assert not any(level >= logging.WARNING for level, _ in lines(caplog))
