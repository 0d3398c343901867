"""A Picodata-like cluster on one PostgreSQL: the catalog of ``picodata_catalog.py`` in a schema
of the server, and each instance a TCP forwarder on its own loopback port to that server (its
``_pico_peer_address`` pgproto address), so a test sees which instance a query went through: the
server sees the forwarder's upstream port as ``inet_client_port()``. Stopping a forwarder makes
its instance unreachable; dropping its connections breaks them; stalling it makes the instance
accept connections and never answer (as a SIGSTOPped server would) until it resumes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from shardline import bucket_id
from support.pg_server import PgServer
from support.picodata_catalog import Catalog
from support.picodata_catalog import name_uuid as _uuid

BUCKETS = 300
Side = tuple[asyncio.StreamReader, asyncio.StreamWriter]  # one side of a forwarded connection


class Forwarder:
    """A TCP forwarder from a free loopback port to the PostgreSQL server."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = 0
        self.upstream_ports: set[int] = set()
        self.accepted = 0
        self._server: asyncio.Server | None = None
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._links: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()

    async def start(self) -> None:
        """Listens (again) on its port; a free one the first time."""
        self._server = await asyncio.start_server(self._link, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def stop(self) -> None:
        """Refuses new connections and breaks the open ones."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        self.drop()

    def drop(self) -> None:
        """Breaks every open connection (both directions)."""
        for downstream, upstream in list(self._links):
            downstream.transport.abort()
            upstream.transport.abort()
        self._links.clear()

    def stall(self) -> None:
        """Stops forwarding, both ways, on every connection open or opened from now on: the
        bytes already read wait, the rest stay in the sockets."""
        self._flowing.clear()

    def resume(self) -> None:
        """Forwards again what waited and what comes."""
        self._flowing.set()

    @property
    def open_links(self) -> int:
        return len(self._links)

    async def _link(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        self.upstream_ports.add(up_writer.get_extra_info("sockname")[1])
        link = (writer, up_writer)
        self._links.add(link)
        try:
            await self._carry((reader, writer), (up_reader, up_writer))
        finally:
            self._links.discard(link)
            writer.transport.abort()
            up_writer.transport.abort()

    async def _carry(self, down: Side, up: Side) -> None:
        """Carries one connection's bytes both ways (``down``: the client's side, ``up``: the
        server's) until either side ends; a subclass that reads what passes overrides it."""
        (reader, writer), (up_reader, up_writer) = down, up
        await asyncio.gather(
            _pump(reader, up_writer, self._flowing), _pump(up_reader, writer, self._flowing)
        )


async def _pump(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, flowing: asyncio.Event
) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(65536):
            await flowing.wait()
            writer.write(data)
            await writer.drain()
    writer.transport.abort()


@dataclass
class Cluster:
    """The catalog and a forwarder per instance: replicaset r1 (r1_1 master, r1_2, r1_3) and
    r2 (r2_1 master, r2_2), tier ``default`` of :data:`BUCKETS` buckets split between them."""

    pg: PgServer
    catalog: Catalog
    url: str
    forwarders: dict[str, Forwarder] = field(default_factory=dict)

    def instance_of(self, port: int) -> str:
        """The instance name whose forwarder opened the server-side connection ``port``."""
        (name,) = [n for n, f in self.forwarders.items() if port in f.upstream_ports]
        return name

    def master_of(self, key: int) -> str:
        """The expected master's name, from the catalog's own rows."""
        expected = self.catalog.expected()
        bucket = bucket_id(key, BUCKETS)
        (owner,) = [o for s, e, o in expected.maps["default"] if s <= bucket <= e]
        master = expected.replicasets[owner][1]
        return next(name for name in self.forwarders if _uuid(name) == master)

    def key_of(self, master: str) -> int:
        """A key (0 to 99) whose expected master is the instance ``master``."""
        return next(key for key in range(100) if self.master_of(key) == master)


INSTANCES = ("r1_1", "r1_2", "r1_3", "r2_1", "r2_2")


def cataloged(pg: PgServer) -> Cluster:
    """A :class:`Cluster` with no forwarders yet, over a new schema of ``pg`` whose catalog
    holds the layout and the table ``landed(id bigint, port integer)``; the instances'
    addresses are left to set."""
    dsn = pg.create_schema()
    catalog = Catalog(dsn)
    with catalog.transaction():
        catalog.add_tier("default", BUCKETS)
        catalog.add_replicaset("r1", instances=3)
        catalog.add_replicaset("r2", instances=2)
        catalog.rebalance("default")
    catalog.connection.execute("CREATE TABLE landed (id bigint, port integer)")
    return Cluster(pg, catalog, dsn)


async def start_cluster(pg: PgServer) -> Cluster:
    result = cataloged(pg)
    for name in INSTANCES:
        forwarder = Forwarder(pg.port)
        await forwarder.start()
        result.forwarders[name] = forwarder
        result.catalog.set_address(name, forwarder.address)
    return result


async def stop_cluster(c: Cluster) -> None:
    for forwarder in c.forwarders.values():
        await forwarder.stop()
    c.catalog.close()


@contextlib.asynccontextmanager
async def cluster(pg: PgServer) -> AsyncIterator[Cluster]:
    result = await start_cluster(pg)
    try:
        yield result
    finally:
        await stop_cluster(result)
