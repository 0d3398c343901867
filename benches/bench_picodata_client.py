"""Routed SQL (issue 11): shardline's Picodata client beside raw asyncpg and picopyn 3.2.0.

Everything runs on the stand-in cluster of ``picodata_standin.py``: one PostgreSQL server
playing 3 replicasets x 2 instances (one loopback address each, so ``inet_server_addr()`` tells
which instance a query reached), the catalog of ``tests/support/picodata_catalog.py`` in it. All the
clients live in one process and one asyncio event loop (the default one) and are opened once
for the module:

- ``floor``: 16 raw ``asyncpg`` connections to the server (caller ``c`` uses connection ``c``:
  no pool, no routing);
- ``routed floor``: 16 raw ``asyncpg`` connections to each master's address, a key's taken
  from its master's list (a dict lookup of a bucket owner computed beforehand, a list pop
  and append): the least a client that routes can do. It spreads the queries over the
  masters' connections as a routed client must; when the scheduler places the processes,
  that can cost more than the plain floor's one connection per caller (other backends, other
  cores), and the gap between the two floors is then the part of routing that no client code
  can avoid here;
- ``shardline``: ``shardline.picodata.connect(dsn, tier="default")`` with its defaults (16
  connections at most per instance, opened on first use, a poll of the catalog every second);
- ``picopyn``: ``picopyn.asynchronous.pool.Pool(enable_discovery=True, max_size=96)`` (16 per
  instance, as shardline's bound; discovery so that every master has connections), keys from
  ``create_sharding_key_factory("users")``, routed with ``acquire_by_sharding_key`` (which
  waits for a busy master, as shardline does). It needs a DSN workaround on plain PostgreSQL:
  see ``StandinCluster.picopyn_dsn``.

Before timing, 256 keyed queries through each client must land on the key's master (the
catalog's answer, with picopyn's ``calculate_bucket_id`` for the bucket; for shardline both
with the key and with ``key_for("users", row)``), and every timed query's result must equal its
key.

Groups (each way timed back to back in every round, the order rotating, so that all see the
same moments of a shared machine; ``extra_info["by_way"]`` holds each way's figures and
``extra_info["ratios"]`` the median over rounds (or calls) of the per-round ratio, with its
quartiles):

``routed query before I/O``: per key of a block of 1,024, what a keyed query costs the client
besides the driver's work. shardline: its ``fetchval`` method as ``client._query_method``
builds it, with a stub in place of asyncpg's ``fetchval`` (a coroutine returning the key): the
whole hot path (``Topology.route`` of the key, the instance's pool found, an idle connection
popped and checked, the query's coroutine, the connection given back), which is private (the
client has no public "acquire by key"; see RESULTS.md). picopyn: ``async with
pool.acquire_by_sharding_key(factory.create_key({"id": k})): pass`` (key factory, bucket id,
``find_bucket_master``, acquire by instance uuid under the pool's lock, release through
``asyncio.shield``): its public API. Beside them, the routing alone: ``Topology.route`` against
``create_key`` + ``Topology.find_bucket_master``.
Each way runs a block as one coroutine (``loop.run_until_complete``), so the loop's own cost
is shared alike.

``keyed SELECT, 16 in flight, {placement}``: ``SELECT $1::bigint`` fetched as a row with the
key as its argument, 16 callers on the loop making 64 calls each per way and round: calls/s
per way, and this process's CPU per call.

``keyed SELECT, 1 in flight, {placement}``: one caller; each key goes through the four ways in
turn (the order rotating), each call timed alone: p50/p99 per way, the median of the per-key
ratios and the ratio of the p50s.

Placement: on a 2-core virtual machine, a round trip to a server backend costs what waking
that backend costs, which depends on where the scheduler put it: on the client's core (a
context switch, ~20 µs here) or on the other, idle one (waking an idle virtual CPU, ~90 µs on
a quiet machine). Left to the scheduler, each backend settles on one or the other, so each
way's latency (and, at 16 in flight, throughput) depends on where its backends happen to be
(one run: the floor's p50 105 µs, the others' 35-40 µs). So these groups are measured with
the benchmark's thread on one CPU and every server process on another (``separate CPUs``: a
client on one machine and a server on another, the client's core its own, so at 16 in
flight the client's CPU per call sets the throughput), on the same CPU (``one CPU``: every
round trip a context switch; 1 in flight only) and as the scheduler places them
(``unpinned``); the affinities are restored after each test.

``keyed INSERT, {16,4} in flight, where the writes land``: ``INSERT INTO users (id, name,
landed_on) VALUES ($1, $2, inet_server_addr())``, each key once, 16 or 4 callers. shardline:
``execute(..., key=id)``. picopyn with its default settings (``max_size`` 10, spread over the
six instances) but discovery on (off, its default, it has connections to the DSN's instance
only, so every key of another master goes elsewhere), and its own automatic routing,
``Pool.execute``, which sends a 1-row INSERT to the bucket's master when Picodata has
described the statement, and to any connection when the master's are busy
(``routing_acquire_timeout`` 0).
PostgreSQL cannot send Picodata's description (a NOTICE before ParseComplete), so the
benchmark puts into picopyn's metadata cache what Picodata would send for this statement
(tier ``default``, key parameter ``$1`` an integer): the one private hook used on picopyn. The
rows' ``landed_on`` then shows, per way, how many writes went to another instance than the
key's master; each side's own counters are recorded beside.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("pytest_benchmark")
pytest.importorskip("picopyn")

import asyncpg
from picopyn.asynchronous.pool import Pool as PicopynPool
from picopyn.query_metadata import PreparedStatementMetadata

import shardline.picodata
from shardline.picodata.client import _query_method

from .benchkit import int_keys, percentiles, ratio_summary, spread, timed_rounds
from .picodata_standin import OID_INT8, TIER, StandinCluster
from .placement import PLACEMENTS, placed

CALLERS = 16
WAIT = 30.0  # seconds a round may take before the benchmark fails
CHECKED_KEYS = 256

ROUTE_BLOCK = 1024
ROUTE_ROUNDS = 300
ROUTE_WARMUP = 10

PER_CALLER = 64  # calls per caller per way and round, 16 in flight
FLIGHT_ROUNDS = 50
FLIGHT_WARMUP = 4

KEYS_PER_ROUND = 64  # 1 in flight, each through every way
SINGLE_ROUNDS = 60
SINGLE_WARMUP = 3

INSERTS_PER_CALLER = 25  # per way and round
INSERT_ROUNDS = 8
INSERT_WARMUP = 1
INSERT_IDS = itertools.count(1)  # each users.id is written once in the module

SELECT = "SELECT $1::bigint"
WHERE = "SELECT host(inet_server_addr())"
INSERT = "INSERT INTO users (id, name, landed_on) VALUES ($1, $2, inet_server_addr())"


# --- the clients ------------------------------------------------------------------------------


@dataclass
class Clients:
    cluster: StandinCluster
    loop: asyncio.AbstractEventLoop
    floor: list[asyncpg.Connection]
    by_master: dict[str, list[asyncpg.Connection]]  # a master's host -> its idle connections
    shardline: shardline.picodata.Client
    picopyn: PicopynPool
    factory: Any  # picopyn.ShardingKeyFactory of users

    def run(self, coroutine: Awaitable[Any]) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coroutine, WAIT))


@pytest.fixture(scope="module")
def cluster() -> Iterator[StandinCluster]:
    standin = StandinCluster()  # raises PgUnavailable, with the reason, if PostgreSQL cannot run
    try:
        yield standin
    finally:
        standin.close()


@pytest.fixture(scope="module")
def clients(cluster: StandinCluster) -> Iterator[Clients]:
    loop = asyncio.new_event_loop()

    async def open_all() -> Clients:
        kwargs = cluster.server_connect_kwargs()
        floor = [await asyncpg.connect(**kwargs) for _ in range(CALLERS)]
        by_master = {
            host: [await asyncpg.connect(**{**kwargs, "host": host}) for _ in range(CALLERS)]
            for host in sorted(cluster.master_hosts)
        }
        db = await shardline.picodata.connect(cluster.dsn, tier=TIER)
        pool = PicopynPool(cluster.picopyn_dsn, enable_discovery=True, max_size=96)
        await pool.open()
        factory = await pool.create_sharding_key_factory("users")
        return Clients(cluster, loop, floor, by_master, db, pool, factory)

    opened = loop.run_until_complete(asyncio.wait_for(open_all(), WAIT))
    try:
        opened.run(check_landing(opened))
        yield opened
    finally:

        async def close_all() -> None:
            raw = [*opened.floor, *itertools.chain(*opened.by_master.values())]
            await asyncio.gather(*(connection.close() for connection in raw))
            await opened.shardline.close()
            await opened.picopyn.close()

        loop.run_until_complete(asyncio.wait_for(close_all(), WAIT))
        loop.close()


def host_of(value: Any) -> str:
    return str(value).split("/")[0]


async def check_landing(c: Clients) -> None:
    """Keyed queries of both routed clients reach the key's master (the routed floor's
    connections are to the addresses they were made for)."""
    for host, connections in c.by_master.items():
        assert {host_of(await conn.fetchval(WHERE)) for conn in connections} == {host}
    for key in int_keys(CHECKED_KEYS):
        expected = c.cluster.expected_host(key)
        assert await c.shardline.fetchval(WHERE, key=key) == expected, key
        row_key = await c.shardline.key_for("users", {"id": key, "name": "x"})
        assert await c.shardline.fetchval(WHERE, key=row_key) == expected, key
        async with c.picopyn.acquire_by_sharding_key(c.factory.create_key({"id": key})) as conn:
            row = await conn.fetchrow(WHERE)
        assert host_of(row[0]) == expected, key


KEYS = int_keys()  # 4,096 seeded int8 keys, every msgpack int width (benchkit)


def key_blocks(size: int) -> Iterator[Sequence[int]]:
    return itertools.cycle([KEYS[i : i + size] for i in range(0, len(KEYS) - size + 1, size)])


# --- routed query before I/O -------------------------------------------------------------------


async def _driver_stub(connection: Any, query: str, key: int) -> int:
    """Stands in for asyncpg's ``fetchval`` in the before-I/O way: no I/O, the key back."""
    return key


def route_ways(c: Clients) -> dict[str, Callable[[Sequence[int]], Awaitable[None]]]:
    db = c.shardline
    # the client's own query method, built around a driver call that does nothing
    fetchval = _query_method(_driver_stub, "").__get__(db)
    route = db.topology.route
    pool = c.picopyn
    create_key = c.factory.create_key
    acquire = pool.acquire_by_sharding_key
    topology = pool.topology
    assert topology is not None

    async def shardline_query(block: Sequence[int]) -> None:
        for key in block:
            await fetchval(SELECT, key, key=key)

    async def shardline_route(block: Sequence[int]) -> None:
        for key in block:
            route(TIER, key)

    async def picopyn_acquire_release(block: Sequence[int]) -> None:
        for key in block:
            async with acquire(create_key({"id": key})):
                pass

    async def picopyn_route(block: Sequence[int]) -> None:
        for key in block:
            topology.find_bucket_master(TIER, create_key({"id": key}).bucket_id)

    return {
        "shardline: a keyed query, the driver stubbed": shardline_query,
        "picopyn: acquire_by_sharding_key(create_key) + release": picopyn_acquire_release,
        "shardline: Topology.route only": shardline_route,
        "picopyn: create_key + find_bucket_master only": picopyn_route,
    }


def test_route_before_io(benchmark: Any, clients: Clients) -> None:
    c = clients
    # each key's master must have an idle connection for the hot path to find (opened by a query)
    for key in KEYS[:CHECKED_KEYS]:
        assert c.run(c.shardline.fetchval(SELECT, key, key=key)) == key
    pools = c.shardline._pools
    connects = sum(p.connects for p in pools.values())
    for key in KEYS[: 2 * ROUTE_BLOCK]:
        master = c.shardline.topology.route(TIER, key)
        assert master is not None
        assert master.address.rpartition(":")[0] == c.cluster.expected_host(key)
        assert pools[master.uuid].idle, f"no idle connection of the master of {key}"
    ways = route_ways(c)
    # every key served on the hot path: an idle connection of its master, none opened
    queries = sum(p.queries for p in pools.values())
    c.run(ways["shardline: a keyed query, the driver stubbed"](KEYS[:ROUTE_BLOCK]))
    assert sum(p.queries for p in pools.values()) == queries + ROUTE_BLOCK
    assert sum(p.connects for p in pools.values()) == connects
    names = list(ways)
    timed: dict[str, list[float]] = {name: [] for name in names}
    blocks = key_blocks(ROUTE_BLOCK)
    rounds = itertools.count()

    def round_() -> None:
        block = next(blocks)
        turn = next(rounds)
        for i in range(len(names)):
            name = names[(turn + i) % len(names)]
            t0 = time.perf_counter_ns()
            c.loop.run_until_complete(ways[name](block))
            timed[name].append((time.perf_counter_ns() - t0) / len(block))

    benchmark.group = "routed query before I/O"
    timed_rounds(benchmark, round_, ROUTE_ROUNDS, ROUTE_WARMUP, c.cluster.server_pids)
    kept = {name: samples[-ROUTE_ROUNDS:] for name, samples in timed.items()}
    full, route_only = names[0], names[2]
    benchmark.extra_info.update(
        impl="four ways interleaved, ns per key",
        calls_per_round=len(names) * ROUTE_BLOCK,
        by_way={name: spread(samples) for name, samples in kept.items()},
        ratios={
            "picopyn acquire+release / shardline keyed query, driver stubbed": ratio_summary(
                [p / s for p, s in zip(kept[names[1]], kept[full], strict=True)]
            ),
            "picopyn route / shardline route": ratio_summary(
                [p / s for p, s in zip(kept[names[3]], kept[route_only], strict=True)]
            ),
        },
    )


# --- end to end --------------------------------------------------------------------------------


def query_ways(c: Clients) -> dict[str, Callable[[int, int], Awaitable[Any]]]:
    """Each way as ``call(caller, key) -> the row's first value``."""
    floor = c.floor
    idle_of = {key: c.by_master[c.cluster.expected_host(key)] for key in KEYS}
    db = c.shardline
    acquire = c.picopyn.acquire_by_sharding_key
    create_key = c.factory.create_key

    async def raw(caller: int, key: int) -> Any:
        row = await floor[caller].fetchrow(SELECT, key)
        return row[0]

    async def routed_floor(caller: int, key: int) -> Any:
        idle = idle_of[key]
        connection = idle.pop()
        try:
            row = await connection.fetchrow(SELECT, key)
        finally:
            idle.append(connection)
        return row[0]

    async def routed(caller: int, key: int) -> Any:
        row = await db.fetchrow(SELECT, key, key=key)
        return row[0]

    async def picopyn(caller: int, key: int) -> Any:
        async with acquire(create_key({"id": key})) as conn:
            row = await conn.fetchrow(SELECT, key)
        return row[0]

    return {
        "floor: raw asyncpg connection": raw,
        "routed floor: raw asyncpg connection of the key's master": routed_floor,
        "shardline: fetchrow(key=)": routed,
        "picopyn: acquire_by_sharding_key + fetchrow": picopyn,
    }


@pytest.mark.parametrize("placement", ["separate CPUs", "unpinned"])
def test_keyed_select_16_in_flight(benchmark: Any, clients: Clients, placement: str) -> None:
    c = clients
    ways = query_ways(c)
    names = list(ways)
    per_s: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    blocks = key_blocks(CALLERS * PER_CALLER)
    rounds = itertools.count()

    async def flight(call: Callable[[int, int], Awaitable[Any]], block: Sequence[int]) -> None:
        async def caller(n: int) -> None:
            for key in block[n * PER_CALLER : (n + 1) * PER_CALLER]:
                result = await call(n, key)
                assert result == key, (result, key)

        await asyncio.gather(*(caller(n) for n in range(CALLERS)))

    def round_() -> None:
        block = next(blocks)
        turn = next(rounds)
        for i in range(len(names)):
            name = names[(turn + i) % len(names)]
            cpu0, t0 = time.process_time(), time.perf_counter()
            c.run(flight(ways[name], block))
            wall, busy = time.perf_counter() - t0, time.process_time() - cpu0
            per_s[name].append(len(block) / wall)
            cpu[name].append(busy / len(block) * 1e6)

    benchmark.group = f"keyed SELECT, 16 in flight, {placement}"
    waits_before = sum(pool.waits for pool in c.shardline.stats().pools.values())
    with placed(c.cluster.server_pids(), placement):
        timed_rounds(benchmark, round_, FLIGHT_ROUNDS, FLIGHT_WARMUP, c.cluster.server_pids)
    kept = {name: samples[-FLIGHT_ROUNDS:] for name, samples in per_s.items()}
    floor, routed_floor, ours, peer = names
    stats = c.shardline.stats()

    def ratio(a: str, b: str) -> dict[str, float]:
        return ratio_summary([x / y for x, y in zip(kept[a], kept[b], strict=True)])

    benchmark.extra_info.update(
        impl=f"four ways interleaved, 16 callers, {placement}",
        calls_per_round=len(names) * CALLERS * PER_CALLER,
        by_way={
            name: {
                "calls_per_s": spread(kept[name]),
                "client_cpu_us_per_call": statistics.median(cpu[name][-FLIGHT_ROUNDS:]),
            }
            for name in names
        },
        ratios={
            "shardline / floor, throughput": ratio(ours, floor),
            "shardline / picopyn, throughput": ratio(ours, peer),
            "routed floor / floor, throughput": ratio(routed_floor, floor),
            "shardline / routed floor, throughput": ratio(ours, routed_floor),
        },
        shardline_pool_waits=sum(pool.waits for pool in stats.pools.values()) - waits_before,
        shardline_fallbacks=dict(stats.fallbacks),
    )


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_keyed_select_1_in_flight(benchmark: Any, clients: Clients, placement: str) -> None:
    c = clients
    ways = query_ways(c)
    names = list(ways)
    turns: list[list[int]] = []  # one key through every way: each way's ns
    blocks = key_blocks(KEYS_PER_ROUND)
    clock = time.perf_counter_ns

    async def round_of_turns(block: Sequence[int]) -> None:
        for key in block:
            turn = [0] * len(names)
            first = len(turns)
            for i in range(len(names)):
                way = (first + i) % len(names)
                t0 = clock()
                result = await ways[names[way]](0, key)
                turn[way] = clock() - t0
                assert result == key, (result, key)
            turns.append(turn)

    def round_() -> None:
        c.run(round_of_turns(next(blocks)))

    benchmark.group = f"keyed SELECT, 1 in flight, {placement}"
    with placed(c.cluster.server_pids(), placement):
        timed_rounds(benchmark, round_, SINGLE_ROUNDS, SINGLE_WARMUP, c.cluster.server_pids)
    kept = turns[-SINGLE_ROUNDS * KEYS_PER_ROUND :]
    by_way = {name: percentiles([t[i] / 1e9 for t in kept]) for i, name in enumerate(names)}

    def ratio(a: int, b: int) -> dict[str, float]:
        return {
            **ratio_summary([t[a] / t[b] for t in kept]),
            "of_p50s": round(by_way[names[a]]["p50_ns"] / by_way[names[b]]["p50_ns"], 3),
        }

    benchmark.extra_info.update(
        impl=f"four ways in turn, call by call, 1 caller, {placement}",
        calls_per_round=len(names) * KEYS_PER_ROUND,
        samples=len(kept),
        by_way=by_way,
        ratios={
            "shardline / floor, per call": ratio(2, 0),
            "picopyn / floor, per call": ratio(3, 0),
            "routed floor / floor, per call": ratio(1, 0),
            "shardline / routed floor, per call": ratio(2, 1),
        },
    )


# --- where keyed writes land -------------------------------------------------------------------


@pytest.mark.parametrize("callers", [CALLERS, 4])
def test_keyed_insert_landing(
    benchmark: Any, cluster: StandinCluster, clients: Clients, callers: int
) -> None:
    c = clients
    ids = INSERT_IDS
    names = ["shardline: execute(key=)", "picopyn defaults: Pool.execute (auto-routed)"]
    written: dict[str, list[int]] = {name: [] for name in names}
    per_s: dict[str, list[float]] = {name: [] for name in names}

    async def open_default_picopyn() -> PicopynPool:
        pool = PicopynPool(cluster.picopyn_dsn, enable_discovery=True)
        await pool.open()
        service = pool._query_metadata_service
        assert service is not None
        # what Picodata sends for this statement (see the module's docstring)
        service._cache.set(PreparedStatementMetadata(INSERT, TIER, [(1, OID_INT8)]))
        return pool

    picopyn = c.run(open_default_picopyn())
    db = c.shardline
    waits_before = sum(pool.waits for pool in db.stats().pools.values())

    async def routed(key: int) -> Any:
        return await db.execute(INSERT, key, "x", key=key)

    async def automatic(key: int) -> Any:
        return await picopyn.execute(INSERT, key, "x")

    ways = dict(zip(names, [routed, automatic], strict=True))
    rounds = itertools.count()

    async def flight(name: str) -> None:
        async def caller() -> None:
            for _ in range(INSERTS_PER_CALLER):
                key = next(ids)
                written[name].append(key)
                assert await ways[name](key) == "INSERT 0 1"

        await asyncio.gather(*(caller() for _ in range(callers)))

    def round_() -> None:
        turn = next(rounds)
        for i in range(len(names)):
            name = names[(turn + i) % len(names)]
            t0 = time.perf_counter()
            c.run(flight(name))
            per_s[name].append(callers * INSERTS_PER_CALLER / (time.perf_counter() - t0))

    try:
        benchmark.group = f"keyed INSERT, {callers} in flight, where the writes land"
        timed_rounds(benchmark, round_, INSERT_ROUNDS, INSERT_WARMUP, c.cluster.server_pids)
        landed = dict(c.run(db.fetch("SELECT id, host(landed_on) FROM users")))
        peer_stats = picopyn.stats()
    finally:
        c.run(picopyn.close())
    off_master = {
        name: sum(landed[key] != cluster.expected_host(key) for key in keys)
        for name, keys in written.items()
    }
    assert all(key in landed for keys in written.values() for key in keys)
    ours = db.stats()
    benchmark.extra_info.update(
        impl=f"two ways interleaved, {callers} callers",
        calls_per_round=len(names) * callers * INSERTS_PER_CALLER,
        by_way={
            name: {
                "writes": len(written[name]),
                "off_master": off_master[name],
                "off_master_share": round(off_master[name] / len(written[name]), 4),
                "calls_per_s": spread(per_s[name]),
            }
            for name in names
        },
        shardline_pool_waits=sum(pool.waits for pool in ours.pools.values()) - waits_before,
        shardline_fallbacks=dict(ours.fallbacks),
        picopyn_routing={
            "attempts": peer_stats.routing_attempts,
            "hits": peer_stats.routing_hits,
            "fallbacks": {
                reason.value: n for reason, n in peer_stats.routing_fallbacks.items() if n
            },
        },
    )
    assert off_master[names[0]] == 0, "shardline sent a keyed write to another instance"
