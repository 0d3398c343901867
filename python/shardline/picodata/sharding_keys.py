"""Sharding keys from Picodata's ``_pico_table``: which fields of a row form its key, hashed how,
in which tier.

A user routes a row without knowing its table's key: :func:`load_tables` reads every table's
distribution once (one query), and :func:`key_of` picks the key fields out of a row as a
:class:`ShardingKey`, which ``Topology.bucket_id(key.tier, key.values)`` hashes the way
Picodata does.

What ``_pico_table`` holds (Picodata's ``src/schema.rs``: ``TableDef``, ``Distribution``,
``ShardingFn``; rows as ``test/int/test_ddl.py::test_ddl_create_sharded_space`` and the
SQL test ``SELECT id, format, distribution FROM _pico_table`` in ``test/int`` show them):

- ``distribution`` is a MessagePack map (Picodata's ``msgpack::Encode`` derive, in
  ``tarantool-module``'s ``tarantool-proc/src/lib.rs``): a variant with fields is a one-key map
  from the variant's name to the array of its fields, e.g.
  ``{"ShardedImplicitly": [["a"], "murmur3", "default"]}`` (sharding key field names, hash
  function, tier) and ``{"ShardedByField": ["bucket_id", "default"]}`` (field, tier); the unit
  variant ``Global`` is the bare string ``"Global"`` (a one-key map ``{"Global": …}`` is read
  the same). Over pgproto a map or array column arrives as JSON text; both the text and an
  already decoded value are read.
- ``format`` is an array of ``{"name": …, "field_type": …, "is_nullable": …}`` maps, in field
  order, ``bucket_id`` included (Picodata adds it to sharded tables); only ``name`` is read.
- Picodata's SQL routes only ``murmur3`` (sbroad refuses other hash functions: "by hash
  function …" not implemented), so only a ``murmur3`` key is routable here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardline.errors import InvalidArgument, InvalidEvent

__all__ = [
    "MAX_KEY_FIELDS",
    "MAX_TABLES",
    "MAX_TEXT",
    "ROUTABLE_SHARDING_FN",
    "TABLES_QUERY",
    "ShardingKey",
    "TableDistribution",
    "key_of",
    "load_tables",
    "parse_table",
    "parse_tables",
]

TABLES_QUERY = "SELECT name, distribution, format FROM _pico_table"
"""The one query :func:`load_tables` runs (columns as in Picodata's ``TableDef::format``)."""

ROUTABLE_SHARDING_FN = "murmur3"
"""The only ``ShardingFn`` a key can be routed by (Picodata's default, and all its SQL routes)."""

MAX_TABLES = 100_000
"""Most ``_pico_table`` rows accepted from one read."""

MAX_TEXT = 1024
"""Longest table name, field name, tier or hash function name accepted."""

MAX_KEY_FIELDS = 256
"""Most sharding key fields (or format fields named in a key) accepted for one table."""

MAX_FIELDS = 10_000
"""Most fields accepted in one table's ``format``."""

MAX_DOCUMENT = 2 << 20
"""Longest ``distribution`` or ``format`` JSON text accepted, in characters."""

MAX_DEPTH = 32
"""Deepest JSON nesting accepted in ``distribution`` or ``format`` (they need three levels)."""

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


@dataclass(frozen=True, slots=True)
class ShardingKey:
    """A row's sharding key: ``values`` in the order of the table's key fields, hashed in
    ``tier``. Passed as ``key=``, it routes the query with its own tier."""

    table: str
    tier: str
    values: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class TableDistribution:
    """How one table's rows are spread, as ``_pico_table.distribution`` says.

    ``kind`` is ``"global"`` (every instance holds every row), ``"sharded_implicitly"`` (the
    bucket is the hash of ``sharding_key``'s fields) or ``"sharded_by_field"`` (the row holds
    its bucket id in ``field``); ``tier`` is ``None`` for a global table; ``fields`` are the
    table's field names in order (``bucket_id`` included).
    """

    table: str
    kind: str
    tier: str | None = None
    sharding_key: tuple[str, ...] = ()
    sharding_fn: str | None = None
    field: str | None = None
    fields: tuple[str, ...] = ()


def key_of(distribution: TableDistribution, row: Mapping[str, Any]) -> ShardingKey:
    """The sharding key of ``row`` (field name → value: a mapping, or a record such as
    asyncpg's ``Record``) in ``distribution``'s table.

    Raises :class:`~shardline.errors.InvalidArgument` naming the table when the table has no
    routable key: a global table (run the query without ``key=``: any instance serves it), a
    table sharded by an explicit bucket id field, or a hash function other than ``murmur3``;
    and naming the field and the table when ``row`` lacks a key field (a ``row`` that is
    neither a mapping nor a record is refused too). Fields outside the key are ignored.
    """
    table = distribution.table
    if not isinstance(row, Mapping) and not (
        hasattr(row, "keys") and hasattr(row, "__getitem__") and not isinstance(row, type)
    ):
        raise InvalidArgument(
            f"row of table {table!r} must be a mapping of field names to values,"
            f" got {type(row).__name__}"
        )
    if distribution.kind == "global":
        raise InvalidArgument(
            f"table {table!r} is global (every instance holds all of it): it has no sharding"
            " key; run the query without key="
        )
    if distribution.kind == "sharded_by_field":
        raise InvalidArgument(
            f"table {table!r} is sharded by the explicit bucket id in field"
            f" {distribution.field!r}, not by a hashed sharding key"
        )
    if distribution.sharding_fn != ROUTABLE_SHARDING_FN:
        raise InvalidArgument(
            f"table {table!r} is sharded with hash function {distribution.sharding_fn!r};"
            f" only {ROUTABLE_SHARDING_FN!r} keys can be routed"
        )
    if not distribution.sharding_key or distribution.tier is None:
        raise InvalidArgument(
            f"table {table!r}: a sharded_implicitly distribution needs a sharding_key and a"
            f" tier, got {list(distribution.sharding_key)!r} and {distribution.tier!r}"
        )
    values = []
    for name in distribution.sharding_key:
        try:
            values.append(row[name])
        except KeyError:
            raise InvalidArgument(
                f"row of table {table!r} lacks sharding key field {name!r}"
                f" (the key is {list(distribution.sharding_key)!r})"
            ) from None
    return ShardingKey(table=table, tier=distribution.tier, values=tuple(values))


def parse_tables(rows: Iterable[Sequence[Any]]) -> dict[str, TableDistribution]:
    """Reads ``_pico_table`` rows of :data:`TABLES_QUERY` (``name``, ``distribution``,
    ``format``) into table name → :class:`TableDistribution`.

    All or nothing: raises :class:`~shardline.errors.InvalidEvent` naming the table and the
    field for a malformed row, a duplicate name, or more than :data:`MAX_TABLES` rows.
    """
    tables: dict[str, TableDistribution] = {}
    for count, row in enumerate(rows, start=1):
        if count > MAX_TABLES:
            raise InvalidEvent(f"_pico_table: more than {MAX_TABLES} rows")
        parsed = parse_table(row)
        if parsed.table in tables:
            raise InvalidEvent(f"_pico_table: two rows for table {parsed.table!r}")
        tables[parsed.table] = parsed
    return tables


def parse_table(row: Sequence[Any]) -> TableDistribution:
    """One ``_pico_table`` row (``name``, ``distribution``, ``format``); raises
    :class:`~shardline.errors.InvalidEvent` naming the table and the field."""
    if isinstance(row, (str, bytes)) or not isinstance(row, Sequence) or len(row) != 3:
        raise InvalidEvent(
            f"_pico_table: a row must be (name, distribution, format), got {_short(row)}"
        )
    name = row[0]
    if not isinstance(name, str) or not name or len(name) > MAX_TEXT:
        raise InvalidEvent(
            f"_pico_table: field 'name' must be a non-empty str of at most {MAX_TEXT}"
            f" characters, got {_short(name)}"
        )
    _check_text(name, name, "name")
    fields = _fields(name, _document(name, "format", row[2]))
    return _distribution(name, _document(name, "distribution", row[1]), fields)


async def load_tables(connection: Any) -> dict[str, TableDistribution]:
    """Reads every table's distribution from ``_pico_table`` over an asyncpg ``connection``
    (one query, :data:`TABLES_QUERY`). Raises what :func:`parse_tables` raises, and the
    driver's own errors for the query.

    Implementation notes:
        ``fetch`` returns ``json`` columns as text (asyncpg decodes no JSON unless a codec is
        set) and records that index like tuples; both forms are read.
    """
    records = await connection.fetch(TABLES_QUERY)
    return parse_tables(tuple(record) for record in records)


# reading the row's parts


def _distribution(table: str, value: Any, fields: tuple[str, ...]) -> TableDistribution:
    where = f"_pico_table: table {table!r}: field 'distribution'"
    if value == "Global":
        return TableDistribution(table=table, kind="global", fields=fields)
    if not isinstance(value, Mapping) or len(value) != 1:
        raise InvalidEvent(
            f'{where} must be "Global" or a one-key map of the variant\'s name to its'
            f" fields, got {_short(value)}"
        )
    ((variant, parts),) = value.items()
    if variant == "Global":
        return TableDistribution(table=table, kind="global", fields=fields)
    if variant == "ShardedImplicitly":
        if not isinstance(parts, list) or len(parts) != 3:
            raise InvalidEvent(
                f"{where}: ShardedImplicitly must be [sharding_key, sharding_fn, tier],"
                f" got {_short(parts)}"
            )
        key, sharding_fn, tier = parts
        if not isinstance(key, list) or not key or len(key) > MAX_KEY_FIELDS:
            raise InvalidEvent(
                f"{where}: sharding_key must be a list of 1 to {MAX_KEY_FIELDS} field names,"
                f" got {_short(key)}"
            )
        names = tuple(_name(table, "sharding_key", part) for part in key)
        if len(set(names)) != len(names):
            raise InvalidEvent(f"{where}: sharding_key names a field twice: {list(names)!r}")
        for part in names:
            if fields and part not in fields:
                raise InvalidEvent(
                    f"{where}: sharding_key field {part!r} is not in the table's format"
                )
        return TableDistribution(
            table=table,
            kind="sharded_implicitly",
            tier=_name(table, "tier", tier),
            sharding_key=names,
            sharding_fn=_name(table, "sharding_fn", sharding_fn),
            fields=fields,
        )
    if variant == "ShardedByField":
        if not isinstance(parts, list) or len(parts) != 2:
            raise InvalidEvent(
                f"{where}: ShardedByField must be [field, tier], got {_short(parts)}"
            )
        return TableDistribution(
            table=table,
            kind="sharded_by_field",
            tier=_name(table, "tier", parts[1]),
            field=_name(table, "field", parts[0]),
            fields=fields,
        )
    raise InvalidEvent(f"{where}: unknown variant {_short(variant)}")


def _fields(table: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) > MAX_FIELDS:
        raise InvalidEvent(
            f"_pico_table: table {table!r}: field 'format' must be a list of at most"
            f" {MAX_FIELDS} field maps, got {_short(value)}"
        )
    names = []
    for position, field in enumerate(value):
        if not isinstance(field, Mapping) or "name" not in field:
            raise InvalidEvent(
                f"_pico_table: table {table!r}: field 'format'[{position}] must be a map with"
                f" a 'name', got {_short(field)}"
            )
        names.append(_name(table, f"format[{position}].name", field["name"]))
    return tuple(names)


def _document(table: str, field: str, value: Any) -> Any:
    """A JSON text decoded within the bounds, or a value a driver already decoded."""
    if isinstance(value, bytes):
        try:
            value = value.decode()
        except UnicodeDecodeError as error:
            raise InvalidEvent(
                f"_pico_table: table {table!r}: field {field!r} is not UTF-8: {error}"
            ) from None
    if not isinstance(value, str):
        return value
    if len(value) > MAX_DOCUMENT:
        raise InvalidEvent(
            f"_pico_table: table {table!r}: field {field!r} is {len(value)} characters long,"
            f" more than {MAX_DOCUMENT}"
        )
    if value == "Global":  # the unit variant as a bare string, not JSON-quoted
        return value
    depth = 0
    for bracket in _BRACKET.findall(_STRING.sub("", value)):
        depth += 1 if bracket in "[{" else -1
        if depth > MAX_DEPTH:
            raise InvalidEvent(
                f"_pico_table: table {table!r}: field {field!r} nests deeper than"
                f" {MAX_DEPTH} levels"
            )
    try:
        return json.loads(value)
    except ValueError as error:
        raise InvalidEvent(
            f"_pico_table: table {table!r}: field {field!r} is not JSON ({error}): {_short(value)}"
        ) from None


def _name(table: str, field: str, value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_TEXT:
        raise InvalidEvent(
            f"_pico_table: table {table!r}: {field} must be a non-empty str of at most"
            f" {MAX_TEXT} characters, got {_short(value)}"
        )
    _check_text(table, value, field)
    return value


def _check_text(table: str, value: str, field: str) -> None:
    try:
        value.encode()
    except UnicodeEncodeError:
        raise InvalidEvent(
            f"_pico_table: table {table!r}: {field} holds a lone surrogate: {value!r}"
        ) from None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "…"
