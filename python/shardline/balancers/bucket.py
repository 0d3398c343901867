"""`BucketLoadBalancer`: a keyed task goes to the master of the replicaset that owns its bucket."""

from __future__ import annotations

import asyncio
import inspect
import logging
import sys
import uuid
from collections.abc import Callable, Iterable
from operator import attrgetter
from typing import Any, Final, NoReturn

from shardline._core import Instance, Topology
from shardline.balancers.explanation import Candidate, CandidateOrder, ordinal, pooled_record
from shardline.balancers.protocol import SelectLoadBalancer, Tried
from shardline.errors import NoWorkersAvailable
from shardline.pool.context import LoadBalancerContextView

__all__ = ["BucketLoadBalancer"]

logger = logging.getLogger("shardline.balancers.bucket")

_task_key: Final = attrgetter("key")

# Instance uuid text -> UUID: parsing a UUID is Python code (~1 us); a dict hit is ~40 ns.
_UID_CACHE_LIMIT: Final = 1 << 16


def _marked_read_only(task: Any) -> bool:
    """The default ``read_only``: the task's ``read_only`` attribute, false when it has none."""
    return getattr(task, "read_only", False) is True


class BucketLoadBalancer(SelectLoadBalancer):
    """Offers the master of the replicaset that owns a task's bucket, then, for a read-only
    task, that replicaset's other instances.

    ``key(task)`` is the task's sharding key (default: its ``key`` attribute), anything
    :meth:`shardline.Topology.route` accepts: a str, an int, a tuple of parts… It is hashed to
    its bucket in ``tier`` and looked up in ``topology``, and the first candidate is the uid
    (``UUID(instance.uuid)``) of the owning replicaset's master, the pool entry that
    :class:`~shardline.discovery.topology.TopologyDiscovery` makes for that instance.

    A task is read-only when ``read_only(task)`` is true (default: its ``read_only``
    attribute is ``True``). After the master failed or is not pooled, a read-only task is
    offered the replicaset's other members, from ``replicas(replicaset_uuid)`` (pass
    ``TopologyDiscovery.replicas``, O(1); without it the topology's online instances of that
    replicaset are looked up, O(instances), on this fallback path only), in that order. Any
    other task is offered the master only: writes never go to a replica.

    When the bucket has no known route — no replicaset owns it (its tier's map was cleared
    and awaits the next poll) or the owner's master is unknown — the call offers nobody: it
    calls ``on_miss()`` (say, ``PollingSource.trigger``, to ask for an early refresh; an
    awaitable it returns is scheduled, an exception it raises is logged) and raises
    :class:`~shardline.NoWorkersAvailable` saying ``no route for bucket N of tier T`` and why;
    the proxy lets it through. When every candidate was offered and none served, it raises
    ``NoWorkersAvailable`` naming the bucket, the replicaset and its master, chained to the
    last failure. A tier the topology does not know raises ``UnknownTier``; a key it cannot
    hash raises ``UnhashableKey``.

    The balancer holds no per-context state, so it works with any context and concurrent
    calls never interfere. Routing reads the topology for each candidate, so a call made after
    an event was applied routes by it; if the key's master changes mid-call, the new master is
    offered next (a write too), and if its route is lost mid-call the call ends with the
    ``no route`` error.

    Implementation notes:
        The first candidate costs one call into the topology (hash and lookup at once), one
        dict probe turning the master's uuid text into a ``UUID`` (parsed once per instance,
        cached), and no work proportional to the pool or to the topology. The bucket id is
        computed again only on the failure paths, for the messages.
    """

    needs_load = False

    def __init__(
        self,
        topology: Topology,
        tier: str,
        *,
        key: Callable[[Any], Any] = _task_key,
        read_only: Callable[[Any], bool] = _marked_read_only,
        replicas: Callable[[str], Iterable[uuid.UUID]] | None = None,
        on_miss: Callable[[], object] | None = None,
    ) -> None:
        # interned: the topology finds a tier by the identity of its name first
        self._topology = topology
        self._tier = sys.intern(tier)
        self._key = key
        self._read_only = read_only
        self._replicas = replicas if replicas is not None else self._online_replicas
        self._on_miss = on_miss
        self._uids: dict[str, uuid.UUID] = {}
        self._scheduled: set[asyncio.Future[Any]] = set()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(tier={self._tier!r}, key={self._key!r})"

    @property
    def tier(self) -> str:
        return self._tier

    def _uid(self, text: str) -> uuid.UUID:
        uid = self._uids.get(text)
        if uid is None:
            if len(self._uids) >= _UID_CACHE_LIMIT:
                self._uids.clear()
            uid = self._uids[text] = uuid.UUID(text)
        return uid

    def select(
        self, task: Any, *, context: LoadBalancerContextView, tried: Tried
    ) -> uuid.UUID | None:
        """The master of the key's replicaset, then (read-only tasks) its other instances; see
        :mod:`shardline.balancers.protocol`."""
        key = self._key(task)
        master = self._topology.route(self._tier, key)
        if master is None:
            self._no_route(key)
        text = master.uuid
        uid = self._uids.get(text)
        if uid is None:
            uid = self._uid(text)
        if not tried or uid not in tried:  # the first candidate, or a master new since
            return uid
        if self._read_only(task):
            replicaset = self._replicaset_of(key, master)
            for replica in self._replicas(replicaset) if replicaset is not None else ():
                if replica not in tried:
                    return replica
        self._exhausted(key, master, tried)

    def explain_candidates(self, task: Any, *, context: LoadBalancerContextView) -> CandidateOrder:
        """The key's route as :meth:`shardline.Topology.explain` gives it: the master of the
        replicaset owning the key's bucket, then, for a read-only task, the replicaset's other
        instances; for a key without a route, why, and ``on_miss`` is not called (see
        :mod:`shardline.balancers.explanation`). Raises what :meth:`select` raises for a tier
        the topology does not know or a key it cannot hash."""
        tier = self._tier
        route = self._topology.explain(tier, self._key(task))
        master = route.routed
        if master is None:
            why = f"no route for bucket {route.bucket} of tier {tier!r}: {route.detail}"
            notes: tuple[str, ...] = ()
            if self._on_miss is not None:
                notes = (f"a dispatch would call on_miss ({self._on_miss!r}) to ask for a refresh",)
            return CandidateOrder((), why_none=why, notes=notes)
        uid = uuid.UUID(master.uuid)
        candidates = [
            Candidate(
                uid,
                f"master ({route.master_state}) of the owner of bucket {route.bucket}:"
                f" {route.detail} [tier epoch {route.epoch}]",
                pooled_record(context, uid),
            )
        ]
        if not self._read_only(task):
            return CandidateOrder(tuple(candidates), notes=("a write: offered the master only",))
        replicaset = route.replicaset_uuid or master.replicaset_uuid
        offered = {uid}
        for replica in self._replicas(replicaset) if replicaset is not None else ():
            if replica in offered:
                continue
            offered.add(replica)
            candidates.append(
                Candidate(
                    replica,
                    f"{ordinal(len(candidates))} replica of replicaset {replicaset}:"
                    " a read-only task, offered after its master",
                    pooled_record(context, replica),
                )
            )
        return CandidateOrder(tuple(candidates))

    def _replicaset_of(self, key: Any, master: Instance) -> str | None:
        """The replicaset owning the key's bucket now (the master's, if the map was cleared)."""
        topology, tier = self._topology, self._tier
        owner = topology.owner(tier, topology.bucket_id(tier, key))
        return owner if owner is not None else master.replicaset_uuid

    def _online_replicas(self, replicaset_uuid: str) -> list[uuid.UUID]:
        """The default ``replicas``: the topology's online instances of the replicaset, by
        uuid; O(instances)."""
        return [
            self._uid(text)
            for text, instance in sorted(self._topology.instances.items())
            if instance.replicaset_uuid == replicaset_uuid and instance.is_online
        ]

    def _no_route(self, key: Any) -> NoReturn:
        topology, tier = self._topology, self._tier
        bucket = topology.bucket_id(tier, key)
        owner = topology.owner(tier, bucket)
        if owner is None:
            why = "no replicaset owns it in the current bucket map"
        else:
            why = f"the master of its replicaset {owner} is not known"
        self._ask_for_refresh()
        raise NoWorkersAvailable(f"no route for bucket {bucket} of tier {tier!r}: {why}")

    def _ask_for_refresh(self) -> None:
        on_miss = self._on_miss
        if on_miss is None:
            return
        try:
            pending = on_miss()
            if inspect.isawaitable(pending):
                future = asyncio.ensure_future(pending)
                self._scheduled.add(future)
                future.add_done_callback(self._refreshed)
        except Exception:
            logger.exception("on_miss %r failed", on_miss)

    def _refreshed(self, future: asyncio.Future[Any]) -> None:
        self._scheduled.discard(future)
        if not future.cancelled() and future.exception() is not None:
            logger.error("on_miss failed", exc_info=future.exception())

    def _exhausted(self, key: Any, master: Instance, tried: Tried) -> NoReturn:
        topology, tier = self._topology, self._tier
        bucket = topology.bucket_id(tier, key)
        offered = len(tried)
        failure: Exception | None = None
        for error in tried.values():
            failure = error if error is not None else failure
        what = "its master" if offered == 1 else f"{offered} instances (master first)"
        outcome = f"last failure: {failure!r}" if failure is not None else "none was pooled"
        raise NoWorkersAvailable(
            f"no instance took the task for bucket {bucket} of tier {tier!r}: offered {what}"
            f" of replicaset {master.replicaset_uuid} (master {master.uuid}); {outcome}"
        ) from failure
