"""WorkerProxy: the seed's cases 35-50 (`TestWorkerProxy`), over in-process discovery."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncGenerator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardline import (
    DiscoveryEvent,
    LoadBalancerContext,
    NoWorkersAvailable,
    RpcError,
    SelectLoadBalancer,
    TransientRpcError,
    WorkerMetadata,
    WorkerProxy,
)
from support.fakes import Harness, Stream, added, settle
from support.workers import worker

pytestmark = pytest.mark.usefixtures("balancer_protocol")  # each test through both protocols


def test_invalid_combinations_are_refused() -> None:
    for kwargs in ({"lease": 0}, {"quorum": -1}, {"lease": 1, "quorum": 2}, {"quorum_timeout": 0}):
        with pytest.raises(ValueError, match=r"lease|quorum"):
            WorkerProxy(discovery=Stream(), connect=Harness().connect, **kwargs)  # type: ignore[arg-type]


async def test_case35_without_a_lease_every_worker_is_admitted() -> None:
    async def scenario() -> list[WorkerMetadata]:
        stream = Stream(*(added(n) for n in range(20)))
        async with WorkerProxy(discovery=stream, connect=Harness().connect) as proxy:
            await settle()
            return proxy.workers

    assert await scenario() == [worker(n) for n in range(20)]


async def test_case36_a_drop_frees_a_slot_at_capacity() -> None:
    async def scenario() -> list[WorkerMetadata]:
        stream = Stream(added(1), added(2), added(3))
        async with WorkerProxy(discovery=stream, connect=Harness().connect, lease=2) as proxy:
            await settle()
            assert proxy.workers == [worker(1), worker(2)]
            stream.send("worker-dropped", worker(1))
            stream.send("worker-added", worker(3))
            await settle()
            return proxy.workers

    assert await scenario() == [worker(2), worker(3)]


async def test_case37_an_update_never_admits_a_cap_rejected_worker() -> None:
    async def scenario() -> list[WorkerMetadata]:
        stream = Stream(added(1), added(2))
        async with WorkerProxy(discovery=stream, connect=Harness().connect, lease=1) as proxy:
            stream.send("worker-dropped", worker(1))
            stream.send("worker-updated", worker(2, address="moved"))
            await settle()
            return proxy.workers

    assert await scenario() == []


async def test_case38_an_update_refreshes_the_entry() -> None:
    async def scenario() -> tuple[list[WorkerMetadata], str]:
        harness = Harness()
        stream = Stream(added(1))
        async with WorkerProxy(discovery=stream, connect=harness.connect) as proxy:
            stream.send("worker-updated", worker(1, address="moved"))
            await settle()
            return proxy.workers, await proxy.dispatch("task")

    assert await scenario() == ([worker(1, address="moved")], "moved")


async def test_case39_updating_at_capacity_takes_no_slot() -> None:
    async def scenario() -> list[WorkerMetadata]:
        stream = Stream(added(1), added(2))
        async with WorkerProxy(discovery=stream, connect=Harness().connect, lease=2) as proxy:
            stream.send("worker-updated", worker(1, pid=9))
            stream.send("worker-added", worker(3))
            await settle()
            return proxy.workers

    assert await scenario() == [worker(1, pid=9), worker(2)]


async def test_case40_an_update_does_not_resurrect_a_dropped_worker() -> None:
    async def scenario() -> list[WorkerMetadata]:
        stream = Stream(added(1), added(2))
        async with WorkerProxy(discovery=stream, connect=Harness().connect) as proxy:
            stream.send("worker-dropped", worker(1))
            stream.send("worker-updated", worker(1, address="moved"))
            await settle()
            return proxy.workers

    assert await scenario() == [worker(2)]


async def test_case41_a_reannouncement_at_capacity_refreshes_without_a_slot() -> None:
    async def scenario() -> list[WorkerMetadata]:
        stream = Stream(added(1), added(2))
        async with WorkerProxy(discovery=stream, connect=Harness().connect, lease=2) as proxy:
            stream.send("worker-added", worker(2, version="2"))
            stream.send("worker-added", worker(3))
            await settle()
            return proxy.workers

    assert await scenario() == [worker(1), worker(2, version="2")]


events = st.lists(
    st.tuples(
        st.sampled_from(["worker-added", "worker-updated", "worker-dropped"]),
        st.integers(0, 4),
        st.integers(0, 2),
    ),
    max_size=40,
)


@settings(max_examples=100, deadline=None)
@given(drawn=events, lease=st.none() | st.integers(1, 4))
def test_case42_the_sentinel_mirrors_a_uid_keyed_model(
    drawn: list[tuple[str, int, int]], lease: int | None
) -> None:
    async def scenario() -> None:
        stream = Stream()
        proxy = WorkerProxy(discovery=stream, connect=Harness().connect, lease=lease, quorum=0)
        await proxy.start()
        model: dict[uuid.UUID, WorkerMetadata] = {}
        for kind, n, variant in drawn:
            record = worker(n, pid=variant, address="127.0.0.1:9")  # every uid shares an address
            stream.send(kind, record)
            await settle()
            if kind == "worker-dropped":
                model.pop(record.uid, None)
            elif record.uid in model or (
                kind == "worker-added" and (lease is None or len(model) < lease)
            ):
                model[record.uid] = record
            assert proxy.workers == list(model.values())
        await proxy.stop()

    asyncio.run(scenario())


async def test_case43_dispatch_follows_the_refresh() -> None:
    async def scenario() -> str:
        stream = Stream(added(1))
        async with WorkerProxy(discovery=stream, connect=Harness().connect) as proxy:
            stream.send("worker-updated", worker(1, address="new-address"))
            await settle()
            return await proxy.dispatch("task")

    assert await scenario() == "new-address"


class RefreshingConnection:
    """Fails after a refresh of its own worker has landed (the refresh arrives mid-dispatch)."""

    def __init__(self, context: LoadBalancerContext, error: RpcError, harness: Harness) -> None:
        self.context, self.error, self.harness = context, error, harness

    async def dispatch(self, task: Any, *, timeout: float | None = None) -> str:
        fresh = worker(1, address="refreshed")
        self.context.update_worker(fresh, self.harness.connect(fresh))
        raise self.error


@pytest.mark.parametrize(
    ("error", "evicted"), [(RpcError("broken"), True), (TransientRpcError("busy"), False)]
)
async def test_case44_45_a_refresh_mid_dispatch_and_the_two_kinds_of_failure(
    error: RpcError, evicted: bool
) -> None:
    async def scenario() -> tuple[str, list[WorkerMetadata]]:
        harness = Harness()
        stream = Stream(added(1), added(2))
        async with WorkerProxy(discovery=stream, connect=harness.connect, quorum=2) as proxy:
            context = proxy._context
            context.update_worker(worker(1), RefreshingConnection(context, error, harness))
            served = await proxy.dispatch("task")
            return served, proxy.workers

    served, workers = await scenario()
    assert served == worker(2).address  # the survivor served
    if evicted:
        assert workers == [worker(2)]  # the uid is gone, refreshed entry and all
    else:
        assert workers == [worker(1, address="refreshed"), worker(2)]


class SelectThenRefresh:
    """A balancer that names a uid and only then lets a refresh of that worker land."""

    def __init__(self, harness: Harness) -> None:
        self.harness = harness

    async def delegate(
        self, task: Any, *, context: Any
    ) -> AsyncGenerator[uuid.UUID, uuid.UUID | None]:
        chosen = next(iter(context.workers))
        fresh = worker(1, address="after-selection")
        context.update_worker(fresh, self.harness.connect(fresh))
        yield chosen


class SelectingThenRefreshing(SelectLoadBalancer):
    """The same, through ``select``."""

    def __init__(self, harness: Harness) -> None:
        self.harness = harness

    def select(self, task: Any, *, context: Any, tried: Any) -> uuid.UUID | None:
        if tried:
            return None
        chosen = next(iter(context.workers))
        fresh = worker(1, address="after-selection")
        context.update_worker(fresh, self.harness.connect(fresh))
        return chosen  # type: ignore[no-any-return]


@pytest.mark.parametrize("plugin", [SelectThenRefresh, SelectingThenRefreshing])
async def test_case46_a_selection_cannot_carry_a_stale_address(plugin: Any) -> None:
    async def scenario() -> str:
        harness = Harness()
        proxy = harness.proxy(1, loadbalancer=plugin(harness))
        async with proxy:
            return await proxy.dispatch("task")

    assert await scenario() == "after-selection"


class Scripted:
    """Yields the given uids, removing some from the pool right after naming them; records
    what the proxy reported back."""

    def __init__(self, picks: list[tuple[uuid.UUID, bool]]) -> None:
        self.picks = picks
        self.reports: list[str] = []

    async def delegate(
        self, task: Any, *, context: Any
    ) -> AsyncGenerator[uuid.UUID, uuid.UUID | None]:
        for uid, leaves in self.picks:
            if leaves:
                context.remove_worker(context.workers[uid][0])
            try:
                served = yield uid
            except Exception as error:
                self.reports.append(f"failed {type(error).__name__}")
                continue
            self.reports.append("served" if served is not None else "skipped")
            if served is not None:
                return


class ScriptedSelect(SelectLoadBalancer):
    """The same, through ``select``: what became of each candidate is read from ``tried``."""

    def __init__(self, picks: list[tuple[uuid.UUID, bool]]) -> None:
        self.picks = picks
        self.reports: list[str] = []

    def select(self, task: Any, *, context: Any, tried: Any) -> uuid.UUID | None:
        if tried:
            outcome = list(tried.values())[-1]
            self.reports.append("skipped" if outcome is None else f"failed {outcome}")
        if len(tried) == len(self.picks):
            return None
        uid, leaves = self.picks[len(tried)]
        if leaves:
            context.remove_worker(context.workers[uid][0])
        return uid


@pytest.mark.parametrize(
    ("plugin", "reports"), [(Scripted, ["skipped", "served"]), (ScriptedSelect, ["skipped"])]
)
async def test_case47_a_departed_candidate_is_skipped_not_failed(
    plugin: Any, reports: list[str]
) -> None:
    balancer = plugin([(worker(1).uid, True), (worker(2).uid, False)])

    async def scenario() -> str:
        stream = Stream(added(1), added(2))
        proxy = WorkerProxy(
            discovery=stream, connect=Harness().connect, loadbalancer=balancer, quorum=2
        )
        async with proxy:
            return await proxy.dispatch("task")

    assert await scenario() == worker(2).address
    assert balancer.reports == reports


@pytest.mark.parametrize("plugin", [Scripted, ScriptedSelect])
async def test_case48_skipping_cannot_loop_forever(plugin: Any) -> None:
    balancer = plugin([(worker(1).uid, True)])  # the sole worker leaves once selected

    async def scenario() -> None:
        stream = Stream(added(1))
        proxy = WorkerProxy(discovery=stream, connect=Harness().connect, loadbalancer=balancer)
        async with proxy:
            await proxy.dispatch("task")

    with pytest.raises(NoWorkersAvailable):
        await scenario()
    assert balancer.reports == ["skipped"]


async def test_case48_with_round_robin_a_departed_sole_worker_ends_the_call() -> None:
    async def scenario() -> None:
        async with WorkerProxy(discovery=Stream(added(1)), connect=Harness().connect) as proxy:
            proxy._context.remove_worker(worker(1))
            await proxy.dispatch("task")

    with pytest.raises(NoWorkersAvailable):
        await scenario()


class LegacyEvicting:
    """A balancer from the mutable-context era: it evicts with a changed record."""

    async def delegate(
        self, task: Any, *, context: Any
    ) -> AsyncGenerator[uuid.UUID, uuid.UUID | None]:
        for uid in list(context.workers):
            metadata, _ = context.workers[uid]
            context.remove_worker(worker(int(uid.int), address=metadata.address + "-changed"))
        return
        yield


async def test_case49_a_legacy_balancer_evicting_with_a_changed_record() -> None:
    async def scenario() -> list[WorkerMetadata]:
        proxy = WorkerProxy(
            discovery=Stream(added(1)), connect=Harness().connect, loadbalancer=LegacyEvicting
        )
        async with proxy:
            with pytest.raises(NoWorkersAvailable):
                await proxy.dispatch("task")
            return proxy.workers

    assert await scenario() == []


async def test_case50_an_update_only_stream_never_reaches_quorum() -> None:

    stream = Stream(DiscoveryEvent("worker-updated", worker(1)))
    proxy = WorkerProxy(discovery=stream, connect=Harness().connect, quorum_timeout=0.05)
    with pytest.raises(TimeoutError, match="0 of the 1"):
        await proxy.start()
    assert proxy._sentinel is None
    assert not [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]


async def test_other_exceptions_propagate_and_leave_the_pool_alone() -> None:
    async def scenario() -> list[WorkerMetadata]:
        harness = Harness()
        async with harness.proxy(1) as proxy:
            harness.connections[worker(1).address].failure = KeyError("bug in the task")
            with pytest.raises(KeyError, match="bug in the task"):
                await proxy.dispatch("task")
            return proxy.workers

    assert await scenario() == [worker(1)]


class YieldsAfterSuccess:
    async def delegate(
        self, task: Any, *, context: Any
    ) -> AsyncGenerator[uuid.UUID, uuid.UUID | None]:
        uid = next(iter(context.workers))
        yield uid
        yield uid


async def test_yielding_after_a_success_is_a_protocol_violation() -> None:
    async def scenario() -> None:
        proxy = WorkerProxy(
            discovery=Stream(added(1)), connect=Harness().connect, loadbalancer=YieldsAfterSuccess()
        )
        async with proxy:
            await proxy.dispatch("task")

    with pytest.raises(RuntimeError, match="after a success"):
        await scenario()


async def test_every_change_to_the_pool_is_logged_at_info(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        harness = Harness()
        stream = Stream(added(1), added(2), added(3))
        async with WorkerProxy(discovery=stream, connect=harness.connect, lease=2) as proxy:
            await settle()
            stream.send("worker-updated", worker(1, address="127.0.0.1:6001"))
            stream.send("worker-dropped", worker(2))
            await settle()
            harness.connections["127.0.0.1:6001"].failure = RpcError("speaks another protocol")
            with pytest.raises(NoWorkersAvailable):
                await proxy.dispatch("task")

    with caplog.at_level(logging.INFO, logger="shardline.proxy"):
        await scenario()
    lines = [record.getMessage() for record in caplog.records if record.name == "shardline.proxy"]
    assert all(record.levelno == logging.INFO for record in caplog.records), caplog.records
    assert lines == [
        f"worker {worker(1).uid} at 127.0.0.1:5001 admitted",
        f"worker {worker(2).uid} at 127.0.0.1:5002 admitted",
        f"worker {worker(3).uid} not admitted: the pool is at its lease",
        f"worker {worker(1).uid} refreshed: now at 127.0.0.1:6001",
        f"worker {worker(2).uid} at 127.0.0.1:5002 dropped by discovery",
        f"worker {worker(1).uid} at 127.0.0.1:6001 evicted: speaks another protocol",
    ]


async def test_a_call_out_of_candidates_names_what_it_tried_and_chains_the_last_failure() -> None:
    async def scenario() -> NoWorkersAvailable:
        harness = Harness()
        async with harness.proxy(*range(1, 11)) as proxy:
            for connection in harness.connections.values():
                connection.failure = TransientRpcError("busy")
            harness.connections["127.0.0.1:5003"].failure = RpcError("broke")
            with pytest.raises(NoWorkersAvailable) as raised:
                await proxy.dispatch("task")
            return raised.value

    error = await scenario()
    message = str(error)
    assert message.startswith("no worker could take the task 'task': tried ")
    assert f"{worker(3).uid} (RpcError)" in message
    assert f"{worker(1).uid} (TransientRpcError)" in message
    assert message.endswith(" and 2 more")  # 10 tried, 8 shown
    assert isinstance(error.__cause__, TransientRpcError | RpcError)
