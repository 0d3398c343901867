"""RegistrationKeeper beyond the issue's scenarios (those are in `registration_contract.py`):
arguments, lifecycle, errors in the loop, the order of its last writes, and the bound on the
wrong-False window over drawn timings."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardline.registration import (
    MemoryRecordStore,
    MonotonicClock,
    Record,
    RecordStore,
    RegistrationKeeper,
)
from support.registration_contract import (
    BACKOFF,
    NEW,
    NEW_ADDRESS,
    OLD,
    OLD_ADDRESS,
    PROBE_INTERVAL,
    TICK,
    WAIT,
    ManualClock,
    Replica,
    Stage,
)

T = TypeVar("T")


async def on_stage(
    scenario: Callable[[Stage], Awaitable[T]], store: RecordStore | None = None
) -> T:
    stage = Stage(store or MemoryRecordStore(), ManualClock())
    return await asyncio.wait_for(scenario(stage), WAIT)


class HeldStore(MemoryRecordStore):
    """A memory store whose writes of one kind wait for ``release`` before taking effect."""

    def __init__(self, held: str) -> None:
        super().__init__()
        self.held = held
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def _hold(self, kind: str) -> None:
        if kind == self.held:
            self.entered.set()
            await self.release.wait()

    async def claim(self, service: str, owner: str | None) -> None:
        await self._hold("claim")
        await super().claim(service, owner)

    async def report(
        self, service: str, registered: bool, owner: str | None, address: str | None = None
    ) -> bool:
        await self._hold("report-true" if registered else "report-false")
        return await super().report(service, registered, owner, address)


class FlakyStore(MemoryRecordStore):
    """A memory store whose first write of True fails (ConnectionError "store unavailable")."""

    failures = 1

    async def report(
        self, service: str, registered: bool, owner: str | None, address: str | None = None
    ) -> bool:
        if registered and self.failures:
            self.failures -= 1
            raise ConnectionError("store unavailable")
        return await super().report(service, registered, owner, address)


class HeldRegistration:
    """The keeper's registration call, held: records its time on ``replica``, then waits for
    ``release`` before answering ``OLD_ADDRESS``."""

    def __init__(self, stage: Stage, replica: Replica) -> None:
        self.stage = stage
        self.replica = replica
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self) -> str:
        self.replica.registrations.append(self.stage.clock.now())
        self.entered.set()
        await self.release.wait()
        return OLD_ADDRESS


async def noop_register() -> str:
    return OLD_ADDRESS


async def noop_probe() -> bool:
    return True


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"service": ""}, "service"),
        ({"service": 7}, "service"),
        ({"owner": 7}, "owner"),
        ({"tick": 0}, "tick"),
        ({"tick": -1.0}, "tick"),
        ({"tick": math.nan}, "tick"),
        ({"tick": math.inf}, "tick"),
        ({"tick": True}, "tick"),
        ({"probe_interval": 0}, "probe_interval"),
        ({"probe_interval": "60"}, "probe_interval"),
        ({"backoff": -1}, "backoff"),
    ],
)
def test_bad_arguments_are_refused_by_name(arguments: dict[str, Any], named: str) -> None:
    options: dict[str, Any] = {"service": "app", "owner": OLD, **arguments}
    with pytest.raises(ValueError, match=named):
        RegistrationKeeper(
            options.pop("service"),
            options.pop("owner"),
            MemoryRecordStore(),
            register=noop_register,
            probe=noop_probe,
            is_ready=lambda: True,
            **options,
        )


def test_a_zero_backoff_and_the_real_time_clock_by_default() -> None:
    keeper = RegistrationKeeper(
        "app",
        None,
        MemoryRecordStore(),
        register=noop_register,
        probe=noop_probe,
        is_ready=lambda: True,
        backoff=0,
    )
    assert isinstance(keeper._clock, MonotonicClock)
    assert (keeper.service, keeper.owner, keeper.address) == ("app", None, None)


async def test_a_keeper_starts_once_and_never_after_deregistering() -> None:
    async def scenario(stage: Stage) -> None:
        keeper, replica = stage.replica(OLD, OLD_ADDRESS)
        await stage.start(keeper, replica)
        with pytest.raises(RuntimeError, match="already started"):
            await keeper.start()
        await keeper.deregister()
        with pytest.raises(RuntimeError, match="deregistered"):
            await keeper.start()
        assert await stage.record() == Record(OLD, False)

    await on_stage(scenario)


async def test_async_with_starts_and_deregisters() -> None:
    async def scenario(stage: Stage) -> None:
        keeper, _ = stage.replica(OLD, OLD_ADDRESS)
        async with keeper:
            await stage.clock.wait_until(lambda: stage.clock.sleeps > 0)
            assert await stage.record() == Record(OLD, True, OLD_ADDRESS)
            assert keeper.address == OLD_ADDRESS
        assert await stage.record() == Record(OLD, False)
        assert keeper.address is None

    await on_stage(scenario)


async def test_a_tick_while_not_ready_does_nothing() -> None:
    async def scenario(stage: Stage) -> None:
        keeper, replica = stage.replica(OLD, OLD_ADDRESS, ready=False)
        await stage.start(keeper, replica)
        await stage.clock.advance_to(100)
        assert (replica.registrations, replica.probes) == ([], [])
        assert [written for _, _, written in stage.store.writes] == [Record(OLD, False)]
        replica.ready = True
        await stage.clock.advance_to(105)
        assert replica.registrations == [105]
        replica.ready = False  # past two due probes: still nothing
        await stage.clock.advance_to(105 + 2 * PROBE_INTERVAL + TICK)
        assert replica.probes == []
        assert len(stage.store.writes) == 2
        replica.ready = True  # the overdue probe comes at the next tick
        await stage.clock.advance(TICK)
        assert replica.probes == [stage.clock.now()]
        await keeper.deregister()

    await on_stage(scenario)


async def test_register_answering_no_address_is_a_failed_registration(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario(stage: Stage) -> None:
        keeper, replica = stage.replica(OLD, "")
        await stage.start(keeper, replica)
        await stage.clock.advance_to(29)
        assert replica.registrations == [0]
        assert await stage.record() == Record(OLD, False)

    with caplog.at_level(logging.WARNING, "shardline.registration"):
        await on_stage(scenario)
    assert "register() returned '', not an address" in caplog.text


async def test_an_error_in_a_tick_is_logged_and_the_loop_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario(stage: Stage) -> None:
        keeper, replica = stage.replica(OLD, OLD_ADDRESS)
        answers = iter([RuntimeError("readiness unknown")])

        def is_ready() -> bool:
            error = next(answers, None)
            if error is not None:
                raise error
            return True

        keeper._is_ready = is_ready
        await stage.start(keeper, replica)
        assert replica.registrations == []
        await stage.clock.advance_to(5)
        assert replica.registrations == [5]
        assert await stage.record() == Record(OLD, True, OLD_ADDRESS)
        await keeper.deregister()

    with caplog.at_level(logging.ERROR, "shardline.registration"):
        await on_stage(scenario)
    assert "readiness unknown" in caplog.text


async def test_a_failed_write_of_true_is_logged_and_made_again_after_the_next_probe(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario(stage: Stage) -> None:
        keeper, replica = stage.replica(OLD, OLD_ADDRESS)
        await stage.start(keeper, replica)
        assert await stage.record() == Record(OLD, False)
        assert keeper.address == OLD_ADDRESS  # registered; only the record is behind
        await stage.clock.advance_to(60)
        assert replica.registrations == [0]
        assert await stage.record() == Record(OLD, True, OLD_ADDRESS)
        await keeper.deregister()

    with caplog.at_level(logging.WARNING, "shardline.registration"):
        await on_stage(scenario, FlakyStore())
    assert "store unavailable" in caplog.text


async def test_stats_count_registrations_probes_and_reports_by_result() -> None:
    def counted(keeper: RegistrationKeeper) -> tuple[object, ...]:
        s = keeper.stats
        return (
            s.registered,
            (s.registrations, s.registration_failures),
            (s.probes, s.probe_failures),
            (s.reports, s.report_failures),
        )

    async def scenario(stage: Stage) -> list[tuple[object, ...]]:
        keeper, replica = stage.replica(OLD, OLD_ADDRESS)
        seen = [counted(keeper)]
        await stage.start(keeper, replica)  # registered, its write of True failed
        seen.append(counted(keeper))
        await stage.clock.advance_to(PROBE_INTERVAL)  # a probe served: True written
        seen.append(counted(keeper))
        replica.probe_answer = False
        replica.register_error = ConnectionError("refused")
        # not served: dropped; the next tick's registration fails
        await stage.clock.advance_to(2 * PROBE_INTERVAL + TICK)
        seen.append(counted(keeper))
        replica.register_error = None
        # the first tick past the backoff registers again
        await stage.clock.advance_to(2 * PROBE_INTERVAL + TICK + BACKOFF + TICK)
        seen.append(counted(keeper))
        await keeper.deregister()
        return seen

    assert await on_stage(scenario, FlakyStore()) == [
        (False, (0, 0), (0, 0), (0, 0)),
        (True, (1, 0), (0, 0), (0, 1)),
        (True, (1, 0), (1, 0), (1, 1)),
        (False, (1, 1), (1, 1), (1, 1)),
        (True, (2, 1), (1, 1), (2, 1)),
    ]


async def test_deregistering_during_a_write_of_true_waits_for_it_so_false_lands_last() -> None:
    store = HeldStore("report-true")

    async def scenario(stage: Stage) -> None:
        keeper, _ = stage.replica(OLD, OLD_ADDRESS)
        await keeper.start()
        await asyncio.wait_for(store.entered.wait(), WAIT)  # the first tick's write, held
        deregistering = asyncio.ensure_future(keeper.deregister())
        await asyncio.sleep(0)
        assert not deregistering.done()
        store.release.set()
        assert await deregistering is True
        assert await stage.record() == Record(OLD, False)
        assert [written for _, _, written in stage.store.writes] == [
            Record(OLD, False),
            Record(OLD, True, OLD_ADDRESS),
            Record(OLD, False),
        ]

    await on_stage(scenario, store)


async def test_a_deregistration_during_the_claim_starts_no_loop() -> None:
    store = HeldStore("claim")

    async def scenario(stage: Stage) -> None:
        keeper, replica = stage.replica(OLD, OLD_ADDRESS)
        starting = asyncio.ensure_future(keeper.start())
        await asyncio.wait_for(store.entered.wait(), WAIT)
        assert await keeper.deregister() is True
        store.release.set()
        await starting
        await stage.clock.advance_to(200)
        assert (replica.registrations, stage.clock.sleeps) == ([], 0)
        assert await stage.record() == Record(OLD, False)

    await on_stage(scenario, store)


async def test_a_registration_answered_after_a_deregistration_writes_nothing() -> None:
    async def scenario(stage: Stage) -> None:
        keeper, replica = stage.replica(OLD, OLD_ADDRESS)
        held = HeldRegistration(stage, replica)
        keeper._register = held
        await keeper.start()
        await asyncio.wait_for(held.entered.wait(), WAIT)
        assert await keeper.deregister() is True
        held.release.set()
        await asyncio.sleep(0)
        await stage.clock.advance_to(200)
        assert await stage.record() == Record(OLD, False)
        assert [written for _, _, written in stage.store.writes] == [
            Record(OLD, False),
            Record(OLD, False),
        ]

    await on_stage(scenario)


async def test_a_registration_answered_after_readiness_was_withdrawn_is_asserted_by_the_probe():
    async def scenario(stage: Stage) -> None:
        keeper, replica = stage.replica(OLD, OLD_ADDRESS)
        held = HeldRegistration(stage, replica)
        keeper._register = held
        starting = asyncio.ensure_future(stage.start(keeper, replica))
        await asyncio.wait_for(held.entered.wait(), WAIT)
        replica.ready = False
        held.release.set()
        await starting
        assert await stage.record() == Record(OLD, False)
        assert keeper.address == OLD_ADDRESS
        replica.ready = True
        await stage.clock.advance_to(60)
        assert replica.registrations == [0]
        assert replica.probes == [60]
        assert await stage.record() == Record(OLD, True, OLD_ADDRESS)
        await keeper.deregister()

    await on_stage(scenario)


# -- the bound on the wrong-False window, over drawn timings ------------------------------------

timings = st.tuples(st.integers(2, 20), st.integers(1, 120))  # tick, probe_interval


@settings(max_examples=60, deadline=None)
@given(timings, st.integers(0, 400))
def test_a_successors_claim_is_healed_within_one_probe_interval_plus_one_tick(
    timing: tuple[int, int], claim_at: int
) -> None:
    tick, interval = timing

    async def scenario(stage: Stage) -> None:
        old_keeper, old = stage.replica(OLD, OLD_ADDRESS, tick=tick, probe_interval=interval)
        await stage.start(old_keeper, old)
        await stage.clock.advance_to(claim_at)
        new_keeper, new = stage.replica(NEW, NEW_ADDRESS, ready=False)
        await stage.start(new_keeper, new)  # a successor that never comes up
        await stage.clock.advance_to(claim_at + interval + tick)
        healed = stage.store.first_write_after(claim_at, Record(OLD, True, OLD_ADDRESS))
        assert healed - claim_at <= interval + tick
        assert await stage.record() == Record(OLD, True, OLD_ADDRESS)

    asyncio.run(on_stage(scenario))


@settings(max_examples=60, deadline=None)
@given(timings, timings, st.integers(0, 200), st.integers(0, 400))
def test_a_competing_successors_wrong_false_is_healed_within_its_probe_interval_plus_its_tick(
    old_timing: tuple[int, int],
    new_timing: tuple[int, int],
    successor_at: int,
    deregister_after: int,
) -> None:
    async def scenario(stage: Stage) -> None:
        tick, interval = new_timing
        old_keeper, old = stage.replica(
            OLD, OLD_ADDRESS, tick=old_timing[0], probe_interval=old_timing[1]
        )
        await stage.start(old_keeper, old)
        await stage.clock.advance_to(successor_at)
        new_keeper, new = stage.replica(NEW, NEW_ADDRESS, tick=tick, probe_interval=interval)
        await stage.start(new_keeper, new)
        await stage.clock.advance(deregister_after)
        if await old_keeper.deregister():  # honoured whenever old had taken the record back
            wrong = stage.clock.now()
            await stage.clock.advance_to(wrong + interval + tick)
            healed = stage.store.first_write_after(wrong, Record(NEW, True, NEW_ADDRESS))
            assert healed - wrong <= interval + tick
        assert await stage.record() == Record(NEW, True, NEW_ADDRESS)

    asyncio.run(on_stage(scenario))
