"""Sharding keys from ``_pico_table``: literal rows as Picodata shows them, the errors, a property
test of ``key_of`` against a reference, the bucket ids of multi-column keys, and ``load_tables``
over a real PostgreSQL with the stand-in ``_pico_table`` (tests/support/picodata_tables.py)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import asyncpg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardline import Topology
from shardline.errors import InvalidArgument, InvalidEvent, ShardlineError
from shardline.picodata.sharding_keys import (
    MAX_DEPTH,
    MAX_TEXT,
    ShardingKey,
    TableDistribution,
    key_of,
    load_tables,
    parse_table,
    parse_tables,
)
from support import picodata_tables
from support.pg_server import PgServer
from support.vectors import PICODATA, key_part

# --------------------------------------------------------------------------------------------
# Literal rows

# picodata/picodata test/int/test_ddl.py::test_ddl_create_sharded_space, the row of
# box.space._pico_table:get(id) (name, distribution, format; schema_version and the rest cut)
DDL_TEST_ROW = (
    "stuff",
    {"ShardedImplicitly": [["foo", "bar"], "murmur3", "default"]},
    [
        {"field_type": "unsigned", "is_nullable": False, "name": "id"},
        {"field_type": "unsigned", "is_nullable": False, "name": "bucket_id"},
        {"field_type": "integer", "is_nullable": False, "name": "foo"},
        {"field_type": "string", "is_nullable": False, "name": "bar"},
    ],
)

# picodata/picodata test/int: `SELECT id, format, distribution FROM _pico_table WHERE name =
# 'sharded_table'` after a rebalance (format and distribution as the SQL answer holds them)
SQL_TEST_ROW = (
    "sharded_table",
    {"ShardedImplicitly": [["a"], "murmur3", "default"]},
    [
        {"field_type": "unsigned", "is_nullable": False, "name": "bucket_id"},
        {"field_type": "integer", "is_nullable": False, "name": "a"},
        {"field_type": "integer", "is_nullable": True, "name": "b"},
    ],
)


def as_text(row: tuple[str, Any, Any]) -> tuple[str, str, str]:
    """The row as pgproto sends map and array columns: JSON text."""
    return (row[0], json.dumps(row[1]), json.dumps(row[2]))


@pytest.mark.parametrize("form", [lambda row: row, as_text], ids=["decoded", "json-text"])
def test_the_rows_of_picodatas_tests(form: Any) -> None:
    tables = parse_tables([form(DDL_TEST_ROW), form(SQL_TEST_ROW)])
    assert tables["stuff"] == TableDistribution(
        table="stuff",
        kind="sharded_implicitly",
        tier="default",
        sharding_key=("foo", "bar"),
        sharding_fn="murmur3",
        fields=("id", "bucket_id", "foo", "bar"),
    )
    assert key_of(tables["stuff"], {"id": 1, "foo": 7, "bar": "x"}) == ShardingKey(
        table="stuff", tier="default", values=(7, "x")
    )
    assert key_of(tables["sharded_table"], {"a": 3, "b": None}).values == (3,)


def test_global_and_sharded_by_field() -> None:
    # src/schema.rs: `Global` is a unit variant, which tarantool-module's msgpack::Encode derive
    # (tarantool-proc/src/lib.rs) writes as the bare variant name; `ShardedByField { field,
    # tier }` as a one-key map to the array of its fields
    rows = [
        ("g1", "Global", []),
        ("g2", json.dumps("Global"), "[]"),
        ("g3", {"Global": []}, []),
        ("by_field", {"ShardedByField": ["bucket_id", "hot"]}, [{"name": "bucket_id"}]),
    ]
    tables = parse_tables(rows)
    assert {name: t.kind for name, t in tables.items()} == {
        "g1": "global",
        "g2": "global",
        "g3": "global",
        "by_field": "sharded_by_field",
    }
    assert tables["by_field"].tier == "hot"
    assert tables["by_field"].field == "bucket_id"
    with pytest.raises(InvalidArgument, match=r"table 'g1' is global.*without key="):
        key_of(tables["g1"], {"id": 1})
    with pytest.raises(InvalidArgument, match=r"table 'by_field' is sharded by .*'bucket_id'"):
        key_of(tables["by_field"], {"bucket_id": 1})


@pytest.mark.parametrize("sharding_fn", ["crc32", "xxhash", "md5"])
def test_a_hash_other_than_murmur3_is_read_but_not_routed(sharding_fn: str) -> None:
    # src/schema.rs ShardingFn: crc32, murmur3 (the default), xxhash, md5; Picodata's SQL
    # refuses all but murmur3 ("by hash function …" not implemented)
    table = parse_table(("t", {"ShardedImplicitly": [["id"], sharding_fn, "default"]}, []))
    assert table.sharding_fn == sharding_fn
    with pytest.raises(
        InvalidArgument, match=rf"'t' is sharded with hash function '{sharding_fn}'"
    ):
        key_of(table, {"id": 1})


def test_a_missing_key_field_is_named_with_the_table() -> None:
    table = parse_table(DDL_TEST_ROW)
    with pytest.raises(
        InvalidArgument, match=r"row of table 'stuff' lacks sharding key field 'bar'"
    ):
        key_of(table, {"id": 1, "foo": 7})
    with pytest.raises(InvalidArgument, match=r"table 'stuff' must be a mapping"):
        key_of(table, [1, 7, "x"])  # type: ignore[arg-type]


def test_a_distribution_built_by_hand_without_a_key_or_tier_is_refused() -> None:
    for distribution in (
        TableDistribution(
            "t", "sharded_implicitly", tier=None, sharding_key=("id",), sharding_fn="murmur3"
        ),
        TableDistribution("t", "sharded_implicitly", tier="default", sharding_fn="murmur3"),
    ):
        with pytest.raises(InvalidArgument, match=r"table 't': a sharded_implicitly distribution"):
            key_of(distribution, {"id": 1})


def test_errors_are_documented_types() -> None:
    with pytest.raises(InvalidArgument) as caught:
        key_of(parse_table(("g", "Global", [])), {})
    assert isinstance(caught.value, ShardlineError)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (("t", "{", "[]"), r"table 't': field 'distribution' is not JSON"),
        (("t", "Global", "{"), r"table 't': field 'format' is not JSON"),
        (("t", "Global", {"name": "a"}), r"table 't': field 'format' must be a list"),
        (("t", "Global", [{"type": "integer"}]), r"'format'\[0\] must be a map with a 'name'"),
        (("t", "Global", [{"name": ""}]), r"format\[0\]\.name must be a non-empty str"),
        (("t", {"Sharded": []}, []), r"table 't': field 'distribution': unknown variant 'Sharded'"),
        (
            ("t", {"Global": [], "X": 1}, []),
            r"field 'distribution' must be \"Global\" or a one-key",
        ),
        (("t", 7, []), r"field 'distribution' must be"),
        # before tiers, ShardedImplicitly had two fields; a row without a tier cannot route
        (
            ("t", {"ShardedImplicitly": [["a"], "murmur3"]}, []),
            r"\[sharding_key, sharding_fn, tier\]",
        ),
        (
            ("t", {"ShardedImplicitly": [[], "murmur3", "d"]}, []),
            r"sharding_key must be a list of 1",
        ),
        (("t", {"ShardedImplicitly": ["a", "murmur3", "d"]}, []), r"sharding_key must be a list"),
        (("t", {"ShardedImplicitly": [["a", "a"], "murmur3", "d"]}, []), r"names a field twice"),
        (("t", {"ShardedImplicitly": [["a"], "murmur3", ""]}, []), r"table 't': tier must be"),
        (
            ("t", {"ShardedImplicitly": [[1], "murmur3", "d"]}, []),
            r"sharding_key must be a non-empty",
        ),
        (("t", {"ShardedImplicitly": [["a"], None, "d"]}, []), r"sharding_fn must be"),
        (
            ("t", {"ShardedImplicitly": [["c"], "murmur3", "d"]}, [{"name": "a"}]),
            r"sharding_key field 'c' is not in the table's format",
        ),
        (("t", {"ShardedByField": ["bucket_id"]}, []), r"ShardedByField must be \[field, tier\]"),
        (("", "Global", []), r"field 'name' must be a non-empty str"),
        (("x" * (MAX_TEXT + 1), "Global", []), r"field 'name' must be a non-empty str of at most"),
        (("t\ud800", "Global", []), r"name holds a lone surrogate"),
        (("t", "Global"), r"a row must be \(name, distribution, format\)"),
        ("t", r"a row must be"),
        (("t", b"\xff", []), r"field 'distribution' is not UTF-8"),
        (("t", "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), []), r"nests deeper than 32"),
    ],
)
def test_a_malformed_row_names_the_table_and_field(row: Any, message: str) -> None:
    with pytest.raises(InvalidEvent, match=message):
        parse_tables([("ok", "Global", []), row])


def test_the_bounds() -> None:
    deep = "[" * 100_000 + "]" * 100_000  # would overflow json's recursion: refused before
    with pytest.raises(InvalidEvent, match="nests deeper"):
        parse_table(("t", "Global", deep))
    # brackets inside JSON strings are not nesting
    assert parse_table(("t", "Global", json.dumps([{"name": "[" * 100}]))).fields == ("[" * 100,)
    with pytest.raises(InvalidEvent, match=r"more than 2097152"):
        parse_table(("t", "Global", " " * (2 << 20) + "[]"))
    with pytest.raises(InvalidEvent, match=r"two rows for table 't'"):
        parse_tables([("t", "Global", []), ("t", "Global", [])])


def test_more_rows_than_the_bound_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import shardline.picodata.sharding_keys as module

    monkeypatch.setattr(module, "MAX_TABLES", 3)
    parse_tables([(f"t{n}", "Global", []) for n in range(3)])
    with pytest.raises(InvalidEvent, match=r"more than 3 rows"):
        parse_tables(iter([(f"t{n}", "Global", []) for n in range(4)]))


# --------------------------------------------------------------------------------------------
# key_of against a reference

names = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=8)
values = st.one_of(st.integers(-(2**63), 2**64 - 1), st.text(max_size=5), st.booleans(), st.none())


def reference_key(table: str, key: list[str], tier: str, row: dict[str, Any]) -> ShardingKey | str:
    """What key_of must give: the key's values in key order, or the first missing field."""
    for name in key:
        if name not in row:
            return name
    return ShardingKey(table=table, tier=tier, values=tuple(row[name] for name in key))


@given(
    table=names,
    key=st.lists(names, min_size=1, max_size=5, unique=True),
    other=st.lists(names, max_size=4),
    tier=names,
    data=st.data(),
)
def test_key_of_matches_the_reference(
    table: str, key: list[str], other: list[str], tier: str, data: st.DataObject
) -> None:
    fields = list(dict.fromkeys([*key, *other]))
    row_fields = data.draw(st.lists(st.sampled_from(fields), unique=True))
    row = {name: data.draw(values) for name in row_fields}
    text = (
        table,
        json.dumps({"ShardedImplicitly": [key, "murmur3", tier]}),
        json.dumps(picodata_tables.field_format(fields, sharded=True)),
    )
    distribution = parse_tables([text])[table]
    want = reference_key(table, key, tier, row)
    if isinstance(want, ShardingKey):
        assert key_of(distribution, row) == want
    else:
        with pytest.raises(InvalidArgument) as caught:
            key_of(distribution, row)
        assert f"lacks sharding key field {want!r}" in str(caught.value)
        assert f"table {table!r}" in str(caught.value)


# --------------------------------------------------------------------------------------------
# Bucket ids of multi-column keys: Picodata's own vectors (shared/data, copied to tests/data)

MULTI = [v for v in PICODATA if len(v["key"]) > 1]


def test_there_are_multi_column_vectors() -> None:
    assert len(MULTI) >= 5


@pytest.mark.parametrize("index", range(len(MULTI)))
def test_a_multi_column_key_hashes_as_picodata_does(index: int) -> None:
    vector = MULTI[index]
    parts = [key_part(part) for part in vector["key"]]
    key_fields = [f"k{n}" for n in range(len(parts))]
    # the row's fields in another order than the key's, with a field outside the key
    row = {"other": "ignored", **dict(reversed(list(zip(key_fields, parts, strict=True))))}
    table = parse_table(
        (
            "t",
            {"ShardedImplicitly": [key_fields, "murmur3", "hot"]},
            [{"name": "other"}, *[{"name": f} for f in key_fields]],
        )
    )
    key = key_of(table, row)
    topology = Topology()
    topology.apply_tiers({"hot": vector["bucket_count"]})
    assert topology.bucket_id(key.tier, key.values) == vector["bucket_id"]


# --------------------------------------------------------------------------------------------
# load_tables over asyncpg, against the stand-in _pico_table


async def test_load_tables_reads_the_stand_in_table(pg: PgServer) -> None:
    schema = f"tables_{uuid.uuid4().hex[:12]}"
    pg.create_schema(schema)
    with pg.connect() as connection:
        connection.execute(f'SET search_path = "{schema}"')
        picodata_tables.install(connection)
        picodata_tables.add_sharded(connection, "users", ["id"], fields=["id", "name"])
        picodata_tables.add_sharded(
            connection, "orders", ["region", "id"], fields=["id", "region"], tier="hot"
        )
        picodata_tables.add_global(connection, "settings", ["key", "value"])
        picodata_tables.add_sharded_by_field(connection, "events", ["id"])

    async def load() -> dict[str, TableDistribution]:
        connection = await asyncpg.connect(
            host="127.0.0.1",
            port=pg.port,
            user="shardline",
            password="shardline",
            database="postgres",
            server_settings={"search_path": schema},
        )
        try:
            tables = await load_tables(connection)
            # a record read from the database is a row too
            record = await connection.fetchrow("SELECT 'x' AS name, 7::bigint AS id")
            assert key_of(tables["users"], record) == ShardingKey("users", "default", (7,))
            record = await connection.fetchrow("SELECT 'x' AS name")
            with pytest.raises(InvalidArgument, match="lacks sharding key field 'id'"):
                key_of(tables["users"], record)
            return tables
        finally:
            await connection.close()

    tables = await load()
    assert set(tables) == {"users", "orders", "settings", "events"}
    assert tables["users"].fields == ("id", "bucket_id", "name")
    assert key_of(tables["users"], {"id": 7, "name": "x"}) == ShardingKey("users", "default", (7,))
    assert key_of(tables["orders"], {"id": 1, "region": "eu"}) == ShardingKey(
        "orders", "hot", ("eu", 1)
    )
    assert tables["settings"].kind == "global"
    assert tables["events"].kind == "sharded_by_field"
