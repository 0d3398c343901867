"""What the Picodata client reports about itself: :class:`ClientStats` (``db.stats()``),
:class:`PoolStats` (one instance's pool) and :class:`Explanation` (``db.explain(key)``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shardline._core import RouteExplanation
from shardline._histogram import HistogramSnapshot
from shardline.pool.health import WorkerHealth

__all__ = ["ClientStats", "Explanation", "PoolStats"]


@dataclass(frozen=True, slots=True)
class PoolStats:
    """One instance's connection pool.

    ``open`` counts the connections open or being opened, ``idle`` those waiting in the pool,
    ``in_use`` those lent to a query; ``size`` is the bound on ``open``. ``waits`` counts the
    acquisitions that found every connection busy and had to wait, ``timeouts`` those of them
    that gave up after ``acquire_timeout``; ``connects`` and ``connect_failures`` count the
    connections opened and the attempts that failed; ``discarded`` the connections closed
    because they broke (or were left mid-operation or in a transaction). ``down`` is True
    while the instance is in its reconnection backoff after a failed connect. ``queries``
    counts the connections handed out, one per query run on the instance (whether it then
    succeeded or not): a client's keyed queries are seen here landing on the master they were
    routed to. ``health`` is the instance's health as the client's registry sees it (its
    ``state`` "ejected" or "probing" while reads skip it; see
    :class:`~shardline.pool.health.WorkerHealth`), None outside a client.
    """

    uuid: str
    address: str
    size: int
    open: int
    idle: int
    in_use: int
    waits: int
    timeouts: int
    connects: int
    connect_failures: int
    discarded: int
    down: bool
    queries: int
    health: WorkerHealth | None = None


@dataclass(frozen=True, slots=True)
class ClientStats:
    """A snapshot of the client's counters.

    ``routed`` counts the queries sent, by kind: ``"keyed"`` (``key=`` to the master),
    ``"read-only"`` (``key=`` with ``read_only=True``) and ``"unkeyed"`` (no key: any online
    instance). ``misses`` counts the keys that found no route at first, by reason: the words of
    :attr:`shardline.RouteExplanation.reason` (``"map-cleared"``, ``"no-range"``,
    ``"replicaset-unknown"``, ``"master-unknown"``) and the client's own two,
    ``"master-not-online"`` and ``"no-address"`` (see :class:`Explanation`); ``fallbacks`` the
    keyed queries sent to another instance than the bucket's master after the wait for a
    poll, by the same reasons (a read sent to the master because its replicas are unavailable
    is not a fallback), and under ``"other-tier"`` the queries sent to another tier because
    no instance of their own could be reached. ``retries``
    counts the queries retried after a refresh because the first instance could not be
    reached, ``unavailable`` those that raised
    :class:`~shardline.errors.InstanceUnavailable`. ``pools`` are the instances' pools by
    uuid; ``polls``, ``poll_failures`` (by reason), ``last_poll`` (wall-clock time of the
    last complete poll) and ``last_poll_failure`` (what the latest failure was, ``None``
    before any) come from the topology source, as does ``poll_durations``: the time each poll
    took to read, by bucket (see :attr:`~shardline.topology.sources.SourceState.read_durations`);
    ``epochs`` is each tier's map epoch. ``deadlines`` counts the queries that passed their
    deadline (raised :class:`~shardline.errors.DeadlineExceeded`); ``ejections`` and
    ``readmissions`` the instances ejected for reads by their health and re-admitted after a
    probe query succeeded, ``ejected`` those ejected now (or waiting for their probe).
    ``from_metadata`` counts the keyed queries whose key came from their statement's query
    metadata (no ``key=``); ``reprepared`` the queries whose statement the server called stale
    (SQLSTATE 42999: nothing ran) and that were prepared and run once more; ``forward_repaired``
    the routed queries an instance refused under ``forward=off`` (not its bucket: nothing ran)
    and that were sent once more to the owner after a poll of the catalog (a query sent again
    counts again in ``routed``).
    """

    routed: Mapping[str, int]
    misses: Mapping[str, int]
    fallbacks: Mapping[str, int]
    retries: int
    unavailable: int
    pools: Mapping[str, PoolStats]
    polls: int
    poll_failures: Mapping[str, int]
    last_poll: float | None
    epochs: Mapping[str, int]
    last_poll_failure: str | None
    poll_durations: HistogramSnapshot
    deadlines: int
    ejections: int
    readmissions: int
    ejected: int
    from_metadata: int = 0
    reprepared: int = 0
    forward_repaired: int = 0


@dataclass(frozen=True, slots=True)
class Explanation:
    """Where a key would be routed now, and why (``db.explain(key)``); ``str()`` gives a few
    lines for people.

    ``bucket`` is the key's bucket id in ``tier``; ``range`` the inclusive ``(start, end)``
    range of the bucket map holding it (``None`` if no range does); ``replicaset`` and
    ``replicaset_name`` the range's owner; ``master`` and ``master_name`` the owner's current
    master (names when the catalog gave them); ``address`` and ``state`` the master's pgproto
    address and state. ``epoch`` is the tier's map epoch now; ``range_epoch``,
    ``range_set_at`` (wall-clock, ``time.time()``) and ``range_set_by`` (``"event"``,
    ``"snapshot"`` or ``"poll"``) say when and how the range was last set (see
    :class:`shardline.BucketRange`). ``routable`` says whether a query with this key goes to
    that master now; if not, ``reason`` says why, with the words :class:`ClientStats` counts
    misses by: :attr:`shardline.RouteExplanation.reason`'s when the topology has no master for
    the bucket, else ``"master-not-online"`` or ``"no-address"``. ``detail`` is the
    topology's sentence naming the range, the owner and the master (or the cause and time of
    the clear), and ``route`` the topology's whole :class:`shardline.RouteExplanation`.
    ``master_health`` is the master's health in the client's registry (None when the client
    has no pool for it); ``ejected`` the uuids of the replicaset's instances that reads skip
    now for their health (a write still goes to its master).
    """

    tier: str
    bucket: int
    range: tuple[int, int] | None
    replicaset: str | None
    replicaset_name: str | None
    master: str | None
    master_name: str | None
    address: str | None
    state: str | None
    epoch: int
    range_epoch: int | None
    range_set_at: float | None
    range_set_by: str | None
    routable: bool
    reason: str | None
    master_health: WorkerHealth | None
    ejected: tuple[str, ...]
    detail: str = ""
    route: RouteExplanation | None = None

    def __str__(self) -> str:
        outcome = "routable" if self.routable else f"not routable ({self.reason})"
        lines = [
            f"tier {self.tier!r}, bucket {self.bucket}: {outcome}",
            f"  {self.detail}" if self.detail else f"  range {self.range}",
        ]
        if self.master_health is not None:
            health = self.master_health
            lines.append(
                f"  master health: {health.state}, success rate {health.success_rate:.3f},"
                f" {health.consecutive_failures} failure(s) in a row"
            )
        if self.ejected:
            lines.append(f"  skipped by reads for their health: {', '.join(self.ejected)}")
        lines.append(f"  tier map epoch {self.epoch}")
        return "\n".join(lines)
