"""Many dispatches while discovery adds, refreshes and drops workers (issue 3, concurrency)."""

from __future__ import annotations

import asyncio
import random
import uuid
from typing import Any

import pytest

from shardline import NoWorkersAvailable, TransientRpcError, WorkerMetadata, WorkerProxy
from support.fakes import Stream, added
from support.workers import worker

pytestmark = pytest.mark.usefixtures("balancer_protocol")  # each test through both protocols


class Fleet:
    """Connections that check, when used, that they are still the pool's current one."""

    def __init__(self) -> None:
        self.current: dict[uuid.UUID, object] = {}
        self.dropped: set[uuid.UUID] = set()
        self.served: list[tuple[Any, uuid.UUID]] = []
        self.serving_connections: dict[uuid.UUID, set[int]] = {}
        self.violations: list[str] = []

    def connect(self, metadata: WorkerMetadata) -> Connection:
        connection = Connection(self, metadata)
        self.current[metadata.uid] = connection
        return connection


class Connection:
    def __init__(self, fleet: Fleet, metadata: WorkerMetadata) -> None:
        self.fleet, self.metadata = fleet, metadata

    async def dispatch(self, task: Any, *, timeout: float | None = None) -> uuid.UUID:
        uid = self.metadata.uid
        if self.fleet.current.get(uid) is not self:
            self.fleet.violations.append(f"task {task} went through a superseded connection")
        if uid in self.fleet.dropped:
            self.fleet.violations.append(f"task {task} went to {uid} after its drop")
        for _ in range(task % 3 + 1):  # let discovery and other dispatches interleave
            await asyncio.sleep(0)
        self.fleet.served.append((task, uid))
        self.fleet.serving_connections.setdefault(uid, set()).add(id(self))
        return uid


async def test_dispatches_during_churn_use_current_connections_and_none_is_lost() -> None:
    rng = random.Random(7)
    fleet = Fleet()
    stream = Stream()
    stable = [worker(n) for n in range(3)]  # never dropped, so every task can be served
    churning = [worker(n) for n in range(3, 40)]

    async def discovery_churn(proxy: WorkerProxy) -> None:
        for record in churning:
            stream.send("worker-added", record)
            for _ in range(rng.randint(0, 3)):
                await asyncio.sleep(0)
                stream.send("worker-updated", worker(record.uid.int, pid=rng.randint(1, 99)))
            await asyncio.sleep(0)
            moved = rng.choice(stable)
            stream.send("worker-updated", worker(moved.uid.int, pid=rng.randint(1, 99)))
            stream.send("worker-dropped", record)
            # A drop counts once the sentinel has processed it.
            while record.uid in {m.uid for m in proxy.workers}:
                await asyncio.sleep(0)
            fleet.dropped.add(record.uid)

    async def scenario() -> list[uuid.UUID]:
        for record in stable:
            stream.send("worker-added", record)
        async with WorkerProxy(discovery=stream, connect=fleet.connect, quorum=3) as proxy:
            churn = asyncio.create_task(discovery_churn(proxy))
            dispatches = []
            for task in range(400):  # started over the whole churn, not all at once
                dispatches.append(asyncio.create_task(proxy.dispatch(task)))
                await asyncio.sleep(0)
            results = await asyncio.gather(*dispatches)
            await churn
            return list(results)

    results = await scenario()
    assert fleet.violations == []
    assert len(results) == 400
    assert sorted(task for task, _ in fleet.served) == list(range(400))
    assert len({uid for _, uid in fleet.served}) > 3, "the churning workers served some tasks"
    assert any(len(c) > 1 for c in fleet.serving_connections.values()), "refreshes raced dispatches"


async def test_concurrent_round_robin_calls_offer_every_worker_before_giving_up() -> None:
    """Four callers share the rotation and one of four workers always fails transiently: a call
    that started at the failing worker finds the rotation back at its boundary while the
    others took the healthy workers, and must go on to one of them rather than give up."""

    class Flaky:
        def __init__(self, metadata: WorkerMetadata) -> None:
            self.failing = metadata.uid == worker(1).uid

        async def dispatch(self, task: Any, *, timeout: float | None = None) -> str:
            await asyncio.sleep(0)
            if self.failing:
                raise TransientRpcError("unavailable")
            return "served"

    async def scenario() -> tuple[int, int]:
        stream = Stream(*(added(n) for n in range(1, 5)))
        served = given_up = 0
        async with WorkerProxy(discovery=stream, connect=Flaky, quorum=4) as proxy:

            async def caller() -> None:
                nonlocal served, given_up
                for _ in range(200):
                    try:
                        await proxy.dispatch("task")
                        served += 1
                    except NoWorkersAvailable:
                        given_up += 1

            await asyncio.gather(*(caller() for _ in range(4)))
        return served, given_up

    assert await scenario() == (800, 0)
