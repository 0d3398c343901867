"""Picodata's pgproto additions for smart clients, imitated by a pgwire proxy in front of one
PostgreSQL: what ``shardline.picodata`` sees of them is tested through it.

:class:`PgprotoProxy` is a :class:`~support.forwarded_cluster.Forwarder` (one per instance of
``forwarded_cluster``'s layout) that reads the protocol instead of pumping bytes. Each imitated
behaviour, with the Picodata file it was read from (repository picodata/picodata, 26.1 unless
named):

- **Startup** (``src/pgproto/client/startup.rs`` ``ClientParams::new``): ``pico_query_metadata``
  and ``pico_stmt_invalidation`` come as startup parameters or as pairs of ``options``
  (``name=value`` pieces separated by ``,``; a startup parameter wins over the same option);
  ``forward`` (26.2, ``doc/adr/2026-03-13-forward-option.md``: ``options=forward%3Doff``) and
  ``read_preference`` come as options. The proxy strips them all before PostgreSQL sees the
  startup message and keeps them for the session.
- **Query metadata** (``src/pgproto/client/extended_query.rs`` ``process_parse_message``,
  ``src/pgproto/backend/storage.rs`` ``PreparedStatementMetadata``,
  ``src/pgproto/messages.rs`` ``notice``): with ``pico_query_metadata`` on, every Parse is
  answered by a NoticeResponse (fields ``S`` = ``NOTICE``, ``C`` = ``00000``, ``M`` = JSON)
  right before ParseComplete. The JSON is ``{"type": "PreparedStatementMetadata", "query":
  <the Parse's text>, "tier": <tier or null>, "dk_meta": [[<parameter number, from 1>,
  <type oid>], ...]}`` (serde's internally tagged struct), ``dk_meta`` in the order of the
  table's distribution key. :func:`analyze` computes it from :data:`Table` definitions (the
  "table of distributions"); the rules are those ``test/pgproto/smart_client_features_test.py``
  shows (checked against its examples in ``tests/picodata/test_picodata_pgproto_standin.py``):
  a single-row ``INSERT ... VALUES`` whose every distribution-key column is given a distinct
  ``$n`` (a cast names the type, else the column's type) has a non-empty ``dk_meta``; a
  literal or a missing key column, a parameter used twice, several rows, ``INSERT ...
  SELECT`` and any ``SELECT`` give ``[]``. Types are Picodata's (``sbroad_type_to_pg``):
  integer → 20, decimal → 1700, double → 701, string → 25, uuid → 2950, boolean → 16,
  datetime → 1184.
- **Stale statements** (``storage.rs`` ``Statement::ensure_valid``; the test's
  ``test_pico_stmt_invalidation``: ``C`` = ``42999``, ``M`` = ``prepared statement <name>
  has been invalidated``): after :meth:`PgprotoProxy.invalidate` (a DDL, for the statements
  prepared before it), a Bind of such a statement in a session with ``pico_stmt_invalidation``
  is answered by that error; nothing of the Bind runs. ``sqlstate 42999`` and the message are
  the test's; the ADR (``doc/adr/2025-09-12-pgproto-query-metadata.md``) says re-prepare.
- **forward = off** (the ADR above; ``test/int/sql/explain_forward.sql`` and
  ``test_explain_forward.py`` for the text): in a session with ``forward=off``, a Bind of a
  statement with a non-empty ``dk_meta`` whose bucket is not owned by this instance (its
  replicaset's master, per :attr:`PgprotoProxy.owner_of`) is refused with ``sbroad: invalid
  option: cannot satisfy "forward = off": buckets span multiple nodes and are not present on
  the current node``, SQLSTATE ``XX000`` (pgproto's code for an sbroad error,
  ``src/pgproto/error.rs``); nothing runs. Statements without ``dk_meta`` are not judged (the
  stand-in cannot tell what they touch).

Errors are sent the way PostgreSQL ends a failed extended-query batch: the messages up to Sync
are dropped, and the ErrorResponse comes right before the batch's ReadyForQuery.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime
import decimal
import json
import re
import struct
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardline import bucket_id
from support.forwarded_cluster import BUCKETS, INSTANCES, Cluster, Forwarder, Side, cataloged
from support.pg_server import PgServer
from support.picodata_catalog import Catalog, name_uuid

# sbroad's types as pgproto announces them (storage.rs sbroad_type_to_pg), by the names SQL
# casts and column definitions use
TYPE_OIDS = {
    "int": 20,
    "integer": 20,
    "bigint": 20,
    "unsigned": 20,
    "decimal": 1700,
    "numeric": 1700,
    "double": 701,
    "text": 25,
    "string": 25,
    "varchar": 25,
    "uuid": 2950,
    "bool": 16,
    "boolean": 16,
    "datetime": 1184,
}

PICODATA_OPTIONS = ("pico_query_metadata", "pico_stmt_invalidation", "forward", "read_preference")

STALE_STATE = "42999"
FORWARD_REFUSED = (
    'sbroad: invalid option: cannot satisfy "forward = off": buckets span multiple nodes and'
    " are not present on the current node"
)


@dataclass(frozen=True)
class Table:
    """A sharded table as Picodata's planner knows it: columns (name, type) in order, the
    distribution key (``DISTRIBUTED BY``, else the primary key) and the tier."""

    columns: tuple[tuple[str, str], ...]
    key: tuple[str, ...]
    tier: str = "default"


def _unquoted(text: str) -> Iterator[tuple[int, str, int]]:
    """Each character of ``text`` outside quotes: its index, itself, and the parenthesis depth
    once it is read (a "(" counts in, a ")" out)."""
    depth, quote = 0, ""
    for i, char in enumerate(text):
        if quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        else:
            depth += (char == "(") - (char == ")")
            yield i, char, depth


def _split_top(text: str, separator: str = ",") -> list[str]:
    """``text`` split at ``separator`` outside quotes and parentheses."""
    parts, start = [], 0
    for i, char, depth in _unquoted(text):
        if char == separator and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [part.strip() for part in parts]


def _tuples(values: str) -> list[str] | None:
    """The parenthesized rows of a VALUES clause (their insides), or None if it is not one."""
    rows = []
    rest = values.strip()
    while rest:
        if not rest.startswith("("):
            return rows or None  # ON CONFLICT, RETURNING...: the rows are all read
        for i, char, depth in _unquoted(rest):
            if char == ")" and depth == 0:
                rows.append(rest[1:i])
                rest = rest[i + 1 :].strip()
                break
        else:
            return None
        if rest.startswith(","):
            rest = rest[1:].strip()
        elif rest:
            break
    return rows


_INSERT = re.compile(
    r"\s*insert\s+into\s+(\w+)\s*(?:\(([^)]*)\))?\s*values\s*(.*?)\s*;?\s*\Z",
    re.IGNORECASE | re.DOTALL,
)
_PARAM = re.compile(r"\$(\d+)(?:\s*::\s*(\w+))?\Z")
_PARAMS = re.compile(r"\$(\d+)")


def analyze(query: str, tables: Mapping[str, Table]) -> tuple[str | None, list[list[int]]]:
    """``(tier, dk_meta)`` of ``query``, as Picodata's PreparedStatementMetadata gives them
    (see the module's docstring for the rules)."""
    words = {word.lower() for word in re.findall(r"\w+", query)}
    tier = next((table.tier for name, table in tables.items() if name in words), None)
    match = _INSERT.match(query)
    if match is None:
        return tier, []
    table = tables.get(match.group(1).lower())
    if table is None:
        return tier, []
    rows = _tuples(match.group(3))
    if rows is None or len(rows) != 1:
        return table.tier, []
    expressions = _split_top(rows[0])
    names = (
        [name.strip().lower() for name in match.group(2).split(",")]
        if match.group(2) is not None
        else [name for name, _ in table.columns]
    )
    if len(names) != len(expressions):
        return table.tier, []
    used = collections.Counter(int(n) for n in _PARAMS.findall(rows[0]))
    if any(count > 1 for count in used.values()):
        return table.tier, []
    given = dict(zip(names, expressions, strict=True))
    types = dict(table.columns)
    meta = []
    for column in table.key:
        param = _PARAM.match(given.get(column, ""))
        if param is None:
            return table.tier, []
        oid = TYPE_OIDS.get((param.group(2) or types[column]).lower())
        if oid is None:
            return table.tier, []
        meta.append([int(param.group(1)), oid])
    return table.tier, meta


# pgwire framing


def _message(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


def _fields(pairs: Sequence[tuple[bytes, str]]) -> bytes:
    return b"".join(code + text.encode() + b"\0" for code, text in pairs) + b"\0"


def notice(tier: str | None, query: str, dk_meta: list[list[int]]) -> bytes:
    """The NoticeResponse pgproto sends before ParseComplete (``messages.rs`` ``notice``)."""
    document = {"type": "PreparedStatementMetadata", "query": query, "tier": tier}
    document["dk_meta"] = dk_meta
    return _message(
        b"N", _fields([(b"S", "NOTICE"), (b"C", "00000"), (b"M", json.dumps(document))])
    )


def error(code: str, text: str) -> bytes:
    return _message(b"E", _fields([(b"S", "ERROR"), (b"V", "ERROR"), (b"C", code), (b"M", text)]))


def _cstring(body: bytes, at: int) -> tuple[str, int]:
    end = body.index(b"\0", at)
    return body[at:end].decode(), end + 1


def _decode(raw: bytes, binary: bool, oid: int) -> Any:
    """A bound parameter's value for hashing, as Picodata would read it (ints, text, uuid,
    booleans, doubles; anything else raises ValueError)."""
    if not binary:
        text = raw.decode()
        if oid == 20:
            return int(text)
        if oid == 25:
            return text
        if oid == 2950:
            return uuid.UUID(text)
        if oid == 16:
            return text in ("t", "true")
        if oid == 701:
            return float(text)
        if oid == 1700:
            return decimal.Decimal(text)
        raise ValueError(f"oid {oid}")
    if oid == 20 and len(raw) in (2, 4, 8):
        return int.from_bytes(raw, "big", signed=True)
    if oid == 25:
        return raw.decode()
    if oid == 2950 and len(raw) == 16:
        return uuid.UUID(bytes=raw)
    if oid == 16 and len(raw) == 1:
        return raw != b"\0"
    if oid == 701 and len(raw) == 8:
        return struct.unpack("!d", raw)[0]
    if oid == 1184 and len(raw) == 8:
        micros = struct.unpack("!q", raw)[0]
        epoch = datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)
        return epoch + datetime.timedelta(microseconds=micros)
    raise ValueError(f"binary oid {oid}")


def _bind_values(body: bytes) -> tuple[str, list[tuple[bytes | None, bool]]]:
    """A Bind's statement name and its parameters (raw bytes, is binary)."""
    _, at = _cstring(body, 0)  # portal
    statement, at = _cstring(body, at)
    (nformats,) = struct.unpack_from("!h", body, at)
    formats = struct.unpack_from(f"!{nformats}h", body, at + 2)
    at += 2 + 2 * nformats
    (nvalues,) = struct.unpack_from("!h", body, at)
    at += 2
    values = []
    for i in range(nvalues):
        (length,) = struct.unpack_from("!i", body, at)
        at += 4
        raw = None if length < 0 else body[at : at + length]
        at += max(length, 0)
        binary = bool(formats[0] if nformats == 1 else formats[i] if nformats else 0)
        values.append((raw, binary))
    return statement, values


@dataclass
class _Session:
    metadata: bool = False
    invalidation: bool = False
    forward: str = "on"
    statements: dict[str, tuple[str | None, list[list[int]]]] = field(default_factory=dict)
    stale: set[str] = field(default_factory=set)
    # notices waiting for their ParseComplete: (batch, bytes); actions for each ReadyForQuery
    notices: collections.deque[tuple[int, bytes]] = field(default_factory=collections.deque)
    batches: collections.deque[bytes | None] = field(default_factory=collections.deque)
    sent: int = 0  # batches ended (Sync, Query) so far
    answered: int = 0
    pending_error: bytes | None = None  # the error of the batch being skipped


def _startup(body: bytes, session: _Session) -> bytes:
    """The startup message without Picodata's parameters and options, which ``session``
    keeps."""
    version = body[:4]
    items = body[4:].split(b"\0")
    params: dict[str, str] = {}
    for i in range(0, len(items) - 1, 2):
        if items[i]:
            params[items[i].decode()] = items[i + 1].decode()
    settings: dict[str, str] = {}
    options = params.pop("options", None)
    if options is not None:
        kept = []
        for piece in options.split(","):
            name, _, value = piece.partition("=")
            if name.strip() in PICODATA_OPTIONS:
                settings[name.strip()] = value.strip()
            else:
                kept.append(piece)
        if kept:
            params["options"] = ",".join(kept)
    for name in ("pico_query_metadata", "pico_stmt_invalidation"):
        if name in params:  # a startup parameter wins over the option
            settings[name] = params.pop(name)
    session.metadata = settings.get("pico_query_metadata") == "true"
    session.invalidation = settings.get("pico_stmt_invalidation") == "true"
    session.forward = settings.get("forward", "on")
    rest = b"".join(k.encode() + b"\0" + v.encode() + b"\0" for k, v in params.items())
    return version + rest + b"\0"


class PgprotoProxy(Forwarder):
    """One instance of the stand-in: Picodata's pgproto additions over a PostgreSQL (see the
    module's docstring). ``name`` is the instance's; ``owner_of(bucket)`` is the uuid of the
    instance that may run a query of that bucket under ``forward=off`` (the master of the
    replicaset owning it)."""

    def __init__(
        self,
        target: int,
        name: str,
        tables: Mapping[str, Table],
        owner_of: Callable[[int], str],
        bucket_count: int = BUCKETS,
    ) -> None:
        super().__init__(target)
        self.name = name
        self.tables = tables
        self.owner_of = owner_of
        self.bucket_count = bucket_count
        self.sessions: list[_Session] = []
        self.parses = 0
        self.stale_refused = 0
        self.forward_refused = 0
        self.binds = 0  # Binds forwarded to the server
        self.invalidate_always = False  # every Bind finds its statement stale

    def invalidate(self) -> None:
        """As a DDL on the tables: every statement prepared so far is stale."""
        for session in self.sessions:
            session.stale.update(session.statements)

    async def _carry(self, down: Side, up: Side) -> None:
        (reader, writer), (up_reader, up_writer) = down, up
        session = _Session()
        self.sessions.append(session)
        try:
            if await self._handshake(reader, up_writer, up_reader, writer, session):
                await asyncio.gather(
                    self._frontend(reader, up_writer, session),
                    self._backend(up_reader, writer, session),
                )
        except (ConnectionError, OSError, asyncio.IncompleteReadError, struct.error):
            pass
        finally:
            self.sessions.remove(session)

    @staticmethod
    async def _handshake(
        reader: asyncio.StreamReader,
        upstream: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        downstream: asyncio.StreamWriter,
        session: _Session,
    ) -> bool:
        """An SSLRequest (answered by one byte), then the startup message, neither with a type
        byte; False for a CancelRequest (passed on, nothing follows)."""
        while True:
            (length,) = struct.unpack("!i", await reader.readexactly(4))
            body = await reader.readexactly(length - 4)
            if body[:4] == struct.pack("!i", 80877103):
                upstream.write(struct.pack("!i", length) + body)
                downstream.write(await up_reader.readexactly(1))
                continue
            if body[:4] == struct.pack("!i", 80877102):
                upstream.write(struct.pack("!i", length) + body)
                await upstream.drain()
                return False
            body = _startup(body, session)
            upstream.write(struct.pack("!i", len(body) + 4) + body)
            return True

    async def _frontend(
        self, reader: asyncio.StreamReader, upstream: asyncio.StreamWriter, session: _Session
    ) -> None:
        skipping = False
        while True:
            kind = await reader.readexactly(1)
            (length,) = struct.unpack("!i", await reader.readexactly(4))
            body = await reader.readexactly(length - 4)
            if kind in (b"S", b"Q"):
                session.batches.append(session.pending_error if skipping else None)
                session.sent += 1
                skipping = False
            elif skipping:
                continue
            elif kind == b"P":
                self._parse(body, session)
            elif kind == b"B":
                refusal = self._refusal(body, session)
                if refusal is not None:
                    session.pending_error = refusal
                    skipping = True
                    continue
                self.binds += 1
            elif kind == b"X":
                upstream.write(_message(kind, body))
                await upstream.drain()
                return
            upstream.write(_message(kind, body))
            await upstream.drain()
            await self._flowing.wait()

    def _parse(self, body: bytes, session: _Session) -> None:
        name, at = _cstring(body, 0)
        query, _ = _cstring(body, at)
        tier, dk_meta = analyze(query, self.tables)
        session.statements[name] = (tier, dk_meta)
        session.stale.discard(name)
        self.parses += 1
        if session.metadata:
            session.notices.append((session.sent, notice(tier, query, dk_meta)))

    def _refusal(self, body: bytes, session: _Session) -> bytes | None:
        """The error a Bind is answered with instead of running, or None."""
        statement, values = _bind_values(body)
        if session.invalidation and (self.invalidate_always or statement in session.stale):
            self.stale_refused += 1
            return error(STALE_STATE, f"prepared statement {statement} has been invalidated")
        if session.forward != "off":
            return None
        _, dk_meta = session.statements.get(statement, (None, []))
        if not dk_meta:
            return None
        try:
            key = tuple(
                _decode(values[number - 1][0] or b"", values[number - 1][1], oid)
                for number, oid in dk_meta
            )
        except (ValueError, IndexError, UnicodeDecodeError):
            return None
        if self.owner_of(bucket_id(key, self.bucket_count)) == name_uuid(self.name):
            return None
        self.forward_refused += 1
        return error("XX000", FORWARD_REFUSED)

    async def _backend(
        self, reader: asyncio.StreamReader, downstream: asyncio.StreamWriter, session: _Session
    ) -> None:
        started = False
        while True:
            kind = await reader.readexactly(1)
            (length,) = struct.unpack("!i", await reader.readexactly(4))
            body = await reader.readexactly(length - 4)
            await self._flowing.wait()
            if kind == b"1" and session.notices:
                _, pending = session.notices.popleft()
                downstream.write(pending)
            elif kind == b"Z":
                if started and session.batches:
                    action = session.batches.popleft()
                    if action is not None:
                        downstream.write(action)
                    session.answered += 1
                    while session.notices and session.notices[0][0] < session.answered:
                        session.notices.popleft()  # its Parse failed: no ParseComplete
                started = True
            downstream.write(_message(kind, body))
            await downstream.drain()


def owner_map(catalog: Catalog, tier: str = "default") -> Callable[[int], str]:
    """``owner_of`` for the proxies, read from the catalog's committed rows at each call: the
    uuid of the master of the replicaset whose range holds the bucket ("" if none)."""

    def owner_of(bucket: int) -> str:
        expected = catalog.expected()
        for start, end, owner in expected.maps[tier]:
            if start <= bucket <= end:
                return expected.replicasets[owner][1] or ""
        return ""

    return owner_of


LANDED = Table(columns=(("id", "integer"), ("port", "integer")), key=("id",))


async def start_standin(pg: PgServer, tables: Mapping[str, Table] | None = None) -> Cluster:
    """``forwarded_cluster``'s layout (r1: r1_1..r1_3, r2: r2_1, r2_2; tier ``default`` of
    :data:`BUCKETS` buckets), each instance a :class:`PgprotoProxy`; the table ``landed(id
    bigint, port integer)`` is distributed by ``id``."""
    result = cataloged(pg)
    catalog = result.catalog
    with catalog.transaction():
        # Picodata 26.1: the release whose instances send query metadata
        catalog.set_raw("_pico_instance", "picodata_version", "26.1.1", "true", True)
    owner_of = owner_map(catalog)
    for name in INSTANCES:
        proxy = PgprotoProxy(pg.port, name, tables or {"landed": LANDED}, owner_of)
        await proxy.start()
        result.forwarders[name] = proxy
        catalog.set_address(name, proxy.address)
    return result


@contextlib.asynccontextmanager
async def standin(
    pg: PgServer, tables: Mapping[str, Table] | None = None
) -> AsyncIterator[Cluster]:
    result = await start_standin(pg, tables)
    try:
        yield result
    finally:
        for proxy in result.forwarders.values():
            await proxy.stop()
        result.catalog.close()


@contextlib.contextmanager
def proxies_in_thread(
    targets: Mapping[str, int], tables: Mapping[str, Table], bucket_count: int
) -> Iterator[dict[str, str]]:
    """A :class:`PgprotoProxy` for each instance name → its server's port, served by an event
    loop in a thread of its own (for code that runs elsewhere, a README block's process);
    yields each instance's proxy address. Nothing is refused under ``forward=off``."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    proxies: dict[str, PgprotoProxy] = {}
    try:
        for name, port in targets.items():
            itself = name_uuid(name)
            proxy = PgprotoProxy(port, name, tables, lambda _, me=itself: me, bucket_count)
            asyncio.run_coroutine_threadsafe(proxy.start(), loop).result(10)
            proxies[name] = proxy
        yield {name: proxy.address for name, proxy in proxies.items()}
    finally:
        for proxy in proxies.values():
            asyncio.run_coroutine_threadsafe(proxy.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
