"""A PostgreSQL stand-in for the part of Picodata's catalog a topology driver reads.

:func:`install` creates, in one database, the tables and the ``_pico_bucket(text)`` function;
:class:`Catalog` changes them the way a cluster would (each method is one committed
transaction, or joins the one opened by :meth:`Catalog.transaction`) and reads back what a
driver should conclude (:meth:`Catalog.expected`), straight from the tables with its own SQL.

Assumptions about Picodata, each with its source (repository picodata/picodata unless named):

- Column names and meanings are Picodata's (docs: the system tables' reference, "Описание
  соответствует версии Picodata 25.5.0"; src/tier.rs ``Tier::format``, src/replicaset.rs
  ``Replicaset::format``): ``_pico_tier(name, …, vshard_bootstrapped, bucket_count, …)``,
  ``_pico_replicaset(name, uuid, current_master_name, target_master_name, tier, weight,
  weight_origin, state, …)``, ``_pico_instance(name, uuid, raft_id, replicaset_name,
  replicaset_uuid, current_state, target_state, failure_domain, tier, …)``,
  ``_pico_peer_address(raft_id, address, connection_type)``. Only the columns a driver reads
  or a test changes are kept; version counters and vclocks are left out.
- ``bucket_count`` may be 0: an "arbiter" tier, with members but no sharded data and
  ``vshard_bootstrapped`` false for good (src/tier.rs ``Tier::has_buckets``;
  test/int/test_expelling.py ``test_expel_zero_bucket_tier``, which also checks the flag).
- Picodata's column types differ from PostgreSQL's. Uuids and names are ``text``; Picodata's
  *array* and *map* columns (``current_state``, ``target_state``, ``failure_domain``) are
  ``text`` holding JSON, e.g. ``'["Online", 1]'``, so a test can also store a malformed value.
- A replicaset's master is named by instance *name* (``current_master_name``), not uuid.
- ``_pico_peer_address`` keeps one row per instance and connection type (its primary key is
  ``[raft_id, connection_type]``, docs above): ``'iproto'``, ``'pgproto'``, ``'http'`` (the
  web UI reads HTTP addresses from it, CHANGELOG.md) and ``'plugin:<plugin>.<service>'`` (a
  test/int plugin test reads ``'plugin:testplug_listener.listenerservice'``). SQL clients
  dial the ``'pgproto'`` address (picodata/picodata-go joins ``_pico_peer_address`` on
  ``connection_type = 'pgproto'`` to find the instances it connects to).
- Expelled members stay in the tables. A replicaset's ``state`` is ``not-ready``, ``ready``,
  ``to-be-expelled`` (its governor waits for its buckets to be moved away; no instance may
  join it) or ``expelled`` (src/replicaset.rs ``ReplicasetState``); an expelled instance's
  ``current_state`` and ``target_state`` are ``["Expelled", n]`` (test/int/test_expelling.py
  ``test_join_replicaset_after_expel``, ``test_expel_zero_bucket_tier``). Its peer addresses
  are kept too (not checked against Picodata; a driver ignores them either way).
- ``_pico_bucket(tier)`` returns one JSON *text*: an array of objects with the keys
  ``bucket_id_start``, ``target_replicaset_uuid``, ``tier_name``, ``state``, ``bucket_id_end``,
  ``current_replicaset_uuid``, ordered by ``bucket_id_start`` (so an unchanged map gives an
  identical text, as a poll of a quiet cluster does). The ranges live in ``_test_bucket``, a
  table Picodata does not have.
- ``_pico_bucket`` errors (the SQL engine's Lua builtin ``_PICO_BUCKET``; texts as
  test/pgproto/_pico_bucket_function_test.py matches them, with the ``sbroad:`` prefix the
  admin console shows in the bucket-map seed): a tier without a vshard router (unknown, or
  an arbiter tier, as the issue reports) raises ``sbroad: _pico_bucket: tier '<name>'
  doesn't exist``; a tier whose buckets are not bootstrapped yet fails to route its first
  bucket: ``sbroad: _pico_bucket: Bucket 1 cannot be found. Is rebalancing in progress?``
  (vshard's ``NO_ROUTE_TO_BUCKET`` message).
- A rebalance makes ``_pico_bucket(tier)`` raise until it settles (in Picodata, vshard's
  ``NO_ROUTE_TO_BUCKET`` again, for a bucket in transfer; the stand-in's default text,
  ``REBALANCE_ERROR``, is its own): :meth:`Catalog.fail_buckets` stores the error in
  ``_test_bucket_fault``, which also holds a delay (to kill a connection mid-poll) and a raw
  replacement payload (to serve malformed JSON).
- The tests reuse names (and the uuids made from them) after an expel. Picodata's
  ``_pico_replicaset`` is keyed by name, so a new replicaset of an expelled one's name
  replaces its row (with a new uuid there; test_expelling.py
  ``test_join_replicaset_after_expel``); the stand-in also lets a new instance replace an
  expelled one of its name, which Picodata would name afresh.
- ``_test_bucket``, ``_test_bucket_fault`` and the ``_test_*`` functions (which add an
  instance with the next raft id, and spread a tier's buckets by weight) are the tests' own.
- Transactions: a driver may read the tables in separate statements; the tests commit their
  changes between polls, so every poll sees one committed state.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg

SCHEMA = """
CREATE TABLE _pico_tier (
    name text PRIMARY KEY,
    replication_factor integer NOT NULL DEFAULT 1,
    can_vote boolean NOT NULL DEFAULT true,
    vshard_bootstrapped boolean NOT NULL DEFAULT true,
    bucket_count integer NOT NULL,
    is_default boolean NOT NULL DEFAULT false
);
CREATE TABLE _pico_replicaset (
    name text PRIMARY KEY,
    uuid text NOT NULL UNIQUE,
    current_master_name text,
    target_master_name text,
    tier text NOT NULL,
    weight double precision NOT NULL DEFAULT 1,
    weight_origin text NOT NULL DEFAULT 'auto',
    state text NOT NULL DEFAULT 'ready'
);
CREATE TABLE _pico_instance (
    name text PRIMARY KEY,
    uuid text NOT NULL UNIQUE,
    raft_id bigint NOT NULL UNIQUE,
    replicaset_name text NOT NULL,
    replicaset_uuid text NOT NULL,
    current_state text NOT NULL,
    target_state text NOT NULL,
    failure_domain text NOT NULL DEFAULT '{}',
    tier text NOT NULL,
    picodata_version text NOT NULL DEFAULT '25.5.0'
);
CREATE TABLE _pico_peer_address (
    raft_id bigint NOT NULL,
    address text NOT NULL,
    connection_type text NOT NULL,
    PRIMARY KEY (raft_id, connection_type)
);
CREATE TABLE _test_bucket (
    tier_name text NOT NULL,
    bucket_id_start integer NOT NULL,
    bucket_id_end integer NOT NULL,
    current_replicaset_uuid text NOT NULL,
    target_replicaset_uuid text NOT NULL,
    state text NOT NULL DEFAULT 'active',
    PRIMARY KEY (tier_name, bucket_id_start)
);
CREATE TABLE _test_bucket_fault (
    tier_name text PRIMARY KEY,
    message text,
    delay double precision,
    payload text
);
CREATE FUNCTION _pico_bucket(tier text) RETURNS text LANGUAGE plpgsql STABLE AS $$
DECLARE
    fault record;
    result text;
BEGIN
    SELECT * INTO fault FROM _test_bucket_fault f WHERE f.tier_name = tier;
    IF FOUND THEN
        IF fault.delay IS NOT NULL THEN
            PERFORM pg_sleep(fault.delay);
        END IF;
        IF fault.message IS NOT NULL THEN
            RAISE EXCEPTION '%', fault.message;
        END IF;
        IF fault.payload IS NOT NULL THEN
            RETURN fault.payload;
        END IF;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM _pico_tier t WHERE t.name = tier AND t.bucket_count > 0) THEN
        RAISE EXCEPTION 'sbroad: _pico_bucket: tier ''%'' doesn''t exist', tier;
    END IF;
    IF NOT (SELECT t.vshard_bootstrapped FROM _pico_tier t WHERE t.name = tier) THEN
        RAISE EXCEPTION 'sbroad: _pico_bucket: %',
            'Bucket 1 cannot be found. Is rebalancing in progress?';
    END IF;
    SELECT json_agg(json_build_object(
               'bucket_id_start', b.bucket_id_start,
               'target_replicaset_uuid', b.target_replicaset_uuid,
               'tier_name', b.tier_name,
               'state', b.state,
               'bucket_id_end', b.bucket_id_end,
               'current_replicaset_uuid', b.current_replicaset_uuid)
           ORDER BY b.bucket_id_start)::text
      INTO result
      FROM _test_bucket b WHERE b.tier_name = tier;
    RETURN coalesce(result, '[]');
END
$$;
CREATE FUNCTION _test_add_instance(_name text, _replicaset text, _uuid text, _state text,
                                   _port integer) RETURNS void LANGUAGE sql AS $$
    DELETE FROM _pico_peer_address WHERE raft_id IN (
        SELECT raft_id FROM _pico_instance
         WHERE name = _name AND current_state::json->>0 = 'Expelled');
    DELETE FROM _pico_instance WHERE name = _name AND current_state::json->>0 = 'Expelled';
    INSERT INTO _pico_instance (name, uuid, raft_id, replicaset_name, replicaset_uuid,
                                current_state, target_state, tier)
    SELECT _name, _uuid, (SELECT coalesce(max(raft_id), 0) + 1 FROM _pico_instance), r.name,
           r.uuid, json_build_array(_state, 1)::text, json_build_array(_state, 1)::text, r.tier
      FROM _pico_replicaset r WHERE r.name = _replicaset;
    INSERT INTO _pico_peer_address (raft_id, address, connection_type)
    SELECT i.raft_id, a.address, a.kind
      FROM _pico_instance i,
           (VALUES ('127.0.0.1:' || _port, 'pgproto'),
                   ('127.0.0.1:' || (_port + 10000), 'iproto'),
                   ('127.0.0.1:' || (_port + 20000), 'http'),
                   ('127.0.0.1:' || (_port + 30000), 'plugin:radix.cache')) AS a(address, kind)
     WHERE i.name = _name;
$$;
CREATE FUNCTION _test_rebalance(_tier text) RETURNS void LANGUAGE sql AS $$
    DELETE FROM _test_bucket WHERE tier_name = _tier;
    INSERT INTO _test_bucket (tier_name, bucket_id_start, bucket_id_end,
                              current_replicaset_uuid, target_replicaset_uuid)
    SELECT _tier, start_id, end_id, uuid, uuid
      FROM (SELECT uuid, lag(end_id, 1, 0) OVER (ORDER BY n) + 1 AS start_id, end_id
              FROM (SELECT r.uuid, row_number() OVER w AS n,
                           CASE WHEN row_number() OVER w = count(*) OVER ()
                                THEN t.bucket_count
                                ELSE round(t.bucket_count * (sum(r.weight) OVER w)
                                           / (sum(r.weight) OVER ()))::integer
                           END AS end_id
                      FROM _pico_replicaset r JOIN _pico_tier t ON t.name = r.tier
                     WHERE r.tier = _tier AND r.weight > 0 AND r.state <> 'expelled'
                    WINDOW w AS (ORDER BY r.name ROWS BETWEEN UNBOUNDED PRECEDING
                                 AND CURRENT ROW)) AS ends) AS ranges
     WHERE end_id >= start_id;
$$;
"""

TABLES = (
    "_pico_tier",
    "_pico_replicaset",
    "_pico_instance",
    "_pico_peer_address",
    "_test_bucket",
    "_test_bucket_fault",
)

# expelled replicasets and instances, and the instances of expelled replicasets, are not
# members: the rows stay, a driver must leave them out
_EXPECTED_QUERY = """
WITH members AS (
    SELECT i.* FROM _pico_instance i JOIN _pico_replicaset r ON r.uuid = i.replicaset_uuid
     WHERE i.current_state::json->>0 <> 'Expelled' AND r.state <> 'expelled')
SELECT json_build_object(
    'tiers', (SELECT json_agg(json_build_array(name, bucket_count)) FROM _pico_tier),
    'replicasets', (
        SELECT json_agg(json_build_array(r.uuid, r.tier, m.uuid))
        FROM _pico_replicaset r LEFT JOIN members m ON m.name = r.current_master_name
        WHERE r.state <> 'expelled'),
    'instances', (
        SELECT json_agg(json_build_array(
            i.uuid, i.replicaset_uuid, i.current_state::json->>0, p.address))
        FROM members i LEFT JOIN _pico_peer_address p
        ON p.raft_id = i.raft_id AND p.connection_type = 'pgproto'),
    'buckets', (
        SELECT json_agg(json_build_array(
            tier_name, bucket_id_start, bucket_id_end, current_replicaset_uuid)
            ORDER BY tier_name, bucket_id_start)
        FROM _test_bucket))
"""

REBALANCE_ERROR = "sbroad: _pico_bucket: rebalance in progress"
UNKNOWN_TIER_ERROR = "sbroad: _pico_bucket: tier '{}' doesn't exist"
NOT_BOOTSTRAPPED_ERROR = (
    "sbroad: _pico_bucket: Bucket 1 cannot be found. Is rebalancing in progress?"
)

_EXPEL_INSTANCES = (
    "UPDATE _pico_instance SET"
    " current_state = json_build_array('Expelled', current_state::json->1)::text,"
    " target_state = json_build_array('Expelled', current_state::json->1)::text"
)

_NAMESPACE = uuid.UUID("5d3c1b7e-0c55-4a59-9a51-6a8f0e0a6c11")


def name_uuid(name: str) -> str:
    """A stable uuid for a replicaset or instance name."""
    return str(uuid.uuid5(_NAMESPACE, name))


def install(connection: psycopg.Connection[Any]) -> None:
    """Creates the catalog's tables and ``_pico_bucket`` in the connection's database."""
    with connection.transaction():
        connection.execute(SCHEMA)


@dataclass(frozen=True)
class Expected:
    """What a driver should conclude from the catalog: the topology's observable state."""

    tiers: dict[str, int]
    replicasets: dict[str, tuple[str, str | None]]  # uuid -> (tier, master instance uuid)
    instances: dict[str, tuple[str | None, str | None, str | None]]  # uuid -> (rs, state, addr)
    maps: dict[str, list[tuple[int, int, str]]]  # tier -> ranges


class Catalog:
    """Changes the catalog in one database; each method commits, or joins the transaction of
    an enclosing :meth:`transaction` block.

    Changes are sent as late and as few as possible: a block's statements travel as one
    message at its end (``BEGIN; …; COMMIT``, one round trip), unless a read inside the block
    needs them earlier. The helpers that need the catalog's data (raft ids, weights, bucket
    counts) are SQL functions, so no change needs a read first.
    """

    def __init__(self, dsn: str, *, create: bool = True) -> None:
        self.dsn = dsn
        # client-side binding: statements with their values inlined can travel together
        self.connection = psycopg.connect(dsn, autocommit=True, cursor_factory=psycopg.ClientCursor)
        if create:
            install(self.connection)
        self._port = 4000
        self._depth = 0
        self._pending: list[str] = []
        self._begun = False

    @property
    def schema(self) -> str:
        """The schema the catalog lives in (the first of the DSN's ``search_path``)."""
        name: str = self._rows("SELECT current_schema()")[0][0]
        return name

    @property
    def database(self) -> str:
        name: str = self._rows("SELECT current_database()")[0][0]
        return name

    def close(self) -> None:
        self.connection.close()

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Groups the changes made inside into one committed transaction (nested blocks join
        the outermost one); an exception inside leaves the catalog as it was."""
        self._depth += 1
        try:
            yield
        except BaseException:
            if self._depth == 1:
                self._pending = []
                if self._begun:
                    self._begun = False
                    self.connection.execute("ROLLBACK")
            raise
        else:
            if self._depth == 1:
                statements, self._pending = self._pending, []
                if self._begun:
                    self._begun = False
                    self.connection.execute(";".join([*statements, "COMMIT"]))
                elif statements:
                    self.connection.execute(";".join(["BEGIN", *statements, "COMMIT"]))
        finally:
            self._depth -= 1

    def _run(self, query: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> None:
        with self.transaction():
            self._pending.append(self.connection.cursor().mogrify(query, params))

    def _rows(self, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        if self._depth:  # inside a block, a read sees the block's changes so far
            statements, self._pending = self._pending, []
            if not self._begun:
                statements.insert(0, "BEGIN")
                self._begun = True
            self.connection.execute(";".join(statements))
        return self.connection.execute(query, params).fetchall()

    def reset(self) -> None:
        """Empties every table (a fresh cluster)."""
        self._run("TRUNCATE " + ", ".join(TABLES))

    # tiers, replicasets, instances

    def add_tier(self, name: str, bucket_count: int, *, bootstrapped: bool = True) -> None:
        """Adds a tier; ``bucket_count`` 0 is an arbiter tier (never bootstrapped)."""
        self._run(
            "INSERT INTO _pico_tier (name, vshard_bootstrapped, bucket_count, is_default)"
            " VALUES (%s, %s, %s, %s)",
            (name, bootstrapped and bucket_count > 0, bucket_count, name == "default"),
        )

    def bootstrap(self, tier: str) -> None:
        """The tier's buckets are bootstrapped (``_pico_bucket`` answers from now on)."""
        self._run("UPDATE _pico_tier SET vshard_bootstrapped = true WHERE name = %s", (tier,))

    def add_replicaset(
        self,
        name: str,
        tier: str = "default",
        *,
        uuid: str | None = None,
        instances: int = 1,
        instance_uuids: Sequence[str] = (),
        weight: float = 1.0,
    ) -> str:
        """Adds a replicaset with its instances (Online, with pgproto and iproto addresses);
        the first instance is its master. Returns the replicaset's uuid."""
        rs_uuid = uuid or name_uuid(name)
        with self.transaction():
            self._run(
                "DELETE FROM _pico_replicaset WHERE name = %s AND state = 'expelled'", (name,)
            )
            self._run(
                "INSERT INTO _pico_replicaset (name, uuid, current_master_name,"
                " target_master_name, tier, weight) VALUES (%s, %s, %s, %s, %s, %s)",
                (name, rs_uuid, f"{name}_1", f"{name}_1", tier, weight),
            )
            for n in range(1, max(instances, len(instance_uuids)) + 1):
                given = instance_uuids[n - 1] if n <= len(instance_uuids) else None
                self.add_instance(f"{name}_{n}", name, uuid=given)
        return rs_uuid

    def add_instance(
        self, name: str, replicaset: str, *, uuid: str | None = None, state: str = "Online"
    ) -> str:
        """Adds an instance to the replicaset named ``replicaset`` (the next raft id, a pgproto
        and an iproto address); returns its uuid."""
        instance_uuid = uuid or name_uuid(name)
        self._port += 1
        self._run(
            "SELECT _test_add_instance(%s, %s, %s, %s, %s)",
            (name, replicaset, instance_uuid, state, self._port),
        )
        return instance_uuid

    def start_expelling(self, name: str) -> None:
        """The replicaset turns ``to-be-expelled``: it keeps its buckets until they are moved
        away (a rebalance), then :meth:`expel_replicaset` finishes the expel."""
        self._run("UPDATE _pico_replicaset SET state = 'to-be-expelled' WHERE name = %s", (name,))

    def expel_replicaset(self, name: str) -> None:
        """The replicaset turns ``expelled`` and its instances ``["Expelled", n]``; the rows
        stay, as in Picodata (move its buckets away first)."""
        with self.transaction():
            self._run(_EXPEL_INSTANCES + " WHERE replicaset_name = %s", (name,))
            self._run("UPDATE _pico_replicaset SET state = 'expelled' WHERE name = %s", (name,))

    def expel_instance(self, name: str) -> None:
        """The instance turns ``["Expelled", n]`` (its incarnation kept); the row stays."""
        self._run(_EXPEL_INSTANCES + " WHERE name = %s", (name,))

    def switch_master(self, replicaset: str, instance: str) -> None:
        self._run(
            "UPDATE _pico_replicaset SET current_master_name = %s, target_master_name = %s"
            " WHERE name = %s",
            (instance, instance, replicaset),
        )

    def set_state(self, instance: str, state: str, incarnation: int = 2) -> None:
        self._run(
            "UPDATE _pico_instance SET current_state = %s WHERE name = %s",
            (f'["{state}", {incarnation}]', instance),
        )

    def set_raw(self, table: str, column: str, value: Any, where: str, key: Any) -> None:
        """Stores any value, malformed ones included: ``UPDATE table SET column = value WHERE
        where = key``."""
        self._run(f"UPDATE {table} SET {column} = %s WHERE {where} = %s", (value, key))

    def set_address(self, instance: str, address: str, connection_type: str = "pgproto") -> None:
        self._run(
            "UPDATE _pico_peer_address SET address = %s WHERE connection_type = %s AND raft_id ="
            " (SELECT raft_id FROM _pico_instance WHERE name = %s)",
            (address, connection_type, instance),
        )

    def set_weight(self, replicaset: str, weight: float) -> None:
        self._run(
            "UPDATE _pico_replicaset SET weight = %s, weight_origin = 'user' WHERE name = %s",
            (weight, replicaset),
        )

    # buckets

    def set_buckets(self, tier: str, ranges: Sequence[tuple[int, int, str]]) -> None:
        """Makes ``ranges`` ((start, end, replicaset uuid), inclusive) the tier's whole map."""
        with self.transaction():
            self._run("DELETE FROM _test_bucket WHERE tier_name = %s", (tier,))
            if ranges:
                starts, ends, owners = (list(column) for column in zip(*ranges, strict=True))
                self._run(
                    "INSERT INTO _test_bucket (tier_name, bucket_id_start, bucket_id_end,"
                    " current_replicaset_uuid, target_replicaset_uuid) SELECT %s, s, e, o, o"
                    " FROM unnest(%s::int[], %s::int[], %s::text[]) AS u(s, e, o)",
                    (tier, starts, ends, owners),
                )

    def rebalance(self, tier: str) -> None:
        """Spreads the tier's buckets over its replicasets of positive weight, in name order,
        as contiguous ranges sized in proportion to the weights (range ends rounded half to
        even); :meth:`expected` shows the result."""
        self._run("SELECT _test_rebalance(%s)", (tier,))

    def fail_buckets(
        self, tier: str, message: str = REBALANCE_ERROR, *, delay: float | None = None
    ) -> None:
        """``_pico_bucket(tier)`` raises ``message`` until :meth:`heal_buckets`, after sleeping
        ``delay`` seconds if given (a failing poll a test can act on while it is in flight)."""
        self._fault(tier, message=message, delay=delay)

    def delay_buckets(self, tier: str, seconds: float) -> None:
        """``_pico_bucket(tier)`` sleeps ``seconds`` before answering."""
        self._fault(tier, delay=seconds)

    def serve_raw_buckets(self, tier: str, payload: str) -> None:
        """``_pico_bucket(tier)`` returns ``payload`` as it is (e.g. malformed JSON)."""
        self._fault(tier, payload=payload)

    def heal_buckets(self, tier: str) -> None:
        self._run("DELETE FROM _test_bucket_fault WHERE tier_name = %s", (tier,))

    def _fault(
        self,
        tier: str,
        *,
        message: str | None = None,
        delay: float | None = None,
        payload: str | None = None,
    ) -> None:
        self._run(
            "INSERT INTO _test_bucket_fault (tier_name, message, delay, payload)"
            " VALUES (%s, %s, %s, %s) ON CONFLICT (tier_name) DO UPDATE SET"
            " message = excluded.message, delay = excluded.delay, payload = excluded.payload",
            (tier, message, delay, payload),
        )

    # what a driver should conclude

    def expected(self) -> Expected:
        """The committed catalog, as the topology should hold it after a successful poll (one
        query, so it reads one committed state)."""
        document = self._rows(_EXPECTED_QUERY)[0][0]
        tiers = {name: count for name, count in document["tiers"] or []}
        maps: dict[str, list[tuple[int, int, str]]] = {tier: [] for tier in tiers}
        for tier, start, end, owner in document["buckets"] or []:
            maps.setdefault(tier, []).append((start, end, owner))
        return Expected(
            tiers=tiers,
            replicasets={rs: (tier, master) for rs, tier, master in document["replicasets"] or []},
            instances={
                i: (rs, state, address) for i, rs, state, address in document["instances"] or []
            },
            maps=maps,
        )

    def pico_bucket(self, tier: str) -> str:
        """What ``SELECT _pico_bucket(tier)`` returns right now."""
        value: str = self._rows("SELECT _pico_bucket(%s)", (tier,))[0][0]
        return value


def topology_state(topology: Any) -> Expected:
    """The same view of a :class:`shardline.Topology`, for comparing with :meth:`expected`."""
    return Expected(
        tiers=dict(topology.tiers),
        replicasets={
            rs.uuid: (rs.tier, rs.current_master_uuid) for rs in topology.replicasets.values()
        },
        instances={
            i.uuid: (i.replicaset_uuid, i.current_state, i.address)
            for i in topology.instances.values()
        },
        maps={tier: list(ranges) for tier, ranges in topology.bucket_maps.items()},
    )
