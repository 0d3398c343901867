"""RegistrationDiscovery: records become pool events, and a WorkerProxy follows reachability
(scenario 9 of issue 5)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Collection
from typing import Any, TypeVar

import pytest

from shardline import WorkerProxy
from shardline.discovery import DiscoveryEvent, Subscription
from shardline.registration import (
    SERVICE_UID_NAMESPACE,
    MemoryRecordStore,
    Record,
    RegistrationDiscovery,
    service_uid,
)
from shardline.workers import WorkerMetadata
from support.registration_contract import (
    NEW,
    NEW_ADDRESS,
    OLD,
    OLD_ADDRESS,
    PROBE_INTERVAL,
    WAIT,
    ManualClock,
    Stage,
)

pytestmark = pytest.mark.async_timeout(WAIT)  # each async test, start to finish

T = TypeVar("T")


async def take(subscription: AsyncIterator[DiscoveryEvent], count: int) -> list[Any]:
    events = [await asyncio.wait_for(anext(subscription), WAIT) for _ in range(count)]
    return [
        (event.type, event.metadata.extra["service"], event.metadata.address) for event in events
    ]


async def quiet(subscription: Subscription) -> bool:
    """True when no event is ready once the loop has run what was pending (a memory store's
    write reaches a subscriber within a few loop turns); a cancelled wait loses nothing."""
    waiting = asyncio.ensure_future(anext(subscription))
    for _ in range(20):
        await asyncio.sleep(0)
    if waiting.done():
        raise AssertionError(f"unexpected event {waiting.result()}")
    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting
    return True


def test_a_services_uid_is_uuid5_of_a_fixed_namespace() -> None:
    assert service_uid("alpha") == uuid.uuid5(SERVICE_UID_NAMESPACE, "alpha")
    assert service_uid("alpha") == uuid.UUID("44af6580-39ee-5e51-be5c-a3fb656f24d3")
    assert service_uid("alpha") != service_uid("beta")


async def test_a_worker_is_the_service_at_its_records_address() -> None:
    async def scenario() -> WorkerMetadata:
        store = MemoryRecordStore()
        await store.report("alpha", True, OLD, OLD_ADDRESS)
        subscription = RegistrationDiscovery(store, ["alpha"]).subscribe()
        return (await anext(subscription)).metadata

    metadata = await scenario()
    assert (metadata.uid, metadata.address, metadata.pid, metadata.version) == (
        service_uid("alpha"),
        OLD_ADDRESS,
        0,
        "",
    )
    assert (metadata.tags, dict(metadata.extra)) == (frozenset(), {"service": "alpha"})


async def test_a_subscriber_first_sees_every_registered_service_as_added() -> None:

    store = MemoryRecordStore()
    await store.report("alpha", True, OLD, OLD_ADDRESS)
    await store.claim("beta", NEW)  # not registered: not a worker
    await store.report("gamma", True, NEW, NEW_ADDRESS)
    discovery = RegistrationDiscovery(store, ["alpha", "beta", "gamma", "delta"])
    subscription = discovery.subscribe()
    assert await take(subscription, 2) == [
        ("worker-added", "alpha", OLD_ADDRESS),
        ("worker-added", "gamma", NEW_ADDRESS),
    ]
    assert await quiet(subscription)
    await discovery.aclose()


async def test_records_turn_into_added_updated_and_dropped() -> None:

    store = MemoryRecordStore()
    discovery = RegistrationDiscovery(store, ["alpha"])
    await store.claim("alpha", OLD)
    subscription = discovery.subscribe()
    assert await quiet(subscription)  # claimed, not registered: no worker
    await store.report("alpha", True, OLD, OLD_ADDRESS)
    await store.report("alpha", True, NEW, OLD_ADDRESS)  # another owner, same address
    await store.report("alpha", True, NEW, NEW_ADDRESS)
    await store.report("alpha", False, NEW)
    await store.report("alpha", True, NEW, NEW_ADDRESS)
    await store.clear("alpha")
    assert await take(subscription, 5) == [
        ("worker-added", "alpha", OLD_ADDRESS),
        ("worker-updated", "alpha", NEW_ADDRESS),
        ("worker-dropped", "alpha", NEW_ADDRESS),
        ("worker-added", "alpha", NEW_ADDRESS),
        ("worker-dropped", "alpha", NEW_ADDRESS),
    ]
    assert await quiet(subscription)
    await discovery.aclose()


async def test_a_filter_chooses_among_the_services_and_subscriptions_are_independent() -> None:

    store = MemoryRecordStore()
    discovery = RegistrationDiscovery(store, ["alpha", "beta"])
    everything = discovery.subscribe()
    only_beta = discovery.subscribe(lambda metadata: metadata.extra["service"] == "beta")
    await store.report("alpha", True, OLD, OLD_ADDRESS)
    await store.report("beta", True, OLD, NEW_ADDRESS)
    assert await take(only_beta, 1) == [("worker-added", "beta", NEW_ADDRESS)]
    assert await take(everything, 2) == [
        ("worker-added", "alpha", OLD_ADDRESS),
        ("worker-added", "beta", NEW_ADDRESS),
    ]
    await only_beta.aclose()
    await store.report("alpha", False, OLD)
    assert await take(everything, 1) == [("worker-dropped", "alpha", OLD_ADDRESS)]
    await discovery.aclose()


async def test_aclose_ends_every_subscription_and_its_watch() -> None:

    store = MemoryRecordStore()
    discovery = RegistrationDiscovery(store, ["alpha"])
    subscriptions = [discovery.subscribe(), aiter(discovery)]
    assert all(isinstance(subscription, Subscription) for subscription in subscriptions)
    waiting = asyncio.ensure_future(anext(subscriptions[0]))
    await asyncio.sleep(0)
    await discovery.aclose()
    for subscription in subscriptions:
        with pytest.raises(StopAsyncIteration):
            await anext(subscription)
    assert waiting.cancelled()
    assert len(store._watches) == 0


class FlakyStore(MemoryRecordStore):
    """Its first watch fails once it has yielded the current states; later watches work."""

    def __init__(self) -> None:
        super().__init__()
        self.watches = 0
        self.failed = asyncio.Event()

    def watch(self, services: Collection[str]) -> AsyncIterator[tuple[str, Record | None]]:
        self.watches += 1
        inner = super().watch(services)
        return inner if self.watches > 1 else self._failing(inner, len(services))

    async def _failing(
        self, inner: AsyncIterator[tuple[str, Record | None]], count: int
    ) -> AsyncIterator[tuple[str, Record | None]]:
        for _ in range(count):
            yield await anext(inner)
        self.failed.set()
        raise ConnectionError("the watch broke")


async def test_a_failed_watch_is_opened_again_and_brings_subscribers_up_to_date(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        store = FlakyStore()
        await store.report("alpha", True, OLD, OLD_ADDRESS)
        await store.report("beta", True, OLD, NEW_ADDRESS)
        discovery = RegistrationDiscovery(store, ["alpha", "beta"], retry_delay=0)
        subscription = discovery.subscribe()
        assert await take(subscription, 2) == [
            ("worker-added", "alpha", OLD_ADDRESS),
            ("worker-added", "beta", NEW_ADDRESS),
        ]
        waiting = asyncio.ensure_future(anext(subscription))
        await asyncio.wait_for(store.failed.wait(), WAIT)
        await store.report("alpha", False, OLD)  # while no watch is open
        event = await asyncio.wait_for(waiting, WAIT)
        assert (event.type, event.metadata.extra["service"]) == ("worker-dropped", "alpha")
        assert await quiet(subscription)  # beta's unchanged state is no event
        await store.report("beta", False, OLD)
        assert await take(subscription, 1) == [("worker-dropped", "beta", NEW_ADDRESS)]
        assert store.watches == 2
        await discovery.aclose()

    with caplog.at_level(logging.WARNING, "shardline.registration"):
        await scenario()
    assert "the watch broke" in caplog.text


async def test_a_watch_that_ends_ends_the_subscription() -> None:
    class ClosingStore(MemoryRecordStore):
        def watch(self, services: Collection[str]) -> AsyncIterator[tuple[str, Record | None]]:
            return self._nothing()

        async def _nothing(self) -> AsyncIterator[tuple[str, Record | None]]:
            for _ in ():
                yield _

    subscription = RegistrationDiscovery(ClosingStore(), ["alpha"]).subscribe()
    with pytest.raises(StopAsyncIteration):
        await anext(subscription)


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"services": "alpha"}, "services"),
        ({"services": []}, "services"),
        ({"services": ["alpha", ""]}, "service"),
        ({"services": ["alpha"], "retry_delay": -1}, "retry_delay"),
    ],
)
def test_bad_arguments_are_refused_by_name(arguments: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        RegistrationDiscovery(MemoryRecordStore(), **arguments)


# -- scenario 9: a proxy following reachability ---------------------------------------------------


class Server:
    """A service's replica serving tasks in this process."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.served = 0

    async def handle(self, task: Any) -> str:
        self.served += 1
        await asyncio.sleep(0)
        return self.name


class InProcessConnection:
    """The proxy's connection to a server in this process, found by the record's address."""

    def __init__(self, server: Server) -> None:
        self.server = server

    async def dispatch(self, task: Any, *, timeout: float | None = None) -> Any:
        return await asyncio.wait_for(self.server.handle(task), timeout)


class Tap:
    """Passes a discovery's events to the proxy, counting those the proxy has applied."""

    def __init__(self, discovery: RegistrationDiscovery) -> None:
        self.discovery = discovery
        self.events: list[tuple[str, str]] = []
        self.applied = 0
        self._changed = asyncio.Event()

    async def __aiter__(self) -> AsyncIterator[DiscoveryEvent]:
        async for event in self.discovery:
            self.events.append((event.type, event.metadata.extra["service"]))
            yield event
            # the proxy asks for the next event only once it has applied this one
            self.applied += 1
            self._changed.set()

    async def applied_up_to(self, count: int) -> None:
        async with asyncio.timeout(WAIT):
            while self.applied < count:
                self._changed.clear()
                await self._changed.wait()


async def spread(proxy: WorkerProxy, count: int = 4) -> list[str]:
    """Which servers ``count`` dispatches reached, sorted."""
    return sorted([await proxy.dispatch(n) for n in range(count)])


async def test_scenario9_a_proxy_stops_dispatching_within_one_event_of_false_and_resumes_on_true():
    servers = {OLD_ADDRESS: Server("alpha"), NEW_ADDRESS: Server("beta")}

    clock = ManualClock()
    alpha = Stage(MemoryRecordStore(), clock)
    beta = Stage(alpha.store.inner, clock)  # another service in the same store
    for stage, address in ((alpha, OLD_ADDRESS), (beta, NEW_ADDRESS)):
        await stage.start(*stage.replica(OLD, address))
    tap = Tap(RegistrationDiscovery(alpha.store, [alpha.service, beta.service]))
    proxy = WorkerProxy(
        discovery=tap,
        connect=lambda metadata: InProcessConnection(servers[metadata.address]),
        quorum=2,
    )
    async with proxy:
        await tap.applied_up_to(2)
        assert await spread(proxy) == ["alpha", "alpha", "beta", "beta"]
        # alpha's successor claims the record and never comes up: the record turns False
        await alpha.start(*alpha.replica(NEW, "10.0.0.3:7000", ready=False))
        await tap.applied_up_to(3)
        assert tap.events[2:] == [("worker-dropped", alpha.service)]  # the one event
        assert await spread(proxy) == ["beta"] * 4
        # alpha's own probe restores its record: the proxy dispatches to it again
        await clock.advance_to(PROBE_INTERVAL)
        assert await alpha.record() == Record(OLD, True, OLD_ADDRESS)
        await tap.applied_up_to(4)
        assert tap.events[3:] == [("worker-added", alpha.service)]
        assert await spread(proxy) == ["alpha", "alpha", "beta", "beta"]
    await tap.discovery.aclose()


async def test_it_can_be_passed_as_is_as_a_proxys_discovery() -> None:
    servers = {OLD_ADDRESS: Server("alpha")}

    store = MemoryRecordStore()
    await store.report("alpha", True, OLD, OLD_ADDRESS)
    discovery = RegistrationDiscovery(store, ["alpha"])
    async with WorkerProxy(
        discovery=discovery,
        connect=lambda metadata: InProcessConnection(servers[metadata.address]),
    ) as proxy:
        assert await proxy.dispatch("task") == "alpha"
        assert [worker.uid for worker in proxy.workers] == [service_uid("alpha")]
    await discovery.aclose()
