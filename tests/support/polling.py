"""A PollingSource over the tests' Picodata-like catalog: run in the background while a scenario
changes the catalog, and the topology read back by replicaset name."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from shardline import Topology
from shardline.topology.sources import PollingSource
from support.picodata_catalog import Catalog
from support.replicasets import rs_uuid
from support.waiting import until

T = TypeVar("T")


async def run_polled(
    dsn: str,
    scenario: Callable[[Topology, PollingSource], Awaitable[T]],
    **options: Any,
) -> T:
    """Runs ``scenario(topology, source)`` with ``source.run(topology)`` in the background;
    the source polls only when asked (``interval`` of a minute) unless ``options`` say
    otherwise."""
    topology = Topology()
    options.setdefault("interval", 60.0)
    source = PollingSource(dsn, **options)
    task = asyncio.create_task(source.run(topology))
    try:
        return await scenario(topology, source)
    finally:
        await source.aclose()
        await asyncio.wait_for(task, 10)


async def started(source: PollingSource) -> None:
    """Waits until the background run() iterates the source."""
    await until(lambda: source.state.attempts, "the source's first poll")


def master_name(topology: Topology, bucket: int, tier: str = "default") -> str | None:
    """The name ("r1", …) of the replicaset whose master serves ``bucket``, or None."""
    instance = topology.find_bucket_master(tier, bucket)
    if instance is None:
        return None
    by_uuid = {rs_uuid(n): f"r{n}" for n in range(1, 10)}
    assert instance.replicaset_uuid is not None
    return by_uuid[instance.replicaset_uuid]


def seed_tier(catalog: Catalog, count: int, tier: str = "default", *, first: int = 1) -> None:
    """``count`` replicasets r<first>… (uuids rs_uuid(n)) sharing the tier's buckets evenly."""
    with catalog.transaction():
        if tier not in catalog.expected().tiers:
            catalog.add_tier(tier, 3000)
        for n in range(first, first + count):
            catalog.add_replicaset(f"r{n}", tier, uuid=rs_uuid(n))
        catalog.rebalance(tier)


def owners(topology: Topology, *buckets: int, tier: str = "default") -> list[str | None]:
    return [master_name(topology, bucket, tier) for bucket in buckets]
