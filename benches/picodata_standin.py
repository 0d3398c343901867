"""The stand-in Picodata cluster of ``bench_picodata_client.py``: one real PostgreSQL server
playing six instances (3 replicasets x 2 instances) of one tier.

Issue 11 measures the clients "on one PostgreSQL stand-in": every instance is the same server,
so the database work of a query is the same whichever instance a client picks, and what the
benchmark compares is the clients. The catalog is ``tests/support/picodata_catalog.py``'s
``Catalog`` (tier ``default`` of :data:`BUCKET_COUNT` buckets, spread by ``Catalog.rebalance`` in
three ranges, as right after a bootstrap), in the database :data:`DATABASE`.

Each instance's ``pgproto`` address is the server's port on an address of its own,
``127.0.0.<n>`` (the server listens on all six; Linux routes the whole of 127/8 to loopback,
and a client's source address stays 127.0.0.1, which ``pg_hba.conf`` admits). A client that
dials what the catalog says reaches the one server either way, but ``inet_server_addr()`` then
tells which instance a query went to: :meth:`StandinCluster.expected_address` is where a keyed
query must land, computed from the catalog's own tables and picopyn's ``calculate_bucket_id``
(so that neither client checks itself).

``users(id bigint primary key, name text, landed_on inet)`` is there for keyed writes (a
write records the instance it landed on), and ``_pico_table`` says ``users`` is sharded by
``id`` (murmur3, tier ``default``; ``tests/support/picodata_tables.py``, where the format's sources
are named), so picopyn's ``create_sharding_key_factory`` and shardline's ``key_for`` can read it.

Writes: a table Picodata creates without ``USING`` is a ``memtx`` table, rows kept in memory
(picodata/picodata ``docs/docs/overview/glossary.md``, "Движок хранения": memtx is the default
engine), and every change is still written to the WAL (same file, "WAL", "Персистентность"),
the transaction waiting for that write but not for an ``fsync``: a tier's ``wal_mode``
defaults to ``write`` (``docs/docs/reference/config.md``, ``cluster.tier.<tier>.wal_mode``,
26.2; Tarantool's own default, ``src/box/lua/load_cfg.lua``). The stand-in does the same:
``users`` is a logged table, ``fsync`` is off (``PgServer``) and :data:`DURABILITY` makes each
commit wait for its WAL record's ``write()``. With ``synchronous_commit`` off (``PgServer``'s
default) a commit instead signals the WAL writer process, which costs this server more per
INSERT than the write itself (benches/RESULTS.md, issue 27's throughput section). An
``UNLOGGED`` table would stand for Picodata's ``CREATE UNLOGGED TABLE`` (``docs/docs/reference/
sql/create_table.md``), not its default table.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

# The test suite's helpers, used as they are (a missing PostgreSQL raises PgUnavailable).
sys.path.append(str(Path(__file__).resolve().parent.parent / "tests"))
from support import picodata_tables
from support.pg_server import PASSWORD, SUPERUSER, PgServer
from support.picodata_catalog import Catalog

DATABASE = "pico"
TIER = "default"
BUCKET_COUNT = 3000
REPLICASETS = ("rs1", "rs2", "rs3")
INSTANCES_PER_REPLICASET = 2
MAX_CONNECTIONS = 400  # the three clients and the floor hold their connections all at once

USERS_TABLE = "CREATE TABLE users (id bigint PRIMARY KEY, name text, landed_on inet)"

DURABILITY = {"synchronous_commit": "on"}
"""How a write is made durable, as Picodata's default table does it: ``PgServer`` turns
``fsync`` off, and this makes each commit wait for its WAL record's ``write()`` (no flush to
disk). See the module's "Writes" section."""


class StandinCluster:
    """The server, the catalog, and where each instance is (see the module)."""

    def __init__(self) -> None:
        n_instances = len(REPLICASETS) * INSTANCES_PER_REPLICASET
        self.hosts = [f"127.0.0.{n}" for n in range(1, n_instances + 1)]
        self.server = PgServer(
            settings={
                "listen_addresses": ",".join(self.hosts),
                "max_connections": str(MAX_CONNECTIONS),
                **DURABILITY,
            }
        )
        self.server.start()
        try:
            self._install()
        except BaseException:
            self.server.close()
            raise

    def _install(self) -> None:
        self.catalog = Catalog(self.server.create_database(DATABASE))
        with self.catalog.transaction():
            self.catalog.add_tier(TIER, BUCKET_COUNT)
            for name in REPLICASETS:
                self.catalog.add_replicaset(name, TIER, instances=INSTANCES_PER_REPLICASET)
            self.catalog.rebalance(TIER)
            instances = [
                f"{rs}_{n}" for rs in REPLICASETS for n in range(1, INSTANCES_PER_REPLICASET + 1)
            ]
            for instance, host in zip(instances, self.hosts, strict=True):
                self.catalog.set_address(instance, f"{host}:{self.server.port}")
        with self.server.connect(DATABASE) as connection:
            connection.execute(USERS_TABLE)
            picodata_tables.install(connection)
            picodata_tables.add_sharded(
                connection, "users", ["id"], fields=["id", "name"], tier=TIER
            )
        expected = self.catalog.expected()
        self.maps = expected.maps[TIER]
        self.address_of = {uuid: address for uuid, (_, _, address) in expected.instances.items()}
        self.master_of = {rs: master for rs, (_, master) in expected.replicasets.items()}
        self.master_hosts = {self.address_of[m].rpartition(":")[0] for m in self.master_of.values()}
        assert len(self.maps) == len(REPLICASETS), self.maps
        assert len(self.master_hosts) == len(REPLICASETS), self.master_hosts

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def dsn(self) -> str:
        """The catalog's server as a user passes it to a client (the first instance)."""
        return (
            f"postgresql://{quote(SUPERUSER)}:{quote(PASSWORD)}@{self.hosts[0]}:{self.port}"
            f"/{DATABASE}"
        )

    @property
    def picopyn_dsn(self) -> str:
        """:attr:`dsn` with the startup ``options`` picopyn needs on plain PostgreSQL.

        picopyn 3.2.0 sends ``options=pico_stmt_invalidation=true[,pico_query_metadata=true]``
        at every connect (``picopyn.asynchronous.connection._with_picodata_startup_options``),
        appended after a comma to the DSN's own ``options``. PostgreSQL reads ``options`` as a
        server command line and refuses that one ("invalid command-line argument for server
        process"). Workaround: a DSN ``options`` of ``-c picopyn.startup=``, so the whole
        string becomes one setting of a custom (dotted, hence accepted) parameter whose value
        is picopyn's options."""
        return self.dsn + "?options=" + quote("-c picopyn.startup=")

    def expected_host(self, key: int) -> str:
        """The address (host part) of the master owning ``key``'s bucket, from the catalog."""
        from picopyn.bucket import calculate_bucket_id

        bucket = calculate_bucket_id([(1, OID_INT8)], (key,), BUCKET_COUNT)
        assert bucket is not None
        for start, end, owner in self.maps:
            if start <= bucket <= end:
                return self.address_of[self.master_of[owner]].rpartition(":")[0]
        raise AssertionError(f"bucket {bucket} of key {key} is in no range: {self.maps}")

    def server_pids(self) -> list[int]:
        """The server's processes: the postmaster and its children (a backend per
        connection, the background workers)."""
        process = self.server.process
        assert process is not None, "the server is not running"
        pid = process.pid
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            children = []
        return [pid, *map(int, children)]

    def server_cpu_ns(self) -> int:
        """The CPU time, in ns, that the server's processes (:meth:`server_pids`, read now) have
        run so far (``/proc/<pid>/schedstat``, the scheduler's own count; a process that ended
        meanwhile is left out)."""
        total = 0
        for pid in self.server_pids():
            try:
                total += int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
        return total

    def server_connect_kwargs(self) -> dict[str, Any]:
        """asyncpg.connect keyword arguments for a raw connection to the server (the floor)."""
        return {
            "host": self.hosts[0],
            "port": self.port,
            "user": SUPERUSER,
            "password": PASSWORD,
            "database": DATABASE,
        }

    def close(self) -> None:
        self.catalog.close()
        self.server.close()


OID_INT8 = 20  # picopyn's type OID of an integer distribution-key part (picopyn.bucket)
