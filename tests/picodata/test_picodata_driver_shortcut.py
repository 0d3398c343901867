"""The hot path's shortcut past asyncpg's ``fetch``/``fetchrow``/``fetchval``
(``shardline.picodata.driver_shortcut``): the same results as asyncpg's methods, taken only
on the checked asyncpg releases and only on the hot path."""

from __future__ import annotations

import sys
from typing import Any

import asyncpg
import pytest

from shardline.picodata import connect
from shardline.picodata.driver_shortcut import shortcut_allowed
from support.forwarded_cluster import cluster
from support.pg_server import PgServer

pytestmark = pytest.mark.async_timeout(60)

INSTALLED = shortcut_allowed(asyncpg.__version__)

# each query with its arguments: no row, one row, three rows, a row of two columns
QUERIES = [
    ("SELECT 1 WHERE false", ()),
    ("SELECT $1::bigint", (7,)),
    ("SELECT g FROM generate_series(1, $1::int) AS g", (3,)),
    ("SELECT $1::text AS a, $2::int AS b", ("x", 2)),
]


@pytest.mark.parametrize(
    ("version", "allowed"),
    [
        ("0.29.0", True),
        ("0.30.0", True),
        ("0.32.0", True),
        ("0.28.0", False),
        ("0.33.0", False),
        ("1.0.0", False),
        ("0.30.0rc1", True),
        ("dev", False),
        ("", False),
    ],
)
def test_the_shortcut_is_allowed_on_the_checked_releases_only(version: str, allowed: bool) -> None:
    assert shortcut_allowed(version) is allowed


@pytest.fixture
def awaited_by(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Per query text, the name of the frame that awaited each ``Connection._execute`` of it
    since: ``query`` (the client's, the shortcut) or asyncpg's ``fetch``/``fetchrow``/
    ``fetchval``. By query text, because the client's catalog polls run meanwhile."""
    names: dict[str, list[str]] = {}
    execute = asyncpg.Connection._execute

    async def spy(self: asyncpg.Connection, query: str, *args: Any, **kwargs: Any) -> Any:
        names.setdefault(query, []).append(sys._getframe(1).f_code.co_name)
        return await execute(self, query, *args, **kwargs)

    monkeypatch.setattr(asyncpg.Connection, "_execute", spy)
    return names


async def test_the_shortcut_returns_what_asyncpg_s_methods_return(
    pg: PgServer, awaited_by: dict[str, list[str]]
) -> None:
    async with cluster(pg) as c, connect(c.url, tier="default") as db:
        raw = await asyncpg.connect(c.url)
        try:
            for query, args in QUERIES:
                for method in ("fetch", "fetchrow", "fetchval"):
                    expected = await getattr(raw, method)(query, *args)
                    for key in (1, 1, 2):  # the second on the connection the first gave back
                        got = await getattr(db, method)(query, *args, key=key)
                        assert got == expected, (method, query)
                        assert awaited_by[query][-1] in ("query", method)
                    # with a timeout too, and with the options only asyncpg's methods take
                    timed = await getattr(db, method)(query, *args, key=1, timeout=5.0)
                    assert timed == expected
                    assert awaited_by[query][-1] == ("query" if INSTALLED else method)
                    if method == "fetchval":
                        first = await raw.fetchrow(query, *args)
                        got = await db.fetchval(query, *args, key=1, column=-1)
                        assert got == (None if first is None else first[-1])
                        assert awaited_by[query][-1] == "fetchval"
                    else:
                        got = await getattr(db, method)(
                            query, *args, key=1, record_class=asyncpg.Record
                        )
                        assert got == expected
                        assert awaited_by[query][-1] == method
        finally:
            await raw.close()


async def test_the_hot_path_takes_the_shortcut_where_allowed(
    pg: PgServer, awaited_by: dict[str, list[str]]
) -> None:
    probe = "SELECT 1 AS shortcut_probe"
    async with cluster(pg) as c, connect(c.url, tier="default") as db:
        await db.fetch(probe, key=3)  # opens the connection of key 3's master, caches probe
        awaited_by.clear()
        for method in ("fetch", "fetchrow", "fetchval"):
            await getattr(db, method)(probe, key=3)  # its idle connection: the hot path
        # a cached statement goes past _execute to the protocol itself
        expected = [] if INSTALLED else ["fetch", "fetchrow", "fetchval"]
        assert awaited_by.get(probe, []) == expected
        written = "SELECT $1::int AS shortcut_probe"
        assert await db.execute(written, 1, key=3) == "SELECT 1"  # prepared here
        assert await db.execute(written, 2, key=3) == "SELECT 1"  # cached
        assert awaited_by[written] == (["query"] if INSTALLED else ["execute", "execute"])


async def test_a_command_timeout_keeps_the_driver_s_statement_lookup(
    pg: PgServer, awaited_by: dict[str, list[str]]
) -> None:
    probe = "SELECT 2 AS shortcut_probe"
    kwargs = {"command_timeout": 30.0}
    async with cluster(pg) as c, connect(c.url, tier="default", connect_kwargs=kwargs) as db:
        assert await db.fetchval(probe, key=3) == 2  # opens the connection, caches probe
        awaited_by.clear()
        for _ in range(3):
            assert await db.fetchval(probe, key=3) == 2
        # asyncpg's _execute applies command_timeout: never skipped then
        assert awaited_by[probe] == (["query"] * 3 if INSTALLED else ["fetchval"] * 3)


async def test_a_statement_whose_result_type_changed_is_prepared_again(pg: PgServer) -> None:
    """A cached statement the server refuses after an ALTER TABLE (asyncpg's
    InvalidCachedStatementError) is prepared again and run once more, as asyncpg does."""
    async with cluster(pg) as c, connect(c.url, tier="default") as db:
        raw = await asyncpg.connect(c.url)
        try:
            await raw.execute("CREATE TABLE altered (id int)")
            await raw.execute("INSERT INTO altered VALUES (1)")
            query = "SELECT * FROM altered WHERE id = $1"
            for _ in range(2):  # prepared, then cached on key 3's connection
                assert list(await db.fetchrow(query, 1, key=3)) == [1]
            await raw.execute("ALTER TABLE altered ADD COLUMN name text DEFAULT 'x'")
            assert list(await db.fetchrow(query, 1, key=3)) == [1, "x"]
            assert await db.execute("UPDATE altered SET name = $2 WHERE id = $1", 1, "y", key=3)
            assert await db.execute("UPDATE altered SET name = $2 WHERE id = $1", 1, "z", key=3)
            await raw.execute("ALTER TABLE altered ADD COLUMN other int DEFAULT 5")
            assert list(await db.fetchrow(query, 1, key=3)) == [1, "z", 5]
        finally:
            await raw.close()
