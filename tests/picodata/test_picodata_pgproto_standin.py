"""The pgproto stand-in (``tests/support/pgproto_standin.py``) against Picodata's own examples.

``dk_meta`` answers are checked against every case of picodata/picodata
``test/pgproto/smart_client_features_test.py::test_pico_query_metadata`` (26.1), with the tables
that test creates; the wire behaviour (the NOTICE before ParseComplete, the startup options
stripped, 42999 on a stale Bind) through a real PostgreSQL.
"""

from __future__ import annotations

import json

import asyncpg
import pytest

from support.pg_server import PgServer
from support.pgproto_standin import Table, analyze, standin

pytestmark = pytest.mark.async_timeout(60)

# the three tables of test_pico_query_metadata, in its order
T1 = Table(
    columns=(
        ("a", "decimal"),
        ("b", "text"),
        ("c", "int"),
        ("d", "double"),
        ("e", "uuid"),
        ("f", "datetime"),
        ("g", "boolean"),
    ),
    key=("f", "a", "g", "c"),  # PRIMARY KEY (f, a, g, c)
)
T2 = Table(columns=T1.columns, key=("e", "b", "d"))  # PRIMARY KEY (e, b, d)
T3 = Table(columns=(("a", "int"), ("b", "text"), ("c", "int")), key=("c", "b"))  # DISTRIBUTED BY

PICODATA_CASES = [
    (T1, "insert into t (c, a, g, f) values ($1::integer, $2::decimal, $3::boolean, $4::datetime);",
     [[4, 1184], [2, 1700], [3, 16], [1, 20]]),
    (T1, "insert into t (a, g, f, b, c) values ($1::decimal, true, $2, $3::text, $4);", []),
    (T1, "insert into t (a, g, f, c) values ($1, $1::boolean, $2, $1::int);", []),
    (T1, "insert into t (a, g, f, c) values ($1, true, $2, $1::int);", []),
    (T1, "insert into t (f, a, g, c) values ($1::datetime, $2, $3, $4::int);",
     [[1, 1184], [2, 1700], [3, 16], [4, 20]]),
    (T1, "insert into t values ($1, $2, $3, $4, $5, $6, $7);",
     [[6, 1184], [1, 1700], [7, 16], [3, 20]]),
    (T2, "insert into t (b, e, d) values ($1::text, $1::uuid, $1::double);", []),
    (T2, "insert into t (b, e, d) values ($2::text, $3::uuid, $1::double);",
     [[3, 2950], [2, 25], [1, 701]]),
    (T2, "insert into t (b, e, d) values ($2::text, '9035910e-8342-4460-8c25-25e5f10d9876'::uuid,"
     " $1::double);", []),
    (T2, "insert into t (e, b, d) values ($1::uuid, $2::text, $3::double), ($4::uuid, $5::text,"
     " $6::double);", []),
    (T2, "insert into t values ($1::decimal, $2::text, $3::int, $4::double, $5::uuid,"
     " $6::datetime, $7::boolean);", [[5, 2950], [2, 25], [4, 701]]),
    (T3, "insert into t(a, b) values ($1, $2);", []),
    (T3, "insert into t(a, b, c) values ($1, $2, $3);", [[3, 20], [2, 25]]),
    (T3, "insert into t(a, b, c) values (1, '', 2), ($1, $2, $3);", []),
    (T3, "insert into t(a, b, c) select a + 1, b, c from t where b = $1 and c = $2;", []),
    (T3, "select * from t where b = $1 and c = $2;", []),
]  # fmt: skip


@pytest.mark.parametrize(("table", "query", "expected"), PICODATA_CASES)
def test_dk_meta_matches_picodatas_own_examples(
    table: Table, query: str, expected: list[list[int]]
) -> None:
    tier, dk_meta = analyze(query, {"t": table})
    assert dk_meta == expected
    assert tier == "default"


async def test_the_metadata_notice_comes_before_parse_complete_when_asked(pg: PgServer) -> None:
    query = "INSERT INTO landed (id, port) VALUES ($1, inet_client_port())"
    async with standin(pg) as c:
        proxy = c.forwarders["r1_1"]
        notices: list[asyncpg.PostgresLogMessage] = []
        connection = await asyncpg.connect(
            c.url,
            host="127.0.0.1",
            port=proxy.port,
            server_settings={"pico_query_metadata": "true", "pico_stmt_invalidation": "true"},
        )
        try:
            connection.add_log_listener(lambda _, message: notices.append(message))
            await connection.prepare(query)
            # delivered before prepare() returned (asyncpg schedules listeners in order)
            ((message,),) = [notices]
            assert (message.severity, message.sqlstate) == ("NOTICE", "00000")
            assert json.loads(message.message) == {
                "type": "PreparedStatementMetadata",
                "query": query,
                "tier": "default",
                "dk_meta": [[1, 20]],
            }
            await connection.execute(query, 5)
            assert await connection.fetchval("SELECT count(*) FROM landed") == 1
            # a statement prepared before a DDL answers 42999 on Bind, and nothing runs
            statement = await connection.prepare(query)
            proxy.invalidate()
            with pytest.raises(asyncpg.PostgresError) as raised:
                await statement.fetch(6)
            assert raised.value.sqlstate == "42999"
            assert "has been invalidated" in str(raised.value)
            assert c.catalog.connection.execute("SELECT count(*) FROM landed").fetchall() == [(1,)]
        finally:
            await connection.close()
        # without the setting (and with Picodata's options beside PostgreSQL's): no notice
        notices.clear()
        options = f"-c search_path={c.catalog.schema},forward=off"
        connection = await asyncpg.connect(
            c.url, host="127.0.0.1", port=proxy.port, server_settings={"options": options}
        )
        try:
            connection.add_log_listener(lambda _, message: notices.append(message))
            await connection.prepare(query)
            assert notices == []
            assert await connection.fetchval("SHOW search_path") == c.catalog.schema
        finally:
            await connection.close()
