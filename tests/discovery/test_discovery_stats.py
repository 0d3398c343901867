"""Discovery's stats: the records' optional publish time (``published``), the events a
subscription hands out counted by type, and the lag from publish to pool, down to a scrape of a
real registry after a run over a real etcd."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import time
import uuid
from collections.abc import AsyncGenerator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

import shardline.discovery.subscription as subscription_module
from shardline import InvalidRecord, WorkerMetadata, WorkerProxy
from shardline.discovery import DiscoveryEvent, InProcessDiscovery, LocalDiscovery, Subscription
from shardline.discovery.etcd import EtcdDiscovery
from shardline.discovery.record import MAX_PUBLISHED, decode_record, encode_record, stamped
from shardline.discovery.subscription import RecordFeed
from shardline.metrics import register
from support.etcd_server import EtcdServer
from support.prometheus import scrape
from support.waiting import until


def worker(n: int, **changes: Any) -> WorkerMetadata:
    record = WorkerMetadata(
        uid=uuid.UUID(int=n), address=f"127.0.0.1:{5000 + n}", pid=100 + n, version="1.0"
    )
    return dataclasses.replace(record, **changes)


def document(**fields: Any) -> bytes:
    base: dict[str, Any] = {
        "schema": 1,
        "uid": str(uuid.UUID(int=1)),
        "address": "127.0.0.1:5001",
        "pid": 101,
        "version": "1.0",
    }
    base.update(fields)
    return json.dumps(base).encode()


class Idle:
    """A connection nothing is dispatched through."""

    async def dispatch(self, task: Any, *, timeout: float | None = None) -> Any:
        raise AssertionError("not dispatched to")


# the record's publish time


def test_a_record_without_a_publish_time_reads_as_before() -> None:
    assert decode_record(document()).published is None
    assert b"published" not in encode_record(worker(1))


@given(st.floats(0, MAX_PUBLISHED) | st.integers(0, int(MAX_PUBLISHED)))
def test_the_publish_time_travels_in_the_record(published: float) -> None:
    record = worker(1, published=published)
    assert decode_record(encode_record(record)).published == float(published)
    assert decode_record(document(published=published)).published == float(published)


@pytest.mark.parametrize(
    "text",
    ['"1764748800"', "true", "-1", "-0.5", "NaN", "Infinity", "-Infinity", "1e300", "[1]"],
)
def test_a_publish_time_that_is_not_a_time_is_refused(text: str) -> None:
    data = document()[:-1] + b', "published": ' + text.encode() + b"}"
    with pytest.raises(InvalidRecord, match="'published' is not a time") as raised:
        decode_record(data)
    assert raised.value.reason == "malformed"


def test_a_publisher_learns_of_a_publish_time_no_reader_accepts() -> None:
    for published in (math.nan, math.inf, -1.0, MAX_PUBLISHED * 2):
        with pytest.raises(InvalidRecord, match="published"):
            encode_record(worker(1, published=published))


def test_a_publisher_stamps_the_time_of_the_publish() -> None:
    before = time.time()
    published = stamped(worker(1)).published
    assert published is not None
    assert before <= published <= time.time()


def test_the_publish_time_takes_no_part_in_comparing_records() -> None:
    assert worker(1, published=1.0) == worker(1, published=2.0) == worker(1)


@pytest.mark.parametrize("backend", ["in-process", "local"])
async def test_a_record_published_again_unchanged_is_no_event(backend: str, tmp_path: Path) -> None:
    namespace = f"stats-republish-{uuid.uuid4().hex[:8]}"
    discovery: InProcessDiscovery | LocalDiscovery = (
        InProcessDiscovery(namespace)
        if backend == "in-process"
        else LocalDiscovery(namespace, directory=tmp_path)
    )
    subscription = discovery.subscribe()
    before = time.time()
    await discovery.publisher.publish("worker-added", worker(1))
    await discovery.publisher.publish("worker-updated", worker(1))
    await discovery.publisher.publish("worker-updated", worker(1, pid=7))
    async with asyncio.timeout(10):
        first, second = await anext(subscription), await anext(subscription)
    await subscription.aclose()
    await discovery.aclose()
    for event in (first, second):  # each publish stamped the record it put
        assert event.metadata.published is not None
        assert before <= event.metadata.published <= time.time()
    assert (first.type, second.type, second.metadata.pid) == ("worker-added", "worker-updated", 7)


# a subscription's counts and lag, on a clock the test sets


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now


def fed(events: list[DiscoveryEvent]) -> Subscription:
    async def stream() -> AsyncGenerator[DiscoveryEvent, None]:
        for event in events:
            yield event

    return Subscription(stream(), RecordFeed())


async def taken(
    monkeypatch: pytest.MonkeyPatch, events: list[tuple[DiscoveryEvent, float]]
) -> Subscription:
    """A subscription made at time 1000 that has handed out ``events``, each taken at its
    time."""
    clock = Clock(1000.0)
    monkeypatch.setattr(subscription_module, "time", SimpleNamespace(time=clock.time))
    subscription = fed([event for event, _ in events])
    for _, at in events:
        clock.now = at
        await anext(subscription)
    return subscription


async def test_events_are_counted_by_type_and_timed_from_their_publish(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    subscription = await taken(
        monkeypatch,
        [
            (DiscoveryEvent("worker-added", worker(1, published=1000.5)), 1000.5 + 0.02),
            (DiscoveryEvent("worker-updated", worker(1, published=1001.0)), 1001.0 + 3.0),
            (DiscoveryEvent("worker-added", worker(2)), 1002.0),  # no publish time: untimed
            (DiscoveryEvent("worker-added", worker(3, published=999.0)), 1003.0),  # before
            (DiscoveryEvent("worker-dropped", worker(1, published=1001.0)), 1004.0),
        ],
    )
    stats = subscription.stats
    assert stats.events == {"worker-added": 3, "worker-updated": 1, "worker-dropped": 1}
    assert stats.lag.count == 2
    assert stats.lag.sum == pytest.approx(3.02)
    buckets = dict(stats.lag.cumulative())
    assert (buckets["0.01"], buckets["0.025"], buckets["2.5"], buckets["5.0"]) == (0, 1, 1, 2)
    assert buckets["+Inf"] == 2
    assert stats.clock_ahead == 0


async def test_a_publish_time_ahead_of_this_clock_counts_as_no_lag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    subscription = await taken(
        monkeypatch, [(DiscoveryEvent("worker-added", worker(1, published=1010.0)), 1001.0)]
    )
    stats = subscription.stats
    assert (stats.lag.count, stats.lag.sum, stats.clock_ahead) == (1, 0.0, 1)
    assert dict(stats.lag.cumulative())["0.005"] == 1


# a run over a real etcd, scraped


async def test_an_etcd_run_is_scraped_with_events_and_lags(etcd: EtcdServer) -> None:
    namespace = f"stats-{uuid.uuid4().hex[:8]}"

    prefix = f"/shardline/{namespace}/workers/".encode()
    # a record of an older publisher (no publish time), and one no reader accepts
    old = encode_record(worker(9))
    assert b"published" not in old
    etcd.put(prefix + str(worker(9).uid).encode(), old)
    etcd.put(prefix + str(worker(8).uid).encode(), b"{not json")

    publisher = EtcdDiscovery([etcd.endpoint], namespace, ttl=5)
    subscriber = EtcdDiscovery([etcd.endpoint], namespace, timeout=10)
    try:
        # already there when the pool starts: an event, but not timed
        await publisher.publisher.publish("worker-added", worker(1))
        stream = subscriber.subscribe()
        registry = CollectorRegistry()
        proxy = WorkerProxy(discovery=stream, connect=lambda metadata: Idle(), quorum=2)
        register(registry, discoveries={"workers": stream}, proxies={"pool": proxy})
        began = time.time()
        async with proxy:
            await publisher.publisher.publish("worker-added", worker(2))
            await publisher.publisher.publish("worker-updated", worker(2, pid=1))
            await publisher.publisher.publish("worker-dropped", worker(1))
            await until(lambda: stream.stats.events.get("worker-dropped", 0) == 1)
            assert {metadata.uid for metadata in proxy.workers} == {
                worker(2).uid,
                worker(9).uid,
            }
        waited = time.time() - began
        samples = scrape(registry)
        name = (("discovery", "workers"),)
        events = "shardline_discovery_events_total"
        assert samples[events, (*name, ("type", "worker-added"))] == 3
        assert samples[events, (*name, ("type", "worker-updated"))] == 1
        assert samples[events, (*name, ("type", "worker-dropped"))] == 1
        # timed: worker 2's add and update, published while the pool followed
        assert samples["shardline_discovery_event_lag_seconds_count", name] == 2
        lag = samples["shardline_discovery_event_lag_seconds_sum", name]
        assert 0 <= lag <= 2 * waited
        inf = (*name, ("le", "+Inf"))
        assert samples["shardline_discovery_event_lag_seconds_bucket", inf] == 2
        assert samples["shardline_discovery_clock_ahead_total", name] == 0
        skipped = "shardline_discovery_skipped_total"
        assert samples[skipped, (*name, ("reason", "malformed"))] == 1
        # every reason the help text names is exported, at 0 until it happens
        for reason in ("oversized", "unknown-schema", "filter-error", "rejected"):
            assert samples[skipped, (*name, ("reason", reason))] == 0
        assert samples["shardline_proxy_workers", (("proxy", "pool"),)] == 2
        await stream.aclose()
    finally:
        await publisher.aclose()
        await subscriber.aclose()
