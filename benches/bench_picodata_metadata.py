"""Keyed INSERTs routed from Picodata's query metadata (issue 27): shardline with no key, with
``key=``, and picopyn 3.2.0's auto-routed ``Pool.execute``, interleaved.

On the stand-in cluster of ``picodata_standin.py`` (one PostgreSQL playing 3 replicasets x 2
instances, ``inet_server_addr()`` telling which instance ran a query). PostgreSQL cannot send
Picodata's metadata NOTICE, so each client is given what Picodata sends for the statement
(``PreparedStatementMetadata``: tier ``default``, ``dk_meta`` ``[[1, 20]]``, the key ``$1`` an
integer) through its own entry point: shardline's notice listener (``Client._on_notice``, the
code a NOTICE reaches), picopyn's metadata cache (the hook ``bench_picodata_client.py`` uses). The
statement: ``INSERT INTO users (id, name, landed_on) VALUES ($1, $2, inet_server_addr())``, each
id once in the module.

- shardline ``execute(INSERT, id, name)``: no key, routed by the statement's metadata;
- shardline ``execute(INSERT, id, name, key=id)``;
- the same as the first through a client made without ``pipeline=True`` (the two above are
  pipelined: the callers' INSERTs to one instance share a connection and go out in one
  write, each its own transaction; ``shardline/picodata/pipeline.py``), the baseline of the
  pipelining;
- picopyn ``Pool(enable_discovery=True, max_size=96)`` (16 per instance, as shardline's bound)
  ``.execute(INSERT, id, name)``: its own routing from the same metadata.

Groups (benchmark thread on one CPU, the server's processes on the other, as the issue-11
groups ``separate CPUs``): ``keyed INSERT from metadata, 16 in flight``: 16 callers, 25 inserts
each per way and round: calls/s, this process's CPU per call and the server's (its processes'
``schedstat``, read before and after each way's turn); ``keyed INSERT from metadata,
1 in flight``: each id through one way, the ways in turn: p50 and p99. Every write's
``landed_on`` is checked against the key's master after the group (``off_master`` per way).
In both groups the ways take turns in an order that changes every round (``_order``).
Goals (issue 27): from metadata within 1.1x of ``key=`` (throughput, CPU per call, p50), and
at least 2x picopyn's throughput.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("pytest_benchmark")
pytest.importorskip("picopyn")

from picopyn.asynchronous.pool import Pool as PicopynPool
from picopyn.query_metadata import PreparedStatementMetadata

import shardline.picodata

from .benchkit import percentiles, ratio_summary, spread
from .picodata_standin import OID_INT8, TIER, StandinCluster
from .placement import placed

CALLERS = 16
PER_CALLER = 25
FLIGHT_ROUNDS = 30
FLIGHT_WARMUP = 3
SINGLE_PER_ROUND = 48
SINGLE_ROUNDS = 40
SINGLE_WARMUP = 3
WAIT = 60.0
PLACEMENT = "separate CPUs"

INSERT = "INSERT INTO users (id, name, landed_on) VALUES ($1, $2, inet_server_addr())"
NOTICE = json.dumps(
    {"type": "PreparedStatementMetadata", "query": INSERT, "tier": TIER, "dk_meta": [[1, OID_INT8]]}
)
IDS = itertools.count(10**12)  # each users.id written once in the module

FROM_METADATA = "shardline: execute(), routed from metadata"
KEYED = "shardline: execute(key=)"
NOT_PIPELINED = "shardline: execute(), routed from metadata, not pipelined"
PICOPYN = "picopyn: Pool.execute (auto-routed)"


@dataclass
class Ways:
    cluster: StandinCluster
    loop: asyncio.AbstractEventLoop
    db: shardline.picodata.Client
    plain: shardline.picodata.Client
    picopyn: PicopynPool
    written: dict[str, list[int]]

    def run(self, coroutine: Awaitable[Any]) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coroutine, WAIT))

    def calls(self) -> dict[str, Callable[[int], Awaitable[Any]]]:
        db, plain, pool = self.db, self.plain, self.picopyn

        async def from_metadata(key: int) -> Any:
            return await db.execute(INSERT, key, "x")

        async def keyed(key: int) -> Any:
            return await db.execute(INSERT, key, "x", key=key)

        async def not_pipelined(key: int) -> Any:
            return await plain.execute(INSERT, key, "x")

        async def picopyn(key: int) -> Any:
            return await pool.execute(INSERT, key, "x")

        return {
            FROM_METADATA: from_metadata,
            KEYED: keyed,
            NOT_PIPELINED: not_pipelined,
            PICOPYN: picopyn,
        }

    def off_master(self) -> dict[str, int]:
        rows = self.run(
            self.db.fetch("SELECT id, host(landed_on) FROM users WHERE id >= $1", 10**12)
        )
        landed = dict(rows)
        return {
            name: sum(landed[key] != self.cluster.expected_host(key) for key in keys)
            for name, keys in self.written.items()
        }


@pytest.fixture(scope="module")
def ways() -> Iterator[Ways]:
    cluster = StandinCluster()
    loop = asyncio.new_event_loop()

    async def open_all() -> Ways:
        db = await shardline.picodata.connect(cluster.dsn, tier=TIER, pipeline=True)
        plain = await shardline.picodata.connect(cluster.dsn, tier=TIER)
        for client in (db, plain):  # what Picodata sends on Parse
            client._on_notice(None, SimpleNamespace(message=NOTICE))
        pool = PicopynPool(cluster.picopyn_dsn, enable_discovery=True, max_size=96)
        await pool.open()
        service = pool._query_metadata_service
        assert service is not None
        service._cache.set(PreparedStatementMetadata(INSERT, TIER, [(1, OID_INT8)]))
        written: dict[str, list[int]] = {
            FROM_METADATA: [],
            KEYED: [],
            NOT_PIPELINED: [],
            PICOPYN: [],
        }
        return Ways(cluster, loop, db, plain, pool, written)

    opened = loop.run_until_complete(asyncio.wait_for(open_all(), WAIT))
    try:
        yield opened
    finally:
        opened.run(opened.db.close())
        opened.run(opened.plain.close())
        opened.run(opened.picopyn.close())
        loop.close()
        cluster.close()


def _order(names: list[str], turn: int) -> list[str]:
    """The ways in the order of ``turn``: a rotation, so each way takes each place in turn, run
    backwards every other cycle, so each way also follows each of the others (two ways measured
    one after the other share warm connections and caches: in a fixed cyclic order one way
    always came right after the same one)."""
    start = turn % len(names)
    order = names[start:] + names[:start]
    return order[::-1] if (turn // len(names)) % 2 else order


def _ratio(a: list[float], b: list[float]) -> dict[str, float]:
    return ratio_summary([x / y for x, y in zip(a, b, strict=True)])


def test_insert_from_metadata_16_in_flight(benchmark: Any, ways: Ways) -> None:
    calls = ways.calls()
    names = list(calls)
    per_s: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    server_cpu: dict[str, list[float]] = {name: [] for name in names}
    rounds = itertools.count()

    async def flight(name: str) -> None:
        call = calls[name]

        async def caller() -> None:
            for _ in range(PER_CALLER):
                key = next(IDS)
                ways.written[name].append(key)
                assert await call(key) == "INSERT 0 1"

        await asyncio.gather(*(caller() for _ in range(CALLERS)))

    def round_() -> None:
        for name in _order(names, next(rounds)):
            server0 = ways.cluster.server_cpu_ns()
            cpu0, t0 = time.process_time(), time.perf_counter()
            ways.run(flight(name))
            wall, busy = time.perf_counter() - t0, time.process_time() - cpu0
            served = ways.cluster.server_cpu_ns() - server0
            per_s[name].append(CALLERS * PER_CALLER / wall)
            cpu[name].append(busy / (CALLERS * PER_CALLER) * 1e6)
            server_cpu[name].append(served / (CALLERS * PER_CALLER) / 1e3)

    from_metadata_before = ways.db.stats().from_metadata
    pipelines = [pool.pipeline for pool in ways.db._pools.values()]
    sent_before = sum(p.queries for p in pipelines if p is not None)
    writes_before = sum(p.writes for p in pipelines if p is not None)
    benchmark.group = "keyed INSERT from metadata, 16 in flight"
    with placed(ways.cluster.server_pids(), PLACEMENT):
        benchmark.pedantic(round_, rounds=FLIGHT_ROUNDS, warmup_rounds=FLIGHT_WARMUP, iterations=1)
    kept = {name: samples[-FLIGHT_ROUNDS:] for name, samples in per_s.items()}
    kept_cpu = {name: samples[-FLIGHT_ROUNDS:] for name, samples in cpu.items()}
    kept_server = {name: samples[-FLIGHT_ROUNDS:] for name, samples in server_cpu.items()}
    stats = ways.db.stats()
    pipelines = [pool.pipeline for pool in ways.db._pools.values()]
    sent = sum(p.queries for p in pipelines if p is not None) - sent_before
    writes = sum(p.writes for p in pipelines if p is not None) - writes_before
    off_master = ways.off_master()
    benchmark.extra_info.update(
        impl=f"{len(names)} ways interleaved, {CALLERS} callers, {PLACEMENT}",
        calls_per_round=len(names) * CALLERS * PER_CALLER,
        by_way={
            name: {
                "calls_per_s": spread(kept[name]),
                "client_cpu_us_per_call": spread(kept_cpu[name]),
                "server_cpu_us_per_call": spread(kept_server[name]),
                "off_master": off_master[name],
            }
            for name in names
        },
        ratios={
            "from metadata / key=, throughput": _ratio(kept[FROM_METADATA], kept[KEYED]),
            "from metadata / key=, client CPU per call": _ratio(
                kept_cpu[FROM_METADATA], kept_cpu[KEYED]
            ),
            "from metadata / picopyn, throughput": _ratio(kept[FROM_METADATA], kept[PICOPYN]),
            "key= / picopyn, throughput": _ratio(kept[KEYED], kept[PICOPYN]),
            "not pipelined / picopyn, throughput": _ratio(kept[NOT_PIPELINED], kept[PICOPYN]),
            "from metadata / not pipelined, throughput": _ratio(
                kept[FROM_METADATA], kept[NOT_PIPELINED]
            ),
            "from metadata / not pipelined, server CPU per call": _ratio(
                kept_server[FROM_METADATA], kept_server[NOT_PIPELINED]
            ),
        },
        pipelined_queries=sent,
        pipelined_queries_per_write=round(sent / writes, 2) if writes else None,
        shardline_from_metadata=stats.from_metadata - from_metadata_before,
        shardline_fallbacks=dict(stats.fallbacks),
    )
    assert off_master[FROM_METADATA] == 0
    assert off_master[KEYED] == 0
    assert off_master[NOT_PIPELINED] == 0
    # the pipelined client's INSERTs were pipelined: as many as the measured rounds' at least
    assert sent >= 2 * CALLERS * PER_CALLER * FLIGHT_ROUNDS
    assert stats.from_metadata - from_metadata_before == len(ways.written[FROM_METADATA])


def test_insert_from_metadata_1_in_flight(benchmark: Any, ways: Ways) -> None:
    calls = ways.calls()
    names = list(calls)
    times: dict[str, list[float]] = {name: [] for name in names}
    turns = itertools.count()

    async def round_of_turns() -> None:
        for _ in range(SINGLE_PER_ROUND):
            for name in _order(names, next(turns)):
                key = next(IDS)
                ways.written[name].append(key)
                t0 = time.perf_counter_ns()
                assert await calls[name](key) == "INSERT 0 1"
                times[name].append((time.perf_counter_ns() - t0) / 1e9)

    benchmark.group = "keyed INSERT from metadata, 1 in flight"
    with placed(ways.cluster.server_pids(), PLACEMENT):
        benchmark.pedantic(
            lambda: ways.run(round_of_turns()),
            rounds=SINGLE_ROUNDS,
            warmup_rounds=SINGLE_WARMUP,
            iterations=1,
        )
    kept = {name: samples[-SINGLE_ROUNDS * SINGLE_PER_ROUND :] for name, samples in times.items()}
    by_way = {name: percentiles(samples) for name, samples in kept.items()}
    off_master = ways.off_master()
    benchmark.extra_info.update(
        impl=f"{len(names)} ways in turn, 1 caller, {PLACEMENT}",
        calls_per_round=len(names) * SINGLE_PER_ROUND,
        by_way={name: {**by_way[name], "off_master": off_master[name]} for name in names},
        ratios={
            "from metadata / key=, p50": round(
                by_way[FROM_METADATA]["p50_ns"] / by_way[KEYED]["p50_ns"], 3
            ),
            "from metadata / picopyn, p50": round(
                by_way[FROM_METADATA]["p50_ns"] / by_way[PICOPYN]["p50_ns"], 3
            ),
        },
    )
    assert off_master[FROM_METADATA] == 0
