"""A PostgreSQL stand-in for Picodata's ``_pico_table``: the columns a sharding-key reader reads.

:func:`install` creates the table beside the catalog of ``tests/support/picodata_catalog.py`` (same
database and schema); :func:`add_sharded`, :func:`add_sharded_by_field` and :func:`add_global`
add a table the way Picodata's DDL records it. Each call commits on its own (autocommit): call
them outside a ``Catalog.transaction()`` block.

Picodata's layout (``src/schema.rs`` ``TableDef::format``): ``id unsigned, name string,
distribution map, format array, schema_version, operable, engine, owner, description, opts``.
Only ``name``, ``distribution`` and ``format`` are read, so only they are kept (``id`` too, as
the key Picodata uses). Picodata's ``map`` and ``array`` columns are ``text`` holding JSON here,
as in ``tests/support/picodata_catalog.py``, so a test can store a malformed value.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import psycopg

SCHEMA = """
CREATE TABLE _pico_table (
    id bigint PRIMARY KEY,            -- TableDef.id: SpaceId (unsigned)
    name text NOT NULL UNIQUE,        -- TableDef.name
    distribution text NOT NULL,       -- TableDef.distribution: Distribution (map), as JSON
    format text NOT NULL              -- TableDef.format: Vec<Field> (array), as JSON
);
"""


def install(connection: psycopg.Connection[Any]) -> None:
    """Creates ``_pico_table`` in the connection's database (its current schema)."""
    connection.execute(SCHEMA)


def field_format(names: Sequence[str], *, sharded: bool) -> list[dict[str, Any]]:
    """A ``format`` array for fields ``names``; a sharded table gets ``bucket_id`` second, as
    Picodata adds it (``test/int/test_ddl.py::test_ddl_create_sharded_space``:
    ``[{"field_type": "unsigned", "is_nullable": False, "name": "id"}, {… "bucket_id"}, …]``)."""
    fields = [{"field_type": "integer", "is_nullable": False, "name": name} for name in names]
    if sharded:
        fields.insert(1, {"field_type": "unsigned", "is_nullable": False, "name": "bucket_id"})
    return fields


def add_row(connection: psycopg.Connection[Any], name: str, distribution: Any, format: Any) -> None:
    """Stores a row as given: ``distribution`` and ``format`` are JSON-encoded unless already
    ``str`` (so a test can store malformed text)."""
    connection.execute(
        "INSERT INTO _pico_table (id, name, distribution, format)"
        " SELECT coalesce(max(id), 1023) + 1, %s, %s, %s FROM _pico_table",
        (
            name,
            distribution if isinstance(distribution, str) else json.dumps(distribution),
            format if isinstance(format, str) else json.dumps(format),
        ),
    )


def add_sharded(
    connection: psycopg.Connection[Any],
    name: str,
    sharding_key: Sequence[str],
    *,
    fields: Sequence[str] | None = None,
    tier: str = "default",
    sharding_fn: str = "murmur3",
) -> None:
    """A table sharded by the hash of ``sharding_key`` (default fields: the key's).

    Picodata's form: ``{"ShardedImplicitly": [["a"], "murmur3", "default"]}`` (the SQL test
    ``SELECT id, format, distribution FROM _pico_table`` in picodata ``test/int``)."""
    add_row(
        connection,
        name,
        {"ShardedImplicitly": [list(sharding_key), sharding_fn, tier]},
        field_format(fields or sharding_key, sharded=True),
    )


def add_sharded_by_field(
    connection: psycopg.Connection[Any],
    name: str,
    fields: Sequence[str],
    *,
    field: str = "bucket_id",
    tier: str = "default",
) -> None:
    """A table whose rows carry their bucket id (``Distribution::ShardedByField { field,
    tier }`` in ``src/schema.rs``, encoded as ``{"ShardedByField": [field, tier]}``)."""
    add_row(
        connection,
        name,
        {"ShardedByField": [field, tier]},
        field_format(fields, sharded=False),
    )


def add_global(connection: psycopg.Connection[Any], name: str, fields: Sequence[str]) -> None:
    """A global table: ``Distribution::Global``, a unit variant, which Picodata's
    ``msgpack::Encode`` derive writes as the bare string ``"Global"`` (tarantool-module
    ``tarantool-proc/src/lib.rs``), JSON ``"Global"`` here."""
    add_row(connection, name, json.dumps("Global"), field_format(fields, sharded=False))
