"""Picodata's query metadata: which parameters of a prepared statement make its sharding key.

A session that asks for it (the startup parameter ``pico_query_metadata``, Picodata 26.1) is
sent, for every Parse, a NoticeResponse before ParseComplete whose message is the JSON of
``PreparedStatementMetadata``: ``{"type": "PreparedStatementMetadata", "query": <the
statement's text>, "tier": <its tier, or null>, "dk_meta": [[<parameter number, from 1>,
<type oid>], ...]}``, ``dk_meta`` in the order of the table's distribution key, empty when the
statement's bucket cannot be computed from its parameters alone (picodata/picodata
``src/pgproto/client/extended_query.rs``, ``src/pgproto/backend/storage.rs``,
``doc/adr/2025-09-12-pgproto-query-metadata.md``). :func:`read_notice` reads one into a
:class:`StatementRouting`, which turns an execution's arguments into the key to hash: each
value as the type the oid names (Picodata hashes the typed value: ``5`` bound to a ``decimal``
parameter hashes as the decimal 5, not the integer).
"""

from __future__ import annotations

import datetime
import decimal
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

__all__ = [
    "MAX_STATEMENTS",
    "SESSION_SETTINGS",
    "STALE_STATEMENT",
    "UNKEYED",
    "StatementRouting",
    "metadata_supported",
    "read_notice",
]

SESSION_SETTINGS: Final = {"pico_query_metadata": "true", "pico_stmt_invalidation": "true"}
"""The startup parameters of a session that wants query metadata and SQLSTATE 42999 for a
stale statement (``src/pgproto/client/startup.rs``: a startup parameter wins over the same
name in ``options``)."""

STALE_STATEMENT: Final = "42999"
"""The SQLSTATE of a Bind of a prepared statement that a DDL has invalidated (with
``pico_stmt_invalidation``): re-prepare it (``test/pgproto/smart_client_features_test.py``)."""

MAX_STATEMENTS: Final = 4096
"""The most statements whose metadata a client keeps (then it forgets them all and learns them
again), so that a stream of distinct statement texts cannot grow it without bound."""

_FIRST_VERSION: Final = (26, 1)
"""The Picodata release that introduced ``pico_query_metadata`` and ``pico_stmt_invalidation``
(CHANGELOG.md, 26.1)."""


class _Unroutable(Exception):
    """A value that cannot be read as its parameter's type."""


def _int(value: Any) -> Any:
    if value.__class__ is int:
        return value
    raise _Unroutable


def _text(value: Any) -> Any:
    if isinstance(value, str):
        return str(value)
    raise _Unroutable


def _decimal(value: Any) -> Any:
    if isinstance(value, decimal.Decimal):
        return value
    if value.__class__ is int:
        return decimal.Decimal(value)
    raise _Unroutable


def _double(value: Any) -> Any:
    if value.__class__ is float:
        return value
    if value.__class__ is int:
        return float(value)
    raise _Unroutable


def _bool(value: Any) -> Any:
    if value.__class__ is bool:
        return value
    raise _Unroutable


def _uuid(value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, str):
        try:
            return uuid.UUID(value)
        except ValueError:
            raise _Unroutable from None
    raise _Unroutable


def _datetime(value: Any) -> Any:
    if isinstance(value, datetime.datetime) and value.tzinfo is not None:
        return value
    raise _Unroutable


# the oids pgproto gives parameters (storage.rs sbroad_type_to_pg; int2, int4 and varchar
# are the other names of integer and string it reads)
_READERS: Final[Mapping[int, Callable[[Any], Any]]] = {
    20: _int,
    21: _int,
    23: _int,
    25: _text,
    1043: _text,
    1700: _decimal,
    701: _double,
    16: _bool,
    2950: _uuid,
    1184: _datetime,
}


class StatementRouting:
    """How an execution of one prepared statement is routed: in ``tier``, by the arguments at
    ``positions`` (0-based), each read as the type of its oid. ``positions`` is empty for a
    statement that is not routed by its arguments (:data:`UNKEYED`)."""

    __slots__ = ("_readers", "_single", "positions", "tier")

    def __init__(self, tier: str, positions: Sequence[int], oids: Sequence[int]) -> None:
        self.tier = tier
        self.positions = tuple(positions)
        self._readers = tuple(_READERS[oid] for oid in oids)
        self._single = (self.positions[0], self._readers[0]) if len(self.positions) == 1 else None

    def values(self, args: Sequence[Any]) -> Any:
        """The sharding key of an execution with ``args``: the value (one key part) or the
        tuple of values (several), or None if ``args`` cannot be read as the statement's
        parameters (too few, or a value of another type: the server decides then), or if the
        statement is not routed by its arguments.

        Implementation notes: the hot path of a query routed from metadata; one key part (the
        usual case) costs an index and a class test."""
        try:
            single = self._single
            if single is not None:
                return single[1](args[single[0]])
            readers = zip(self.positions, self._readers, strict=True)
            return tuple(read(args[at]) for at, read in readers) or None
        except (IndexError, _Unroutable):
            return None

    def __repr__(self) -> str:
        return f"StatementRouting(tier={self.tier!r}, positions={self.positions!r})"


UNKEYED: Final = StatementRouting("", (), ())
"""The routing of a statement whose executions go where unkeyed queries go."""


def read_notice(
    text: str, tiers: Mapping[str, int], default_tier: str
) -> tuple[str, StatementRouting] | None:
    """``(query, routing)`` from a notice's message, or None if it is not a
    PreparedStatementMetadata document. A ``dk_meta`` naming a tier the client cannot route
    in (unknown, without buckets), an oid it cannot read a value as, or a malformed entry
    gives :data:`UNKEYED`; a null tier is ``default_tier``."""
    if not text.startswith("{") or "dk_meta" not in text:
        return None
    try:
        document = json.loads(text)
    except ValueError:
        return None
    if not isinstance(document, dict):
        return None
    query, tier, meta = document.get("query"), document.get("tier"), document.get("dk_meta")
    if not isinstance(query, str) or not isinstance(meta, list):
        return None
    tier = default_tier if tier is None else tier
    if not meta or not isinstance(tier, str) or not tiers.get(tier):
        return query, UNKEYED
    positions, oids = [], []
    for entry in meta:
        if (
            not isinstance(entry, list)
            or len(entry) != 2
            or not all(isinstance(n, int) and not isinstance(n, bool) for n in entry)
            or not 1 <= entry[0] <= 65535
            or entry[1] not in _READERS
        ):
            return query, UNKEYED
        positions.append(entry[0] - 1)
        oids.append(entry[1])
    return query, StatementRouting(tier, positions, oids)


def metadata_supported(versions: Sequence[Any]) -> bool:
    """Whether instances of these ``_pico_instance.picodata_version`` values all send query
    metadata (26.1 and later); False for an empty or unreadable list."""
    if not versions:
        return False
    for version in versions:
        parts = str(version).split(".")
        try:
            if (int(parts[0]), int(parts[1])) < _FIRST_VERSION:
                return False
        except (ValueError, IndexError):
            return False
    return True
