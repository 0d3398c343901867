"""A reachability record's keeper, as an operator sees it: ``stats.state`` and
``stats.reasserts`` against a model over drawn runs, and the keeper families
(``shardline_keeper_state``, ``…_reasserts_total``, ``…_info``, the probes) scraped from a real
registry after the successor scenario played on a real etcd."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from shardline.metrics import register
from shardline.registration import (
    KEEPER_STATES,
    MemoryRecordStore,
    Record,
)
from shardline.registration.etcd_store import EtcdRecordStore
from support.etcd_server import EtcdServer
from support.prometheus import scrape
from support.registration_contract import (
    NEW,
    OLD,
    OLD_ADDRESS,
    PROBE_INTERVAL,
    TICK,
    WAIT,
    ManualClock,
    Stage,
)


@pytest.mark.async_timeout(WAIT)
async def test_the_keeper_goes_through_its_states_in_order() -> None:
    stage = Stage(MemoryRecordStore(), ManualClock())
    keeper, replica = stage.replica(OLD, OLD_ADDRESS)
    seen = [keeper.stats.state]
    replica.register_error = ConnectionError("refused")
    await stage.start(keeper, replica)  # claimed; the first registration fails
    seen.append(keeper.stats.state)
    replica.register_error = None
    await stage.clock.advance_to(30)  # the backoff is over: registered
    seen.append(keeper.stats.state)
    replica.probe_answer = False
    await stage.clock.advance_to(90)  # the probe fails: the registration is dropped
    seen.append(keeper.stats.state)
    await keeper.deregister()
    seen.append(keeper.stats.state)
    assert seen == [
        "idle",
        "unregistered",
        "registered",
        "unregistered",
        "deregistered",
    ]
    assert KEEPER_STATES == ("idle", "unregistered", "registered", "deregistered")


@pytest.mark.async_timeout(WAIT)
async def test_a_probe_that_heals_a_successors_claim_counts_as_a_reassertion() -> None:
    stage = Stage(MemoryRecordStore(), ManualClock())
    keeper, replica = stage.replica(OLD, OLD_ADDRESS)
    await stage.start(keeper, replica)
    after_registration = keeper.stats.reasserts
    await stage.store.claim(stage.service, NEW)  # a successor that never comes up
    await stage.clock.advance_to(PROBE_INTERVAL)
    assert await stage.record() == Record(OLD, True, OLD_ADDRESS)
    stats = keeper.stats
    await keeper.deregister()
    assert (after_registration, stats.reasserts, stats.reports) == (0, 1, 2)


class FlakyStore(MemoryRecordStore):
    """A memory store that refuses writes of True while ``refuse`` is set."""

    refuse = False

    async def report(
        self, service: str, registered: bool, owner: str | None, address: str | None = None
    ) -> bool:
        if registered and self.refuse:
            raise ConnectionError("the store is away")
        return await super().report(service, registered, owner, address)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.booleans(), st.booleans(), st.booleans()), max_size=12))
def test_state_and_reasserts_follow_a_model_of_the_keeper(
    ticks: list[tuple[bool, bool, bool, bool]],
) -> None:
    # With no backoff and a probe due at every tick, each ready tick does one thing: register
    # when unregistered, probe when registered. The model: a registration that succeeds
    # registers; a probe that succeeds keeps it and re-asserts (counted when the store takes
    # the write), one that fails drops it; a tick while not ready does nothing.
    store = FlakyStore()

    async def scenario() -> None:
        stage = Stage(store, ManualClock())
        keeper, replica = stage.replica(OLD, OLD_ADDRESS, backoff=0.0, probe_interval=TICK)
        replica.ready = False
        await stage.start(keeper, replica)
        registered, reasserts = False, 0
        for ready, register_ok, probe_ok, refuse in ticks:
            replica.ready = ready
            replica.register_error = None if register_ok else ConnectionError("refused")
            replica.probe_answer = probe_ok
            store.refuse = refuse
            await stage.clock.advance(TICK)
            if ready and registered:
                registered = probe_ok
                reasserts += probe_ok and not refuse
            elif ready:
                registered = register_ok
            stats = keeper.stats
            assert stats.state == ("registered" if registered else "unregistered")
            assert stats.reasserts == reasserts
        await keeper.deregister()
        assert keeper.stats.state == "deregistered"

    asyncio.run(asyncio.wait_for(scenario(), WAIT))


async def test_the_successor_scenario_on_etcd_is_scraped(etcd: EtcdServer) -> None:
    async with EtcdRecordStore([etcd.endpoint], f"keeper-{uuid.uuid4().hex[:8]}") as store:
        stage = Stage(store, ManualClock())
        old_keeper, old = stage.replica(OLD, OLD_ADDRESS)
        new_keeper, new = stage.replica(
            NEW, "10.0.0.2:7000", register_error=ConnectionError("client already exists")
        )
        untagged, _ = stage.replica(None, "10.0.0.3:7000")
        registry = CollectorRegistry()
        register(registry, keepers={"old": old_keeper, "new": new_keeper, "idle": untagged})
        await stage.start(old_keeper, old)
        await stage.clock.advance_to(20)
        await stage.start(new_keeper, new)  # claims the record: false
        assert await stage.record() == Record(NEW, False)
        await stage.clock.advance_to(PROBE_INTERVAL)  # the predecessor's probe heals it
        assert await stage.record() == Record(OLD, True, OLD_ADDRESS)
        samples = scrape(registry)
        await new_keeper.deregister()
        await old_keeper.deregister()

    def state(keeper: str, name: str) -> float:
        return samples["shardline_keeper_state", (("keeper", keeper), ("state", name))]

    assert [state("old", name) for name in KEEPER_STATES] == [0, 0, 1, 0]
    assert [state("new", name) for name in KEEPER_STATES] == [0, 1, 0, 0]
    assert [state("idle", name) for name in KEEPER_STATES] == [1, 0, 0, 0]
    assert samples["shardline_keeper_reasserts_total", (("keeper", "old"),)] == 1
    assert samples["shardline_keeper_reasserts_total", (("keeper", "new"),)] == 0
    served = (("keeper", "old"), ("result", "served"))
    assert samples["shardline_keeper_probes_total", served] == 1
    failed = (("keeper", "new"), ("result", "failed"))
    assert samples["shardline_keeper_registrations_total", failed] == 2  # at 20 and 50
    info = "shardline_keeper_info"
    service = stage.service
    assert samples[info, (("keeper", "old"), ("owner", OLD), ("service", service))] == 1
    assert samples[info, (("keeper", "idle"), ("owner", ""), ("service", service))] == 1
