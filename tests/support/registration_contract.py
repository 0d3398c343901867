"""The registration contract, once for every record store: the record rules of issue 5
(:class:`RecordStoreContract`) and the keeper and reader scenarios 1-7 (:class:`KeeperContract`).

A store's test module subclasses either as ``Test…`` and implements ``make_store()``, returning
a new, empty store (``close_store(store)`` closes it afterwards: by default its ``aclose()``,
if it has one). Every test uses service names of its own, so a store may be shared.

Time is a :class:`ManualClock`: it moves only when a test advances it, and advancing wakes each
keeper due in turn and waits (in real time, up to ``WAIT`` seconds) until that keeper has
finished its tick and sleeps again, however long its store takes. Timing is therefore exact
against any store.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardline.registration import Record, RecordStore, RegistrationKeeper, advertised_address

T = TypeVar("T")
WAIT = 20.0
_services = itertools.count()

OLD, NEW = "old", "new"
OLD_ADDRESS, NEW_ADDRESS = "10.0.0.1:7000", "10.0.0.2:7000"

# The keeper's defaults: tick 5 s, a probe every 60 s, a failed registration retried after 30 s.
TICK, PROBE_INTERVAL, BACKOFF = 5.0, 60.0, 30.0


def new_service() -> str:
    return f"app-{next(_services)}-{uuid.uuid4().hex[:8]}"


# -- the reference rules -------------------------------------------------------------------------


class ReferenceRecords:
    """The rules of the issue as plainly as they can be written: the model every store is
    checked against."""

    def __init__(self) -> None:
        self.records: dict[str, Record] = {}

    def claim(self, service: str, owner: str | None) -> None:
        self.records[service] = Record(owner, False)

    def report(
        self, service: str, registered: bool, owner: str | None, address: str | None = None
    ) -> bool:
        current = self.records.get(service)
        if not registered and current is not None and current.owner != owner:
            return False
        self.records[service] = Record(owner, registered, address)
        return True

    def clear(self, service: str) -> None:
        self.records.pop(service, None)

    def get(self, service: str) -> Record | None:
        return self.records.get(service)


# claim / report True / report False / clear, by owners from a small set that includes None
owners = st.sampled_from([None, OLD, NEW])
operations = st.one_of(
    st.tuples(st.just("claim"), owners),
    st.tuples(st.just("report-true"), owners, st.sampled_from([OLD_ADDRESS, NEW_ADDRESS])),
    st.tuples(st.just("report-false"), owners),
    st.tuples(st.just("clear")),
)


async def apply(store: RecordStore, service: str, operation: tuple[Any, ...]) -> bool | None:
    """Applies one drawn operation to ``store``; what the call returned."""
    kind = operation[0]
    if kind == "claim":
        return await store.claim(service, operation[1])  # type: ignore[func-returns-value]
    if kind == "report-true":
        return await store.report(service, True, operation[1], operation[2])
    if kind == "report-false":
        return await store.report(service, False, operation[1])
    return await store.clear(service)  # type: ignore[func-returns-value]


def apply_to_model(model: ReferenceRecords, service: str, operation: tuple[Any, ...]) -> Any:
    """Applies one drawn operation to the reference model; what it returned."""
    kind = operation[0]
    if kind == "claim":
        return model.claim(service, operation[1])
    if kind == "report-true":
        return model.report(service, True, operation[1], operation[2])
    if kind == "report-false":
        return model.report(service, False, operation[1])
    return model.clear(service)


# -- the clock -----------------------------------------------------------------------------------


class ManualClock:
    """A :class:`~shardline.registration.Clock` that moves only when the test advances it."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, int, asyncio.Task[Any], asyncio.Future[None]]] = []
        self._order = itertools.count()
        self._sleeping: dict[asyncio.Task[Any], asyncio.Future[None]] = {}
        self._changed = asyncio.Event()
        self.sleeps = 0  # sleep() calls so far

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        task = asyncio.current_task()
        assert task is not None
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._order), task, future))
        self._sleeping[task] = future
        self.sleeps += 1
        self._changed.set()
        try:
            await future
        finally:
            if self._sleeping.get(task) is future:
                del self._sleeping[task]

    async def wait_until(self, condition: Callable[[], bool]) -> None:
        """Waits, in real time and up to WAIT seconds, until ``condition()`` holds; it is
        checked again after each sleep() call and each finished task."""
        async with asyncio.timeout(WAIT):
            while not condition():
                self._changed.clear()
                await self._changed.wait()

    async def advance(self, seconds: float) -> None:
        await self.advance_to(self._now + seconds)

    async def advance_to(self, when: float) -> None:
        """Moves time to ``when``, waking every sleeper due on the way, in deadline order, at
        its deadline, and letting it finish its work before the next."""
        while self._sleepers and self._sleepers[0][0] <= when:
            deadline, _, task, future = heapq.heappop(self._sleepers)
            if future.done():  # its sleep was cancelled
                continue
            self._now = max(self._now, deadline)
            future.set_result(None)
            task.add_done_callback(lambda _: self._changed.set())
            await self.wait_until(functools.partial(self._rested, task, future))
        self._now = max(self._now, when)

    def _rested(self, task: asyncio.Task[Any], woken: asyncio.Future[None]) -> bool:
        """Whether ``task``, woken from ``woken``, sleeps again or has finished."""
        return task.done() or self._sleeping.get(task) not in (None, woken)


# -- a replica as the keeper sees it --------------------------------------------------------------


@dataclass
class Replica:
    """A replica's server side, answering ``register`` and ``probe`` as the test says, and
    remembering when each was called."""

    clock: ManualClock
    address: str
    ready: bool = True
    register_error: Exception | None = None
    probe_answer: bool = True
    probe_error: Exception | None = None
    probe_gate: asyncio.Event | None = None  # when set, a probe waits for it before answering
    probe_entered: asyncio.Event = field(default_factory=asyncio.Event)
    registrations: list[float] = field(default_factory=list)
    probes: list[float] = field(default_factory=list)

    async def register(self) -> str:
        self.registrations.append(self.clock.now())
        if self.register_error is not None:
            raise self.register_error
        return self.address

    async def probe(self) -> bool:
        self.probes.append(self.clock.now())
        self.probe_entered.set()
        if self.probe_gate is not None:
            await self.probe_gate.wait()
        if self.probe_error is not None:
            raise self.probe_error
        return self.probe_answer

    def is_ready(self) -> bool:
        return self.ready


class RecordingStore:
    """A store that passes everything to ``inner`` and logs each applied write as
    ``(time, owner, record after it)``."""

    def __init__(self, inner: RecordStore, clock: ManualClock) -> None:
        self.inner = inner
        self.clock = clock
        self.writes: list[tuple[float, str | None, Record | None]] = []

    async def claim(self, service: str, owner: str | None) -> None:
        await self.inner.claim(service, owner)
        self.writes.append((self.clock.now(), owner, Record(owner, False)))

    async def report(
        self, service: str, registered: bool, owner: str | None, address: str | None = None
    ) -> bool:
        applied = await self.inner.report(service, registered, owner, address)
        if applied:
            self.writes.append((self.clock.now(), owner, Record(owner, registered, address)))
        return applied

    async def get(self, service: str) -> Record | None:
        return await self.inner.get(service)

    async def clear(self, service: str) -> None:
        await self.inner.clear(service)
        self.writes.append((self.clock.now(), None, None))

    def watch(self, services: Collection[str]) -> AsyncIterator[tuple[str, Record | None]]:
        return self.inner.watch(services)

    def first_write_after(self, moment: float, record: Record) -> float:
        """When ``record`` was next written after the write at ``moment``."""
        return next(when for when, _, written in self.writes if when > moment and written == record)


class Stage:
    """One service, its store and the clock, with replicas and their keepers."""

    def __init__(self, store: RecordStore, clock: ManualClock) -> None:
        self.store = RecordingStore(store, clock)
        self.clock = clock
        self.service = new_service()

    def replica(
        self,
        owner: str | None,
        address: str,
        *,
        clock: ManualClock | None = None,
        tick: float = TICK,
        probe_interval: float = PROBE_INTERVAL,
        backoff: float = BACKOFF,
        **behaviour: Any,
    ) -> tuple[RegistrationKeeper, Replica]:
        replica = Replica(clock or self.clock, address, **behaviour)
        keeper = RegistrationKeeper(
            self.service,
            owner,
            self.store,
            register=replica.register,
            probe=replica.probe,
            is_ready=replica.is_ready,
            tick=tick,
            probe_interval=probe_interval,
            backoff=backoff,
            clock=replica.clock,
        )
        return keeper, replica

    async def start(self, keeper: RegistrationKeeper, replica: Replica) -> None:
        """Starts ``keeper`` and waits until its first tick is over."""
        before = replica.clock.sleeps
        await keeper.start()
        await replica.clock.wait_until(lambda: replica.clock.sleeps > before)

    async def record(self) -> Record | None:
        return await self.store.get(self.service)

    async def advertised(self, alive: str | None = "liveness-says-alive") -> str | None:
        return await advertised_address(self.store, self.service, alive=lambda: alive)


# -- the contracts -------------------------------------------------------------------------------


class StoreHarness:
    """Makes a store per test and closes it afterwards."""

    async def make_store(self) -> RecordStore:
        raise NotImplementedError

    async def close_store(self, store: RecordStore) -> None:
        close = getattr(store, "aclose", None)
        if close is not None:
            await close()

    async def run(self, scenario: Callable[[RecordStore], Awaitable[T]]) -> T:
        """Runs ``scenario(store)`` on a new store (bounded by WAIT), closing it afterwards."""
        store = await self.make_store()
        try:
            return await asyncio.wait_for(scenario(store), WAIT)
        finally:
            await self.close_store(store)

    async def stage(self, scenario: Callable[[Stage], Awaitable[T]]) -> T:
        """Runs ``scenario`` on a new service with a manual clock; keepers still running at
        the end are cancelled, as a process ending would."""

        async def on_stage(store: RecordStore) -> T:
            return await scenario(Stage(store, ManualClock()))

        return await self.run(on_stage)


class RecordStoreContract(StoreHarness):
    """The record rules of issue 5, and the watch, for a store made by ``make_store``."""

    async def test_it_is_a_record_store(self) -> None:
        async def scenario(store: RecordStore) -> None:
            assert isinstance(store, RecordStore)

        await self.run(scenario)

    # the record scenarios of the issue, by name

    async def test_never_reported_is_none(self) -> None:
        async def scenario(store: RecordStore) -> None:
            assert await store.get(new_service()) is None

        await self.run(scenario)

    async def test_untagged_false_then_true_round_trips(self) -> None:
        async def scenario(store: RecordStore) -> None:
            app = new_service()
            assert await store.report(app, False, None) is True
            assert await store.get(app) == Record(None, False)
            assert await store.report(app, True, None, OLD_ADDRESS) is True
            assert await store.get(app) == Record(None, True, OLD_ADDRESS)

        await self.run(scenario)

    async def test_clear_is_none(self) -> None:
        async def scenario(store: RecordStore) -> None:
            app = new_service()
            await store.report(app, True, OLD, OLD_ADDRESS)
            await store.clear(app)
            assert await store.get(app) is None
            await store.clear(app)  # clearing what is not there is fine
            assert await store.get(app) is None

        await self.run(scenario)

    async def test_true_old_claim_new_is_false_then_true_new_then_false_old_is_still_true(
        self,
    ) -> None:
        async def scenario(store: RecordStore) -> None:
            app = new_service()
            await store.report(app, True, OLD, OLD_ADDRESS)
            await store.claim(app, NEW)
            assert await store.get(app) == Record(NEW, False)
            assert await store.report(app, True, NEW, NEW_ADDRESS) is True
            assert await store.report(app, False, OLD) is False
            assert await store.get(app) == Record(NEW, True, NEW_ADDRESS)

        await self.run(scenario)

    async def test_true_new_false_new_is_false(self) -> None:
        async def scenario(store: RecordStore) -> None:
            app = new_service()
            await store.report(app, True, NEW, NEW_ADDRESS)
            assert await store.report(app, False, NEW) is True
            assert await store.get(app) == Record(NEW, False)

        await self.run(scenario)

    async def test_true_old_false_old_claim_new_true_new_is_true(self) -> None:
        async def scenario(store: RecordStore) -> None:
            app = new_service()
            await store.report(app, True, OLD, OLD_ADDRESS)
            assert await store.report(app, False, OLD) is True
            await store.claim(app, NEW)
            await store.report(app, True, NEW, NEW_ADDRESS)
            assert await store.get(app) == Record(NEW, True, NEW_ADDRESS)

        await self.run(scenario)

    async def test_untagged_true_then_untagged_false_is_false(self) -> None:
        async def scenario(store: RecordStore) -> None:
            app = new_service()
            await store.report(app, True, None, OLD_ADDRESS)
            assert await store.report(app, False, None) is True
            assert await store.get(app) == Record(None, False)

        await self.run(scenario)

    async def test_true_old_claim_untagged_false_untagged_is_false(self) -> None:
        async def scenario(store: RecordStore) -> None:
            app = new_service()
            await store.report(app, True, OLD, OLD_ADDRESS)
            await store.claim(app, None)
            assert await store.get(app) == Record(None, False)
            assert await store.report(app, False, None) is True
            assert await store.get(app) == Record(None, False)

        await self.run(scenario)

    # beyond the named scenarios

    async def test_records_are_per_service(self) -> None:
        async def scenario(store: RecordStore) -> None:
            first, second = new_service(), new_service()
            await store.report(first, True, OLD, OLD_ADDRESS)
            await store.claim(second, NEW)
            assert await store.get(first) == Record(OLD, True, OLD_ADDRESS)
            assert await store.get(second) == Record(NEW, False)
            await store.clear(first)
            assert await store.get(second) == Record(NEW, False)

        await self.run(scenario)

    @pytest.mark.parametrize(
        ("call", "named"),
        [
            (lambda store: store.claim("", OLD), "service"),
            (lambda store: store.claim("app", 7), "owner"),
            (lambda store: store.report("app", "yes", OLD, OLD_ADDRESS), "registered"),
            (lambda store: store.report("app", False, OLD, OLD_ADDRESS), "address"),
            (lambda store: store.get(None), "service"),
            (lambda store: store.clear(""), "service"),
        ],
    )
    async def test_bad_arguments_are_refused_by_name_and_change_nothing(
        self, call: Callable[[RecordStore], Awaitable[Any]], named: str
    ) -> None:
        async def scenario(store: RecordStore) -> None:
            with pytest.raises(ValueError, match=named):
                await call(store)
            assert await store.get("app") is None

        await self.run(scenario)

    @pytest.mark.parametrize("services", ["app", [], [""]])
    async def test_bad_watch_arguments_are_refused_by_name(self, services: Any) -> None:
        async def scenario(store: RecordStore) -> None:
            with pytest.raises(ValueError, match="service"):
                await anext(store.watch(services))

        await self.run(scenario)

    @settings(
        max_examples=60,
        deadline=None,
        # each store's subclass runs this one method, and a subclass may take its server from
        # a fixture; an example saved by one store replays validly on every other
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.differing_executors,
        ],
    )
    @given(st.lists(operations, max_size=12))
    def test_drawn_sequences_follow_the_reference_rules(
        self, sequence: list[tuple[Any, ...]]
    ) -> None:
        async def scenario(store: RecordStore) -> None:
            app, model = new_service(), ReferenceRecords()
            for operation in sequence:
                assert await apply(store, app, operation) == apply_to_model(model, app, operation)
                assert await store.get(app) == model.get(app), operation

        asyncio.run(self.run(scenario))

    # the watch

    async def test_a_watch_yields_each_state_in_the_order_given_then_every_change(self) -> None:
        async def scenario(store: RecordStore) -> None:
            first, second, other = new_service(), new_service(), new_service()
            await store.report(second, True, OLD, OLD_ADDRESS)
            watch = store.watch([second, first, second])
            assert await take(watch, 2) == [(second, Record(OLD, True, OLD_ADDRESS)), (first, None)]
            await store.report(other, True, OLD, OLD_ADDRESS)  # not watched
            await store.claim(first, NEW)
            await store.report(first, True, NEW, NEW_ADDRESS)
            assert await store.report(second, False, NEW) is False  # dropped: no change
            await store.report(second, False, OLD)
            await store.clear(first)
            assert await take(watch, 4) == [
                (first, Record(NEW, False)),
                (first, Record(NEW, True, NEW_ADDRESS)),
                (second, Record(OLD, False)),
                (first, None),
            ]
            await close(watch)

        await self.run(scenario)

    async def test_a_watch_never_repeats_what_it_last_yielded(self) -> None:
        async def scenario(store: RecordStore) -> None:
            app = new_service()
            watch = store.watch([app])
            assert await take(watch, 1) == [(app, None)]
            await store.report(app, True, OLD, OLD_ADDRESS)
            await store.report(app, True, OLD, OLD_ADDRESS)  # the keeper's periodic re-assert
            await store.clear(app)
            await store.clear(app)
            await store.claim(app, NEW)
            assert await take(watch, 3) == [
                (app, Record(OLD, True, OLD_ADDRESS)),
                (app, None),
                (app, Record(NEW, False)),
            ]
            await close(watch)

        await self.run(scenario)

    async def test_watches_are_independent(self) -> None:
        async def scenario(store: RecordStore) -> None:
            app = new_service()
            early = store.watch([app])
            assert await take(early, 1) == [(app, None)]
            await store.claim(app, OLD)
            late = store.watch([app])
            assert await take(late, 1) == [(app, Record(OLD, False))]
            await close(late)
            await store.report(app, True, OLD, OLD_ADDRESS)
            assert await take(early, 2) == [
                (app, Record(OLD, False)),
                (app, Record(OLD, True, OLD_ADDRESS)),
            ]
            await close(early)

        await self.run(scenario)


async def take(watch: AsyncIterator[T], count: int) -> list[T]:
    return [await asyncio.wait_for(anext(watch), WAIT) for _ in range(count)]


async def close(watch: AsyncIterator[Any]) -> None:
    await watch.aclose()  # type: ignore[attr-defined]


class KeeperContract(StoreHarness):
    """The keeper and reader scenarios 1-7 of issue 5, for a store made by ``make_store``."""

    async def test_scenario1_a_successor_that_never_registers_cannot_pin_a_serving_app_at_false(
        self,
    ) -> None:
        async def scenario(stage: Stage) -> None:
            old_keeper, old = stage.replica(OLD, OLD_ADDRESS)
            await stage.start(old_keeper, old)  # t=0: claimed, registered
            assert await stage.record() == Record(OLD, True, OLD_ADDRESS)
            # the replacement is refused while the predecessor holds the connection, for good
            new_keeper, new = stage.replica(
                NEW, NEW_ADDRESS, register_error=ConnectionError("client already exists")
            )
            await stage.clock.advance_to(20)
            await stage.start(new_keeper, new)
            assert await stage.record() == Record(NEW, False)
            assert await stage.advertised() is None
            await stage.clock.advance_to(59)
            assert await stage.record() == Record(NEW, False)
            await stage.clock.advance_to(60)  # the predecessor's first probe
            assert old.probes == [60]
            assert await stage.record() == Record(OLD, True, OLD_ADDRESS)
            assert await stage.advertised() == OLD_ADDRESS
            assert new.registrations == [20, 50]  # it kept trying, and writes nothing

        await self.stage(scenario)

    async def test_scenario2_the_probe_does_not_re_register_an_app_that_deregistered_itself(
        self,
    ) -> None:
        async def scenario(stage: Stage) -> None:
            keeper, replica = stage.replica(OLD, OLD_ADDRESS)
            await stage.start(keeper, replica)
            await stage.clock.advance_to(30)
            assert await keeper.deregister() is True
            assert await stage.record() == Record(OLD, False)
            # two ticks at which the probe would have been due
            await stage.clock.advance_to(60)
            await stage.clock.advance_to(60 + PROBE_INTERVAL + TICK)
            assert replica.probes == []
            assert await stage.record() == Record(OLD, False)
            assert await stage.advertised() is None
            assert [written for _, _, written in stage.store.writes][-1] == Record(OLD, False)

        await self.stage(scenario)

    @pytest.mark.parametrize("failure", ["answers-false", "raises"])
    async def test_scenario3_a_failing_probe_does_not_assert_the_app_as_registered_and_reconnects(
        self, failure: str
    ) -> None:
        async def scenario(stage: Stage) -> None:
            keeper, replica = stage.replica(OLD, OLD_ADDRESS)
            await stage.start(keeper, replica)
            await stage.store.claim(stage.service, NEW)  # a successor that never comes up
            if failure == "raises":
                replica.probe_error = ConnectionError("the server dropped our registration")
            else:
                replica.probe_answer = False
            await stage.clock.advance_to(60)
            assert replica.probes == [60]
            assert await stage.record() == Record(NEW, False)
            assert replica.registrations == [0]
            assert keeper.address is None
            await stage.clock.advance_to(65)  # the next tick reconnects
            assert replica.registrations == [0, 65]
            assert await stage.record() == Record(OLD, True, OLD_ADDRESS)
            await keeper.deregister()

        await self.stage(scenario)

    async def test_scenario4_a_probe_answered_after_a_deregistration_does_not_re_register(
        self,
    ) -> None:
        async def scenario(stage: Stage) -> None:
            keeper, replica = stage.replica(OLD, OLD_ADDRESS, probe_gate=asyncio.Event())
            await stage.start(keeper, replica)
            advancing = asyncio.create_task(stage.clock.advance_to(60))
            await asyncio.wait_for(replica.probe_entered.wait(), WAIT)  # suspended in probe()
            assert await keeper.deregister() is True
            assert replica.probe_gate is not None
            replica.probe_gate.set()  # the probe's answer arrives
            await advancing
            assert await stage.record() == Record(OLD, False)
            await stage.clock.advance_to(60 + 2 * PROBE_INTERVAL)
            assert replica.probes == [60]
            assert await stage.record() == Record(OLD, False)
            assert await stage.advertised() is None

        await self.stage(scenario)

    async def test_scenario4_readiness_withdrawn_while_the_probe_is_suspended_is_read_after_it(
        self,
    ) -> None:
        async def scenario(stage: Stage) -> None:
            keeper, replica = stage.replica(OLD, OLD_ADDRESS, probe_gate=asyncio.Event())
            await stage.start(keeper, replica)
            await stage.store.claim(stage.service, NEW)
            advancing = asyncio.create_task(stage.clock.advance_to(60))
            await asyncio.wait_for(replica.probe_entered.wait(), WAIT)
            replica.ready = False  # e.g. a sibling went down
            assert replica.probe_gate is not None
            replica.probe_gate.set()  # "yes, still served" — but no longer meant to serve
            await advancing
            assert await stage.record() == Record(NEW, False)
            replica.ready = True
            await stage.clock.advance_to(120)  # ready again: the next probe re-asserts
            assert replica.probes == [60, 120]
            assert await stage.record() == Record(OLD, True, OLD_ADDRESS)
            await keeper.deregister()

        await self.stage(scenario)

    async def test_scenario5_a_replica_that_died_without_deregistering_loses_the_record_at_its_successors_claim(  # noqa: E501
        self,
    ) -> None:
        async def scenario(stage: Stage) -> None:
            # the predecessor's own clock never moves again: it dies after registering
            old_keeper, old = stage.replica(OLD, OLD_ADDRESS, clock=ManualClock())
            await stage.start(old_keeper, old)
            assert await stage.advertised() == OLD_ADDRESS
            new_keeper, new = stage.replica(NEW, NEW_ADDRESS, ready=False)
            await stage.clock.advance_to(100)
            await stage.start(new_keeper, new)  # constructing: claimed, not ready yet
            assert await stage.record() == Record(NEW, False)
            assert await stage.advertised() is None  # the dead address is withdrawn at once
            new.ready = True
            await stage.clock.advance_to(105)
            assert await stage.record() == Record(NEW, True, NEW_ADDRESS)
            assert await stage.advertised() == NEW_ADDRESS
            await new_keeper.deregister()

        await self.stage(scenario)

    async def test_scenario6_a_live_replica_can_deregister_itself(self) -> None:
        async def scenario(stage: Stage) -> None:
            keeper, replica = stage.replica(OLD, OLD_ADDRESS)
            await stage.start(keeper, replica)
            assert await stage.record() == Record(OLD, True, OLD_ADDRESS)
            assert await keeper.deregister() is True
            assert await stage.record() == Record(OLD, False)
            assert await stage.advertised() is None

        await self.stage(scenario)

    async def test_scenario6_a_departed_replicas_late_deregistration_is_dropped(self) -> None:
        async def scenario(stage: Stage) -> None:
            old_keeper, old = stage.replica(OLD, OLD_ADDRESS)
            await stage.start(old_keeper, old)
            new_keeper, new = stage.replica(NEW, NEW_ADDRESS)
            await stage.clock.advance_to(10)
            await stage.start(new_keeper, new)
            assert await stage.record() == Record(NEW, True, NEW_ADDRESS)
            assert await old_keeper.deregister() is False  # the predecessor's late __del__
            assert await stage.record() == Record(NEW, True, NEW_ADDRESS)
            assert await stage.advertised() == NEW_ADDRESS
            await new_keeper.deregister()

        await self.stage(scenario)

    async def test_scenario6_an_untagged_successor_can_claim_from_a_tagged_predecessor_and_then_deregister_itself(  # noqa: E501
        self,
    ) -> None:
        async def scenario(stage: Stage) -> None:
            old_keeper, old = stage.replica(OLD, OLD_ADDRESS, clock=ManualClock())
            await stage.start(old_keeper, old)
            new_keeper, new = stage.replica(None, NEW_ADDRESS, ready=False)
            await stage.start(new_keeper, new)
            assert await stage.record() == Record(None, False)
            new.ready = True
            await stage.clock.advance_to(5)
            assert await stage.record() == Record(None, True, NEW_ADDRESS)
            assert await new_keeper.deregister() is True
            assert await stage.record() == Record(None, False)
            assert await stage.advertised() is None

        await self.stage(scenario)

    async def test_scenario7_no_probe_before_probe_interval_and_probes_at_least_an_interval_apart(
        self,
    ) -> None:
        async def scenario(stage: Stage) -> None:
            # a tick that does not divide the interval: each probe waits for the next tick
            keeper, replica = stage.replica(OLD, OLD_ADDRESS, tick=7)
            await stage.start(keeper, replica)  # registered at t=0
            await stage.clock.advance_to(62)
            assert replica.probes == []
            await stage.clock.advance_to(200)
            assert replica.probes == [63, 126, 189]
            assert all(b - a >= PROBE_INTERVAL for a, b in itertools.pairwise([0, *replica.probes]))
            await keeper.deregister()

        await self.stage(scenario)

    async def test_scenario7_a_failed_registration_is_not_retried_before_backoff(self) -> None:
        async def scenario(stage: Stage) -> None:
            keeper, replica = stage.replica(
                OLD, OLD_ADDRESS, tick=7, register_error=ConnectionError("refused")
            )
            await stage.start(keeper, replica)
            await stage.clock.advance_to(34)
            assert replica.registrations == [0]
            await stage.clock.advance_to(110)
            assert replica.registrations == [0, 35, 70, 105]
            assert await stage.record() == Record(OLD, False)
            replica.register_error = None
            await stage.clock.advance_to(140)
            assert replica.registrations == [0, 35, 70, 105, 140]
            assert await stage.record() == Record(OLD, True, OLD_ADDRESS)
            await keeper.deregister()

        await self.stage(scenario)

    async def test_scenario7_the_wrong_false_window_after_a_successors_claim_is_at_most_an_interval_and_a_tick(  # noqa: E501
        self,
    ) -> None:
        async def scenario(stage: Stage) -> None:
            old_keeper, old = stage.replica(OLD, OLD_ADDRESS, tick=7)
            await stage.start(old_keeper, old)
            await stage.clock.advance_to(63)  # the predecessor's first probe, then at once:
            new_keeper, new = stage.replica(NEW, NEW_ADDRESS, ready=False)
            await stage.start(new_keeper, new)  # a successor's claim, and it never comes up
            claimed = stage.clock.now()
            await stage.clock.advance_to(200)
            healed = stage.store.first_write_after(claimed, Record(OLD, True, OLD_ADDRESS))
            assert healed - claimed == 63 <= PROBE_INTERVAL + 7
            await old_keeper.deregister()

        await self.stage(scenario)

    async def test_scenario7_the_wrong_false_window_after_a_competing_successor_is_at_most_an_interval_and_a_tick(  # noqa: E501
        self,
    ) -> None:
        async def scenario(stage: Stage) -> None:
            # the seed's residual: both generations registered; the predecessor's probe takes
            # the record back, then its deregistration is honoured against the successor
            old_keeper, old = stage.replica(OLD, OLD_ADDRESS, tick=7)
            await stage.start(old_keeper, old)
            await stage.clock.advance_to(14)
            new_keeper, new = stage.replica(NEW, NEW_ADDRESS, tick=7)
            await stage.start(new_keeper, new)  # t=14: registered too
            await stage.clock.advance_to(77)  # old probed at 63, new at 77
            assert (old.probes, new.probes) == ([63], [77])
            assert await stage.record() == Record(NEW, True, NEW_ADDRESS)
            await stage.clock.advance_to(126)  # old's probe took the record back
            assert await stage.record() == Record(OLD, True, OLD_ADDRESS)
            assert await old_keeper.deregister() is True  # honoured: the wrong False
            wrong = stage.clock.now()
            assert await stage.advertised() is None
            await stage.clock.advance_to(300)
            healed = stage.store.first_write_after(wrong, Record(NEW, True, NEW_ADDRESS))
            assert healed - wrong <= PROBE_INTERVAL + 7
            assert healed == 140  # new's probe after the one at 77
            await new_keeper.deregister()

        await self.stage(scenario)
