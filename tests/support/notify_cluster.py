"""A cluster that pushes Picodata's topology notifications, stood in for by PostgreSQL
``LISTEN``/``NOTIFY``.

The design (see ``shardline/topology/sources/pg_notify.py``): every change is one transaction
that takes the next raft position under a row lock, stores the snapshot burst of the state after
it (the ADR's replace documents, tests/support/notify_documents.py), and sends the change's document
with ``pg_notify``. The source reads the tiers, ``LISTEN``\\ s, then reads the burst with
``SELECT shardline_topology_snapshot(channel)`` (one row per document, in the ADR's order).

Here the "cluster state" is a reference :class:`shardline.Topology` that the publisher applies
each event to in raft order, so the snapshot at a position is exactly what in-order application
of every event up to it gives — the state a source must converge to. Each test (or Hypothesis
example) uses its own channel, which keys its own rows, so one database serves a whole module.

Schema:

- ``shardline_topology_state(channel, term, index, documents)``: the snapshot burst of each
  channel's cluster and its raft position.
- ``shardline_topology_tier(channel, name, bucket_count)``: each channel's tiers, the columns of
  Picodata's ``_pico_tier`` that the source reads; ``shardline_topology_tiers(channel)`` returns
  them.
- ``shardline_topology_snapshot(channel)``: the burst, one row per document (``STABLE``: one
  statement snapshot).
- ``shardline_topology_snapshot_after(channel, lock)``: waits for the advisory lock ``lock``
  (which a test holds: :meth:`NotifyCluster.holding`), *then* reads — each statement of a
  ``VOLATILE`` plpgsql function sees what committed before it began — so changes committed
  while it waits are in the snapshot *and* queued to the listener.
- ``shardline_topology_snapshot_then(channel, lock)``: reads, *then* waits for the lock:
  changes committed while it waits are only queued.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import psycopg

from shardline import Topology
from shardline.topology.sources.notification import NotificationSource
from support.notify_documents import Event, event_document, snapshot_documents
from support.waiting import until

SCHEMA = """
CREATE TABLE IF NOT EXISTS shardline_topology_state (
    channel text PRIMARY KEY,
    term bigint NOT NULL,
    index bigint NOT NULL,
    documents text[] NOT NULL
);
CREATE TABLE IF NOT EXISTS shardline_topology_tier (
    channel text NOT NULL,
    name text NOT NULL,
    bucket_count bigint NOT NULL,
    PRIMARY KEY (channel, name)
);
CREATE OR REPLACE FUNCTION shardline_topology_tiers(wanted text)
RETURNS TABLE (name text, bucket_count bigint) LANGUAGE sql STABLE AS $$
    SELECT name, bucket_count FROM shardline_topology_tier WHERE channel = wanted ORDER BY name
$$;
CREATE OR REPLACE FUNCTION shardline_topology_snapshot(wanted text) RETURNS SETOF text
LANGUAGE sql STABLE AS $$
    SELECT d FROM shardline_topology_state, unnest(documents) WITH ORDINALITY AS u(d, n)
    WHERE channel = wanted ORDER BY n
$$;
CREATE OR REPLACE FUNCTION shardline_topology_snapshot_after(wanted text, lock bigint)
RETURNS SETOF text LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(lock);
    RETURN QUERY SELECT d FROM shardline_topology_state,
        unnest(documents) WITH ORDINALITY AS u(d, n) WHERE channel = wanted ORDER BY n;
END
$$;
CREATE OR REPLACE FUNCTION shardline_topology_snapshot_then(wanted text, lock bigint)
RETURNS SETOF text LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    found text[];
BEGIN
    SELECT documents INTO found FROM shardline_topology_state WHERE channel = wanted;
    PERFORM pg_advisory_xact_lock_shared(lock);
    RETURN QUERY SELECT d FROM unnest(found) WITH ORDINALITY AS u(d, n) ORDER BY n;
END
$$;
"""

_channels = itertools.count(1)


def fresh_channel() -> str:
    return f"topology_{os.getpid()}_{next(_channels)}"


def install(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(SCHEMA)


class NotifyCluster:
    """The publishing side of one channel; each method is one or more committed transactions."""

    def __init__(
        self,
        dsn: str,
        *,
        tiers: dict[str, int] | None = None,
        channel: str | None = None,
        term: int = 1,
    ) -> None:
        self.dsn = dsn
        self.channel = channel or fresh_channel()
        self.lock = next(_channels)
        self._held = False
        self.connection = psycopg.connect(dsn, autocommit=True)
        self.reference = Topology()
        self.tiers = dict(tiers or {"default": 3000})
        self.reference.apply_tiers(self.tiers)
        self.term, self.index = term, 0
        with self.connection.transaction():
            self.connection.execute(
                "INSERT INTO shardline_topology_state (channel, term, index, documents)"
                " VALUES (%s, %s, %s, %s)",
                (self.channel, self.term, self.index, self.snapshot()),
            )
            for name, count in self.tiers.items():
                self.connection.execute(
                    "INSERT INTO shardline_topology_tier VALUES (%s, %s, %s)",
                    (self.channel, name, count),
                )

    def close(self) -> None:
        self.connection.close()

    def __enter__(self) -> NotifyCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # what a source connects with

    @property
    def snapshot_query(self) -> str:
        return f"SELECT shardline_topology_snapshot('{self.channel}')"

    @property
    def tiers_query(self) -> str:
        return f"SELECT name, bucket_count FROM shardline_topology_tiers('{self.channel}')"

    def source(self, **options: Any) -> NotificationSource:
        """A source on this channel, with short retries and no resync rate limit."""
        settings: dict[str, Any] = {
            "channel": self.channel,
            "snapshot_query": self.snapshot_query,
            "tiers_query": self.tiers_query,
            "timeout": 5.0,
            "retry": 0.02,
            "max_retry": 0.2,
            "min_resync_interval": 0.0,
            **options,
        }
        return NotificationSource(self.dsn, **settings)

    def snapshot(self) -> list[str]:
        """The snapshot burst of the reference at the current position."""
        return snapshot_documents(self.reference, self.term, self.index)

    @contextmanager
    def holding(self) -> Iterator[None]:
        """Holds the advisory lock the ``_after`` / ``_then`` snapshot functions wait for,
        until :meth:`release` or the end of the block."""
        self.connection.execute("SELECT pg_advisory_lock(%s)", (self.lock,))
        self._held = True
        try:
            yield
        finally:
            self.release()

    def release(self) -> None:
        if self._held:
            self._held = False
            self.connection.execute("SELECT pg_advisory_unlock(%s)", (self.lock,))

    def waiting_sessions(self, application_name: str) -> int:
        """How many sessions named ``application_name`` wait for :meth:`holding`'s lock."""
        row = self.connection.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
            " WHERE l.locktype = 'advisory' AND NOT l.granted AND l.objid = %s"
            " AND a.application_name = %s",
            (self.lock, application_name),
        ).fetchone()
        return int(row[0]) if row else 0

    @property
    def position(self) -> tuple[int, int]:
        return (self.term, self.index)

    # changes

    def publish(self, *events: Event, notify: bool = True, same_entry: bool = False) -> list[str]:
        """Commits ``events`` in one transaction, each at the next raft position (all at one
        position with ``same_entry``), and notifies each unless ``notify`` is False (the
        documents are returned, e.g. to deliver them later, out of order)."""
        documents = []
        with self.connection.transaction():
            # the row lock orders concurrent publishers: positions increase in commit order
            row = self.connection.execute(
                "SELECT term, index FROM shardline_topology_state WHERE channel = %s FOR UPDATE",
                (self.channel,),
            ).fetchone()
            assert row == (self.term, self.index)
            if same_entry:
                self.index += 1
            for event in events:
                if not same_entry:
                    self.index += 1
                self.reference.apply(event)
                document = event_document(event, self.term, self.index)
                documents.append(document)
                if notify:
                    self.connection.execute("SELECT pg_notify(%s, %s)", (self.channel, document))
            self._store()
        return documents

    def new_term(self) -> None:
        """A leader change: later entries carry the next term (indices keep increasing)."""
        with self.connection.transaction():
            self.term += 1
            self._store()

    def notify(self, *documents: str) -> None:
        """Sends each document as it is, each in its own transaction (PostgreSQL drops an
        identical payload repeated within one), without touching the state."""
        for document in documents:
            self.connection.execute("SELECT pg_notify(%s, %s)", (self.channel, document))

    def _store(self) -> None:
        self.connection.execute(
            "UPDATE shardline_topology_state SET term = %s, index = %s, documents = %s"
            " WHERE channel = %s",
            (self.term, self.index, self.snapshot(), self.channel),
        )


def view(topology: Topology) -> tuple[Any, ...]:
    """What a caller can observe of a topology, epochs left out."""
    return (
        topology.tiers,
        {k: (r.tier, r.current_master_uuid) for k, r in topology.replicasets.items()},
        {k: (i.replicaset_uuid, i.current_state, i.address) for k, i in topology.instances.items()},
        {tier: ranges for tier, ranges in topology.bucket_maps.items() if ranges},
    )


def masters(topology: Topology, tier: str = "default") -> list[str | None]:
    """``find_bucket_master`` of every bucket of ``tier``, as instance uuids."""
    found = []
    for bucket in range(1, topology.tiers[tier] + 1):
        master = topology.find_bucket_master(tier, bucket)
        found.append(None if master is None else master.uuid)
    return found


def expected_masters(count: int, ranges: Iterable[tuple[int, int, str | None]]) -> list[str | None]:
    """Bucket -> master uuid for ``ranges`` of (start, end, master uuid), None elsewhere."""
    found: list[str | None] = [None] * count
    for start, end, master in ranges:
        found[start - 1 : end] = [master] * (end - start + 1)
    return found


async def caught_up(source: NotificationSource, position: tuple[int, int]) -> None:
    """Waits until the source has handed out (under ``run``: applied) ``position``."""

    def reached() -> bool:
        at = source.position
        return at is not None and (at.term, at.index) >= position

    await until(reached, what=f"position {position} (at {source.position})")


@asynccontextmanager
async def running(source: NotificationSource, topology: Topology) -> AsyncIterator[None]:
    """Runs ``source`` into ``topology`` for the block; closes it and checks ``run`` ended."""
    task = asyncio.create_task(source.run(topology))
    try:
        yield
    finally:
        await source.aclose()
        await asyncio.wait_for(task, 5)


def deliver_in_order(
    cluster: NotifyCluster, documents: Sequence[str], order: Sequence[int]
) -> None:
    cluster.notify(*(documents[i] for i in order))
