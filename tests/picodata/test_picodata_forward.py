"""Proof and repair with ``forward=off`` (issue 27, item 5).

With ``connect(..., forward="off")`` every instance session carries Picodata's ``forward=off``
option (26.2, ``doc/adr/2026-03-13-forward-option.md``), under which an instance refuses a
query whose bucket is not its own instead of forwarding it. The stand-in
(``tests/support/pgproto_standin.py``) refuses a Bind the way Picodata does; the client takes
the refusal as vshard's WRONG_BUCKET: nothing ran, so it polls the catalog and sends the query
once more, to the owner it names now.

The client polls rarely here (``poll_interval`` 60 s), so after each catalog change it routes
by a stale map until a refusal makes it look: every keyed query of a Hypothesis-driven history
of bucket moves and master switches must land on the owner the catalog names at that moment,
once, repaired or not.
"""

from __future__ import annotations

import asyncio
import itertools

import asyncpg
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from shardline.picodata import connect
from support.forwarded_cluster import BUCKETS, Cluster
from support.pg_server import PgServer
from support.pgproto_standin import FORWARD_REFUSED, PgprotoProxy, standin, start_standin
from support.picodata_catalog import name_uuid as _uuid

INSERT = "INSERT INTO landed (id, port) VALUES ($1, inet_client_port())"
NAMES = {"r1": ("r1_1", "r1_2", "r1_3"), "r2": ("r2_1", "r2_2")}


def refused(c: Cluster) -> int:
    return sum(p.forward_refused for p in c.forwarders.values() if isinstance(p, PgprotoProxy))


def landed(c: Cluster) -> dict[int, list[str]]:
    rows = c.catalog.connection.execute("SELECT id, port FROM landed").fetchall()
    found: dict[int, list[str]] = {}
    for key, port in rows:
        found.setdefault(key, []).append(c.instance_of(port))
    return found


def test_every_keyed_query_lands_on_its_owner_or_is_repaired(pg: PgServer) -> None:
    class History(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.loop = asyncio.new_event_loop()
            self.c = self.loop.run_until_complete(start_standin(pg))
            self.db = self.loop.run_until_complete(
                connect(self.c.url, forward="off", poll_interval=60.0, route_wait=2.0)
            )
            self.keys = itertools.count()
            self.expected: dict[int, str] = {}

        def teardown(self) -> None:
            self.loop.run_until_complete(self.db.close())
            for proxy in self.c.forwarders.values():
                self.loop.run_until_complete(proxy.stop())
            self.c.catalog.close()
            self.loop.close()

        @rule(split=st.integers(0, BUCKETS), first=st.sampled_from(["r1", "r2"]))
        def move_buckets(self, split: int, first: str) -> None:
            second = "r2" if first == "r1" else "r1"
            ranges = [(1, split, _uuid(first))] if split else []
            if split < BUCKETS:
                ranges.append((split + 1, BUCKETS, _uuid(second)))
            self.c.catalog.set_buckets("default", ranges)  # the client is not told

        @rule(data=st.data())
        def switch_master(self, data: st.DataObject) -> None:
            replicaset = data.draw(st.sampled_from(sorted(NAMES)))
            self.c.catalog.switch_master(replicaset, data.draw(st.sampled_from(NAMES[replicaset])))

        @rule(spread=st.integers(0, 2**40), by_metadata=st.booleans())
        def insert(self, spread: int, by_metadata: bool) -> None:
            key = next(self.keys) * 2**41 + spread  # distinct ids, buckets all over
            self.expected[key] = self.c.master_of(key)
            if by_metadata:
                coroutine = self.db.execute(INSERT, key)
            else:
                coroutine = self.db.execute(INSERT, key, key=key)
            self.loop.run_until_complete(coroutine)

        @invariant()
        def each_query_ran_once_on_its_owner(self) -> None:
            assert landed(self.c) == {key: [master] for key, master in self.expected.items()}
            assert self.db.stats().forward_repaired == refused(self.c)

    run_state_machine_as_test(History, settings=settings(max_examples=15, stateful_step_count=15))


@pytest.mark.async_timeout(60)
async def test_a_second_refusal_is_the_callers(pg: PgServer) -> None:
    async with standin(pg) as c, connect(c.url, forward="off", poll_interval=60.0) as db:
        # every session carries the option, the DSN's own options kept
        assert await db.fetchval("SHOW search_path") == c.catalog.schema
        sessions = [
            s for p in c.forwarders.values() if isinstance(p, PgprotoProxy) for s in p.sessions
        ]
        assert sessions
        assert all(session.forward == "off" for session in sessions)
        key = c.key_of("r1_1")
        proxy = c.forwarders["r1_1"]
        assert isinstance(proxy, PgprotoProxy)
        # r1_1 keeps refusing (as if the catalog lagged behind the owner): one resend only
        proxy.owner_of = lambda bucket: ""
        with pytest.raises(asyncpg.PostgresError, match="cannot satisfy"):
            await db.execute(INSERT, key)
        assert proxy.forward_refused == 2
        assert db.stats().forward_repaired == 1
        assert key not in landed(c)
        assert FORWARD_REFUSED.startswith("sbroad: invalid option")


@pytest.mark.async_timeout(60)
async def test_reads_go_to_the_master_under_forward_off(pg: PgServer) -> None:
    async with standin(pg) as c:
        key = c.key_of("r1_1")
        query = "SELECT inet_client_port()"
        async with connect(c.url, forward="off") as db:
            ports = [await db.fetchval(query, key=key, read_only=True) for _ in range(4)]
            assert {c.instance_of(port) for port in ports} == {"r1_1"}
        async with connect(c.url) as db:  # without it, the replicas in turn
            ports = [await db.fetchval(query, key=key, read_only=True) for _ in range(4)]
            assert {c.instance_of(port) for port in ports} == {"r1_2", "r1_3"}
