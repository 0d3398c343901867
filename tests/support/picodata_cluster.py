"""A stand-in Picodata cluster on three real PostgreSQL servers, for tests and benchmarks of
routed SQL.

Layout (one instance per server, each its own port and data directory; every server holds a
database named :data:`DATABASE`, as every Picodata instance serves the same database):

========  ==========  ========  ==============================================
instance  replicaset  role      its server also holds
========  ==========  ========  ==============================================
``m1``    ``rs1``     master    -
``r1``    ``rs1``     replica   -
``m2``    ``rs2``     master    the catalog (``tests/support/picodata_catalog.py``)
========  ==========  ========  ==============================================

Tier ``default`` has :data:`BUCKET_COUNT` buckets, spread by :meth:`PicodataCluster.reset` as
``Catalog.rebalance`` does (equal weights: ``rs1`` 1-1500, ``rs2`` 1501-3000). Every instance's
``pgproto`` address in ``_pico_peer_address`` is its own server's ``127.0.0.1:port``, so a client
that dials what the catalog says reaches that server. The catalog sits with ``m2`` so that
killing ``rs1``'s master (the fail-over case) leaves the catalog up.

Every instance database has ``users(id bigint primary key, name text)``, and ``_pico_table``
(a global table in Picodata: on every instance) says ``users`` is sharded by ``id`` (murmur3,
tier ``default``). The servers do not replicate:
a row lands only on the server it was written to, which is how :meth:`PicodataCluster.where`
shows where a routed write went; ``SELECT inet_server_port()`` shows which server answered a
read (:meth:`PicodataCluster.instance_at`).

Clients log in as :data:`USER` / :data:`PASSWORD` (SCRAM over TCP): :attr:`dsn` is the
catalog's server, as a user would pass it to ``shardline.picodata.connect``;
:attr:`wrong_password_dsn` and :attr:`tls_required_dsn` (``sslmode=require`` against servers
that run with ``ssl=off``) fail to connect. :meth:`kill` stops an instance's server (a fast
shutdown: its sessions are cut, new connections refused) and :meth:`restart` starts it again on
the same port with the same data.

Use the module-scoped fixture ``picodata_cluster`` (tests/conftest.py) or ``with
PicodataCluster() as cluster``.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import psycopg

from shardline._core import bucket_id
from support import picodata_tables
from support.pg_server import PgServer
from support.picodata_catalog import Catalog, name_uuid

DATABASE = "pico"
USER = "app"
PASSWORD = "secret"
TIER = "default"
BUCKET_COUNT = 3000

REPLICASETS = {"rs1": ("m1", "r1"), "rs2": ("m2",)}
"""Replicaset → its instances, master first."""

CATALOG_INSTANCE = "m2"

USERS_TABLE = "CREATE TABLE users (id bigint PRIMARY KEY, name text)"


@dataclass
class ClusterInstance:
    """One stand-in instance: a name in the catalog, a replicaset, and its own server."""

    name: str
    replicaset: str
    server: PgServer

    @property
    def uuid(self) -> str:
        return name_uuid(self.name)

    @property
    def address(self) -> str:
        """Its pgproto address, as ``_pico_peer_address`` holds it."""
        return f"127.0.0.1:{self.server.port}"

    @property
    def running(self) -> bool:
        return self.server.process is not None and self.server.process.poll() is None

    def connect(self) -> psycopg.Connection[Any]:
        """A superuser connection to the instance's database (autocommit); close it."""
        return psycopg.connect(self.server.dsn_for(DATABASE), autocommit=True)


class PicodataCluster:
    """Three PostgreSQL servers standing in for the instances ``m1``, ``r1`` (``rs1``) and
    ``m2`` (``rs2``), the catalog served by ``m2``'s; see the module's docstring."""

    def __init__(self) -> None:
        self.instances: dict[str, ClusterInstance] = {}
        self._catalog: Catalog | None = None
        try:
            for replicaset, names in REPLICASETS.items():
                for name in names:
                    self.instances[name] = ClusterInstance(name, replicaset, PgServer())
            # initdb and the first start take a second or more each: start them side by side
            with ThreadPoolExecutor(len(self.instances)) as pool:
                for started in [pool.submit(self._prepare, i) for i in self.instances.values()]:
                    started.result()
            catalog_server = self.instances[CATALOG_INSTANCE].server
            self._catalog = Catalog(catalog_server.dsn_for(DATABASE))
            with self.instances[CATALOG_INSTANCE].connect() as connection:
                connection.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {USER}")
            self.reset()
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _prepare(instance: ClusterInstance) -> None:
        server = instance.server
        server.start()
        with server.connect() as connection:
            connection.execute(f"CREATE ROLE {USER} LOGIN PASSWORD '{PASSWORD}'")
            connection.execute(f"CREATE DATABASE {DATABASE} OWNER {USER}")
        with instance.connect() as connection:
            connection.execute(USERS_TABLE)
            connection.execute(f"ALTER TABLE users OWNER TO {USER}")
            # a global system table: every instance has it (a client may read it anywhere)
            picodata_tables.install(connection)
            picodata_tables.add_sharded(connection, "users", ["id"], fields=["id", "name"])
            connection.execute(f"GRANT SELECT ON _pico_table TO {USER}")

    # where to connect

    @property
    def catalog_instance(self) -> ClusterInstance:
        return self.instances[CATALOG_INSTANCE]

    def dsn_of(self, instance: str, *, password: str = PASSWORD, query: str = "") -> str:
        """The application user's URI for ``instance``'s server."""
        port = self.instances[instance].server.port
        return f"postgresql://{USER}:{password}@127.0.0.1:{port}/{DATABASE}" + (
            f"?{query}" if query else ""
        )

    @property
    def dsn(self) -> str:
        """The catalog's server, as a user passes it to ``shardline.picodata.connect``."""
        return self.dsn_of(CATALOG_INSTANCE)

    @property
    def wrong_password_dsn(self) -> str:
        return self.dsn_of(CATALOG_INSTANCE, password="not-" + PASSWORD)

    @property
    def tls_required_dsn(self) -> str:
        """``sslmode=require`` against a server with ``ssl=off``: the TLS handshake is refused."""
        return self.dsn_of(CATALOG_INSTANCE, query="sslmode=require")

    def instance_at(self, port: int) -> str:
        """The instance whose server listens on ``port`` (``SELECT inet_server_port()``)."""
        for name, instance in self.instances.items():
            if instance.server.port == port:
                return name
        raise LookupError(f"no instance listens on port {port}")

    # where the rows are

    def where(self, user_id: int) -> list[str]:
        """The instances whose server holds ``users`` row ``user_id``, asked directly (a server
        that is down is left out)."""
        found = []
        for name, instance in self.instances.items():
            if not instance.running:
                continue
            with instance.connect() as connection:
                row = connection.execute("SELECT 1 FROM users WHERE id = %s", (user_id,))
                if row.fetchone() is not None:
                    found.append(name)
        return found

    def users(self, instance: str) -> list[tuple[int, str | None]]:
        """Every ``users`` row on ``instance``'s server, by id."""
        with self.instances[instance].connect() as connection:
            rows = connection.execute("SELECT id, name FROM users ORDER BY id").fetchall()
        return [(int(user_id), name) for user_id, name in rows]

    def bucket_of(self, key: Any) -> int:
        """The bucket Picodata's scheme gives ``key`` in tier ``default``."""
        return bucket_id(key, BUCKET_COUNT)

    # changing the cluster

    def kill(self, instance: str) -> None:
        """Stops the instance's server: its sessions are cut and connections refused."""
        if instance == CATALOG_INSTANCE:
            self._drop_catalog_connection()
        self.instances[instance].server.stop()

    def restart(self, instance: str) -> None:
        """Starts a killed (or running) instance's server again, same data; if its port was
        taken meanwhile it moves, and the catalog's address follows (once the catalog's
        server is up)."""
        self.kill(instance)
        member = self.instances[instance]
        member.server.start()
        if self.catalog_instance.running:
            self.catalog.set_address(instance, member.address)

    def _drop_catalog_connection(self) -> None:
        if self._catalog is not None:
            with contextlib.suppress(psycopg.Error):
                self._catalog.connection.close()

    @property
    def catalog(self) -> Catalog:
        """The catalog (``tests/support/picodata_catalog.py``), its connection opened again after
        its server restarted; raises ``RuntimeError`` while that server is down."""
        if self._catalog is None:
            raise RuntimeError("the cluster is closed")
        if not self.catalog_instance.running:
            raise RuntimeError(f"the catalog's server ({CATALOG_INSTANCE}) is down")
        if self._catalog.connection.closed:
            self._catalog.connection = psycopg.connect(
                self._catalog.dsn, autocommit=True, cursor_factory=psycopg.ClientCursor
            )
        return self._catalog

    def reset(self) -> None:
        """Back to the initial state: every server up, ``users`` empty everywhere, the catalog
        as described in the module's docstring (buckets spread by weight)."""
        for instance in self.instances.values():
            if not instance.running:
                instance.server.start()
            with instance.connect() as connection:
                connection.execute("TRUNCATE users")
        catalog = self.catalog
        with catalog.transaction():
            catalog.reset()
            catalog.add_tier(TIER, BUCKET_COUNT)
            for replicaset, names in REPLICASETS.items():
                catalog.add_replicaset(replicaset, TIER, instances=0)
                for name in names:
                    catalog.add_instance(name, replicaset)
                    catalog.set_address(name, self.instances[name].address)
                catalog.switch_master(replicaset, names[0])
            catalog.rebalance(TIER)

    def close(self) -> None:
        if self._catalog is not None:
            with contextlib.suppress(psycopg.Error):
                self._catalog.close()
            self._catalog = None
        for instance in self.instances.values():
            instance.server.close()

    def __enter__(self) -> PicodataCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
