"""``InstancePool``: the Picodata client's lean pool of connections to one instance, against a
real PostgreSQL (``pg``) and, for its bookkeeping, against a reference model."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from shardline import InstanceUnavailable, PoolTimeout
from shardline.picodata import InstancePool
from support.pg_server import PASSWORD, SUPERUSER, PgServer

pytestmark = pytest.mark.async_timeout(60)  # each async test, start to finish

UUID = "00000000-0000-0000-0000-00000000b001"


def dialler(pg: PgServer) -> tuple[Callable[[str, int], Awaitable[Any]], list[tuple[str, int]]]:
    """A connect function for the pool, and the list of the addresses it was asked to dial."""
    dialled: list[tuple[str, int]] = []

    async def dial(host: str, port: int) -> Any:
        dialled.append((host, port))
        return await asyncpg.connect(
            host=host, port=port, user=SUPERUSER, password=PASSWORD, database="postgres"
        )

    return dial, dialled


def pool_for(pg: PgServer, *, size: int = 2, acquire_timeout: float = 10.0) -> InstancePool:
    dial, _ = dialler(pg)
    return InstancePool(
        UUID,
        f"127.0.0.1:{pg.port}",
        connect=dial,
        size=size,
        acquire_timeout=acquire_timeout,
        name="r1_1",
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


async def test_connections_open_lazily_and_the_last_released_is_reused_first(pg: PgServer) -> None:

    dial, dialled = dialler(pg)
    pool = InstancePool(UUID, f"127.0.0.1:{pg.port}", connect=dial, size=3, acquire_timeout=10.0)
    assert dialled == []
    assert pool.take() is None
    first = await pool.acquire()
    second = await pool.acquire()
    assert dialled == [("127.0.0.1", pg.port)] * 2
    pool.release(first)
    pool.release(second)
    assert pool.take() is second
    assert pool.take() is first
    assert await first.fetchval("SELECT 1") == 1
    stats = pool.stats()
    assert (stats.open, stats.idle, stats.in_use, stats.connects) == (2, 0, 2, 2)
    pool.release(first)
    pool.release(second)
    await pool.aclose()
    assert first.is_closed()
    assert second.is_closed()


async def test_a_busy_pool_hands_the_next_released_connection_to_the_waiter(pg: PgServer) -> None:

    pool = pool_for(pg, size=2)
    held = [await pool.acquire(), await pool.acquire()]
    waiting = asyncio.ensure_future(pool.acquire())
    await asyncio.sleep(0)
    assert not waiting.done()
    assert pool.stats().waits == 1
    pool.release(held[0])
    assert await waiting is held[0]
    stats = pool.stats()
    assert (stats.open, stats.in_use, stats.idle, stats.connects) == (2, 2, 0, 2)
    pool.release(held[1])
    pool.release(held[0])
    await pool.aclose()


async def test_a_busy_pool_times_out_after_acquire_timeout(pg: PgServer) -> None:

    pool = pool_for(pg, size=1, acquire_timeout=0.05)
    held = await pool.acquire()
    with pytest.raises(PoolTimeout) as raised:
        await pool.acquire()
    assert UUID in str(raised.value)
    assert "all 1 connections" in str(raised.value)
    assert (pool.stats().waits, pool.stats().timeouts) == (1, 1)
    pool.release(held)
    assert await pool.acquire() is held  # nothing was lost to the waiter that gave up
    pool.release(held)
    await pool.aclose()


async def test_a_broken_connection_is_discarded_and_its_slot_goes_to_a_waiter(pg: PgServer) -> None:

    pool = pool_for(pg, size=1)
    held = await pool.acquire()
    waiting = asyncio.ensure_future(pool.acquire())
    await asyncio.sleep(0)
    assert not waiting.done()
    pool.release(held, broken=True)
    fresh = await waiting
    assert fresh is not held
    assert held.is_closed()
    assert await fresh.fetchval("SELECT 2") == 2
    stats = pool.stats()
    assert (stats.open, stats.discarded, stats.connects) == (1, 1, 2)
    pool.release(fresh)
    await pool.aclose()


async def test_a_connection_left_in_a_transaction_is_not_reused(pg: PgServer) -> None:

    pool = pool_for(pg)
    connection = await pool.acquire()
    await connection.execute("BEGIN")
    pool.release(connection)
    assert pool.take() is None
    assert pool.stats().discarded == 1
    await pool.aclose()
    assert connection.is_closed()


async def test_an_idle_connection_closed_by_the_server_is_discarded_when_taken(
    pg: PgServer,
) -> None:

    pool = pool_for(pg)
    connection = await pool.acquire()
    pid = connection.get_server_pid()
    pool.release(connection)
    killer = await asyncpg.connect(
        host="127.0.0.1", port=pg.port, user=SUPERUSER, password=PASSWORD, database="postgres"
    )
    await killer.execute("SELECT pg_terminate_backend($1)", pid)
    await killer.close()
    deadline = asyncio.get_running_loop().time() + 10
    while not connection.is_closed():  # the client learns it from the socket
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.005)
    fresh = await pool.acquire()
    assert fresh is not connection
    assert (pool.stats().discarded, pool.stats().open) == (1, 1)
    pool.release(fresh)
    await pool.aclose()


async def test_a_failed_connect_names_the_instance_and_backs_off(pg: PgServer) -> None:

    address = f"127.0.0.1:{free_port()}"
    dial, dialled = dialler(pg)
    pool = InstancePool(UUID, address, connect=dial, size=2, acquire_timeout=10.0, name="r1_1")
    with pytest.raises(InstanceUnavailable) as raised:
        await pool.acquire()
    message = str(raised.value)
    assert f"r1_1 ({UUID})" in message
    assert address in message
    assert (raised.value.instance, raised.value.address) == (UUID, address)
    assert isinstance(raised.value.__cause__, OSError)
    assert pool.down
    with pytest.raises(InstanceUnavailable, match="backoff"):
        await pool.acquire()
    assert len(dialled) == 1  # not dialled during the backoff
    with pytest.raises(InstanceUnavailable):
        await pool.acquire(redial=True)
    assert len(dialled) == 2
    stats = pool.stats()
    assert (stats.open, stats.connect_failures, stats.connects) == (0, 2, 0)
    await pool.aclose()


async def test_the_pool_logs_its_opening_closing_and_outages_not_each_query(
    pg: PgServer, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        up = pool_for(pg)
        for _ in range(3):
            up.release(await up.acquire())
        await up.aclose()
        address = f"127.0.0.1:{free_port()}"
        dial, _ = dialler(pg)
        down = InstancePool(UUID, address, connect=dial, size=2, acquire_timeout=10.0)
        for _ in range(3):
            with pytest.raises(InstanceUnavailable):
                await down.acquire(redial=True)
        await down.aclose()

    with caplog.at_level(logging.INFO, logger="shardline.picodata"):
        await main()
    records = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in records] == ["INFO", "INFO", "WARNING"]
    assert records[0][1].startswith(f"connected to instance r1_1 ({UUID})")
    assert records[1][1].startswith(f"closing the pool of instance r1_1 ({UUID})")
    assert records[2][1].startswith(f"cannot connect to instance {UUID}")


async def test_aclose_waits_for_the_connections_in_use(pg: PgServer) -> None:

    pool = pool_for(pg)
    idle, busy = await pool.acquire(), await pool.acquire()
    pool.release(idle)
    closing = asyncio.ensure_future(pool.aclose())
    for _ in range(20):
        await asyncio.sleep(0)
    assert not closing.done()
    assert idle.is_closed()
    assert not busy.is_closed()
    assert await busy.fetchval("SELECT 3") == 3  # the query in flight finishes
    with pytest.raises(InstanceUnavailable, match="closed"):
        await pool.acquire()
    pool.release(busy)
    await closing
    assert busy.is_closed()
    assert pool.stats().open == 0


# the bookkeeping against a model


class FakeConnection:
    def __init__(self, number: int) -> None:
        self.number = number
        self.closed = False
        self.in_transaction = False

    def is_closed(self) -> bool:
        return self.closed

    def is_in_transaction(self) -> bool:
        return self.in_transaction

    async def close(self, timeout: float | None = None) -> None:
        self.closed = True

    def terminate(self) -> None:
        self.closed = True


class PoolMachine(RuleBasedStateMachine):
    """Acquire, release (healthy, broken, in a transaction), break idle connections; the pool
    must agree with a model: a LIFO stack of idle connections, the lent ones, the bound."""

    SIZE = 3

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.made: list[FakeConnection] = []

        async def connect(host: str, port: int) -> FakeConnection:
            self.made.append(FakeConnection(len(self.made)))
            return self.made[-1]

        self.pool = InstancePool(
            UUID, "127.0.0.1:1", connect=connect, size=self.SIZE, acquire_timeout=1.0
        )
        self.idle: list[FakeConnection] = []  # the model: most recently released last
        self.lent: list[FakeConnection] = []
        self.discarded = 0

    def teardown(self) -> None:
        async def close() -> None:
            for connection in self.lent:
                self.pool.release(connection)
            await self.pool.aclose()

        self.loop.run_until_complete(close())
        self.loop.close()
        assert all(connection.closed for connection in self.made)

    @precondition(lambda self: len(self.idle) + len(self.lent) < self.SIZE or self.idle)
    @rule()
    def acquire(self) -> None:
        connection = self.loop.run_until_complete(self.pool.acquire())
        while self.idle and self.idle[-1].closed:
            self.idle.pop()
            self.discarded += 1
        if self.idle:
            assert connection is self.idle.pop()
        else:
            assert connection is self.made[-1]
        self.lent.append(connection)

    @precondition(lambda self: self.lent)
    @rule(data=st.data(), how=st.sampled_from(["healthy", "broken", "in-transaction", "closed"]))
    def release(self, data: st.DataObject, how: str) -> None:
        connection = data.draw(st.sampled_from(self.lent))
        self.lent.remove(connection)
        connection.in_transaction = how == "in-transaction"
        connection.closed = how == "closed"

        async def release() -> None:  # the pool closes discarded connections on its loop
            self.pool.release(connection, broken=how == "broken")

        self.loop.run_until_complete(release())
        if how in ("broken", "in-transaction"):
            self.discarded += 1
            assert connection.closed or how == "in-transaction"
        else:
            self.idle.append(connection)

    @precondition(lambda self: self.idle)
    @rule(data=st.data())
    def server_closes_an_idle_connection(self, data: st.DataObject) -> None:
        data.draw(st.sampled_from(self.idle)).closed = True

    @invariant()
    def agrees_with_the_model(self) -> None:
        stats = self.pool.stats()
        assert stats.open == len(self.idle) + len(self.lent) <= self.SIZE
        assert stats.in_use == len(self.lent)
        assert stats.idle == len(self.idle)
        assert stats.discarded == self.discarded
        assert stats.connects == len(self.made)
        assert stats.waits == 0


test_the_pool_agrees_with_its_model = PoolMachine.TestCase
