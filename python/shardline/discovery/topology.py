"""`TopologyDiscovery`: a cluster's online instances as discovery events, for `WorkerProxy`.

Every instance the topology knows that is ``Online`` and has an address is one worker record;
the same :class:`~shardline.WorkerProxy` that dispatches to worker processes then dispatches
to cluster nodes, and a :class:`~shardline.balancers.bucket.BucketLoadBalancer` names them.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import uuid
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterable, Callable, Mapping
from types import MappingProxyType
from typing import Any, Final

from shardline._core import Instance, Replicaset, Topology
from shardline._tasks import cancel_and_wait
from shardline.checks import check_seconds
from shardline.discovery.subscription import RecordFeed, Subscription
from shardline.errors import InvalidEvent, UnknownTier
from shardline.topology.sources.changes import apply_change
from shardline.topology.sources.empty_maps import EMPTY_MAP_WARNING_AFTER
from shardline.topology.sources.source import TopologySource
from shardline.workers import DiscoveryEvent, WorkerMetadata

__all__ = ["TopologyDiscovery", "instance_record"]

logger = logging.getLogger("shardline.discovery.topology")

DEFAULT_CHECK_INTERVAL: Final = 0.05
"""Seconds between two checks of the followed topology's ``membership_version`` (a read of one
counter: a check that finds it unmoved costs nothing more)."""

TopologyApply = Callable[[Topology, Any], object]
"""How one item of a source is applied to the topology (``apply_change`` by default)."""

_NO_REPLICAS: tuple[uuid.UUID, ...] = ()


class _Default:
    """The type of :data:`_DEFAULT`: "this argument was not given"."""


_DEFAULT: Final = _Default()


def instance_record(instance: Instance, replicaset: Replicaset | None) -> WorkerMetadata | None:
    """The worker record of ``instance``, or ``None`` when it is not a pool member.

    An instance is a member while its ``current_state`` is ``"Online"`` and it has an address.
    Its record is ``WorkerMetadata(uid=UUID(instance.uuid), address=instance.address, pid=0,
    version="", tags=frozenset(), extra={"replicaset_uuid": ..., "tier": ...})``: the topology
    knows neither the process id nor the version of a cluster node, so those are ``0`` and
    ``""``; ``tier`` is its replicaset's tier (``None`` while that replicaset is unknown). The
    replicaset's master is deliberately not part of the record: a master switch changes no
    record, so it costs the pool no refresh and no reconnect (routing to the master is the
    balancer's business, read from the topology on every task).
    """
    address = instance.address
    if not address or not instance.is_online:
        return None
    return WorkerMetadata(
        uid=uuid.UUID(instance.uuid),
        address=address,
        pid=0,
        version="",
        extra=MappingProxyType(
            {
                "replicaset_uuid": instance.replicaset_uuid,
                "tier": None if replicaset is None else replicaset.tier,
            }
        ),
    )


class TopologyDiscovery(Subscription):
    """The online instances of a :class:`~shardline.Topology` as a stream of discovery events.

    ``TopologyDiscovery(topology)`` follows a topology that something else keeps current: it
    reads the topology's instances at once, then checks its ``membership_version`` every
    ``interval`` seconds (0.05 s by default; ``None``: never) and re-reads them when it moved,
    and re-reads them whenever :meth:`refresh` is called. Every change of an instance or a
    replicaset moves that counter, so none is missed, and a check that finds it unmoved costs
    no re-read; a bucket map changing alone costs none either.

    ``TopologyDiscovery(source, topology=...)`` follows a *source* and applies what it hands
    out to ``topology`` (a new empty one when not given; see :attr:`topology`). This stream is
    then the source's one consumer: do not also run or iterate the source elsewhere.

    - A :class:`~shardline.topology.sources.TopologySource` (``PollingSource``,
      ``NotificationSource``) is run as it runs itself, ``source.run(topology)``, so its own
      rules (a snapshot clearing the topology first, rejections counted in its ``state`` and
      answered with a resync) hold. The topology's ``membership_version`` is checked every
      ``interval`` seconds (default 0.05 s), and the instances are re-read when it moved (a
      bucket map changing alone costs no re-read). ``warn_empty_after`` is passed to
      ``run``: a tier's map left empty that long is warned about (default 30 s, ``None``: never;
      ``ValueError``, as ``run`` raises it, for anything but a positive, finite number of
      seconds, raised here). It is refused for any other origin, which has no ``run``.
    - Any other async iterable of topology changes (``InstanceEvent``, ``ReplicasetEvent``,
      ``BucketEvent``, ``BucketSnapshot``, ``TopologySnapshot``) — or a ``TopologySource``
      when ``apply`` is given — is iterated by this stream, which applies each item with
      ``apply(topology, item)`` (default :func:`~shardline.topology.sources.apply_change`)
      and re-reads the instances after every burst of items. An item the topology refuses
      (``InvalidEvent``, ``UnknownTier``, or any other exception from applying it) is logged,
      counted in ``skipped`` under ``"rejected"`` and skipped, and the source's ``resync()`` is
      called if it has one; it never ends the stream. ``interval`` adds periodic checks of
      ``membership_version`` as above (default: none), for changes that something else makes
      to the topology.

    When the source ends (or ``run`` returns, the source being closed), the stream ends after a
    last re-read; when it raises, the stream raises the same error. ``aclose()`` stops running
    or iterating the source but does not close it.

    Each re-read goes through a :class:`~shardline.discovery.subscription.RecordFeed`, so the
    events follow the discovery contract: an instance becoming a member (``Online`` with an
    address, see :func:`instance_record`) is ``worker-added``; a member whose record changed
    (address, replicaset, tier) is ``worker-updated``; a member that is no longer ``Online``,
    lost its address or was deleted is ``worker-dropped``; nothing else produces an event, so
    an unchanged re-read yields nothing. ``filter(metadata)`` restricts the members, for
    instance to one tier (``lambda m: m.extra["tier"] == "default"``).

    Usable as ``WorkerProxy(discovery=TopologyDiscovery(...), ...)``. Like every subscription
    it survives a cancelled wait, so a proxy may be stopped and started on it again; call
    ``aclose()`` when done with it (that also stops iterating the source). Use it from one
    event loop.

    Implementation notes:
        A re-read copies the instances and replicasets out of the topology (one read lock
        each) and walks them, O(instances). Whatever the origin, the timed re-read is skipped
        while ``Topology.membership_version`` has not moved since the last re-read began: the
        counter is read before the instances and replicasets, and moves after every change of
        either is stored, so a change made during or after a re-read moves it past the value
        read. Instances and replicasets are immutable values that the topology replaces on
        every change, so an instance whose object and replicaset object are the ones of the
        previous re-read keeps its previous record without building a new one. Items of a
        source are applied by a task of this stream; a re-read waits until that task yields to
        the event loop, so a burst of items the source had ready (a whole poll) costs one
        re-read. A ``TopologySource``'s ``run``, like whatever changes a topology followed
        directly, gives no signal when it has applied something, hence the check of the
        counter at an interval: a change reaches the pool up to ``interval`` seconds after it
        reached the topology (``refresh()`` re-reads at once).
    """

    def __init__(
        self,
        origin: Topology | AsyncIterable[Any],
        *,
        topology: Topology | None = None,
        interval: float | _Default | None = _DEFAULT,
        filter: Callable[[WorkerMetadata], bool] | None = None,
        apply: TopologyApply | None = None,
        warn_empty_after: float | _Default | None = _DEFAULT,
    ) -> None:
        self._source: AsyncIterable[Any] | None = None
        self._runner: TopologySource | None = None
        if isinstance(origin, Topology):
            if topology is not None and topology is not origin:
                raise ValueError("a topology is given twice: as the origin and as topology=")
            if apply is not None:
                raise ValueError("apply= applies a source's items; a topology has no source")
            self._topology = origin
            period = DEFAULT_CHECK_INTERVAL if isinstance(interval, _Default) else interval
        elif isinstance(origin, TopologySource) and apply is None:
            self._topology = Topology() if topology is None else topology
            self._runner = origin
            period = DEFAULT_CHECK_INTERVAL if isinstance(interval, _Default) else interval
            if period is None:
                raise ValueError("a TopologySource is followed by checking it at an interval")
        elif isinstance(origin, AsyncIterable):
            self._topology = Topology() if topology is None else topology
            self._source = origin
            period = None if isinstance(interval, _Default) else interval
        else:
            raise TypeError(
                "TopologyDiscovery follows a Topology or an async iterable of topology events,"
                f" not {type(origin).__name__}"
            )
        if period is not None and not period > 0:
            raise ValueError(f"interval must be positive (or None), got {period}")
        if isinstance(warn_empty_after, _Default):
            warn_empty_after = EMPTY_MAP_WARNING_AFTER
        elif self._runner is None:
            raise ValueError(
                "warn_empty_after is passed to a TopologySource's run(); this origin has none"
            )
        elif warn_empty_after is not None:
            warn_empty_after = check_seconds("warn_empty_after", warn_empty_after)
        self._warn_empty_after = warn_empty_after
        self._interval = period
        self._apply = apply if apply is not None else apply_change
        self._version_seen = -1
        self._wake = asyncio.Event()
        self._last: dict[str, tuple[Instance, Replicaset | None, WorkerMetadata | None]] = {}
        self._replicas: dict[str, tuple[uuid.UUID, ...]] = {}
        self._rejected: Counter[str] = Counter()
        feed = RecordFeed(filter)
        self._records = feed
        super().__init__(self._stream(), feed)

    @property
    def topology(self) -> Topology:
        """The topology this stream reads (the one a source's items are applied to)."""
        return self._topology

    @property
    def records(self) -> Mapping[uuid.UUID, WorkerMetadata]:
        """The members as of the last re-read, by uid (what the stream has handed out or is
        about to)."""
        return self._records.shown

    @property
    def last_failure(self) -> str | None:
        """What last went wrong reading the cluster, as the source's ``state.last_failure``
        says it (None for a topology followed directly, or a source without a state).
        :class:`~shardline.WorkerProxy` puts it in the error of a quorum that never came."""
        state = getattr(self._runner or self._source, "state", None)
        failure = getattr(state, "last_failure", None)
        return failure if isinstance(failure, str) else None

    @property
    def skipped(self) -> Mapping[str, int]:
        """Items skipped: ``"rejected"`` counts the source's items the topology refused."""
        return self._rejected

    def replicas(self, replicaset_uuid: str) -> tuple[uuid.UUID, ...]:
        """The uids of the members of ``replicaset_uuid`` as of the last re-read, ordered by
        uid; empty for an unknown replicaset. O(1): built by each re-read.

        Made for ``BucketLoadBalancer(..., replicas=discovery.replicas)``."""
        return self._replicas.get(replicaset_uuid, _NO_REPLICAS)

    def refresh(self) -> None:
        """Asks for a re-read of the topology as soon as the stream is next waited on."""
        self._wake.set()

    def _reread(self) -> list[DiscoveryEvent]:
        """Re-reads the topology's instances: the events that bring the subscriber up to date."""
        instances = self._topology.instances
        replicasets = self._topology.replicasets
        last = self._last
        seen: dict[str, tuple[Instance, Replicaset | None, WorkerMetadata | None]] = {}
        current: dict[uuid.UUID, WorkerMetadata] = {}
        for text, instance in instances.items():
            rs_uuid = instance.replicaset_uuid
            replicaset = None if rs_uuid is None else replicasets.get(rs_uuid)
            before = last.get(text)
            if before is not None and before[0] is instance and before[1] is replicaset:
                record = before[2]
            else:
                record = instance_record(instance, replicaset)
            seen[text] = (instance, replicaset, record)
            if record is not None:
                current[record.uid] = record
        self._last = seen
        events = self._records.resync(current)
        members: dict[str, list[uuid.UUID]] = {}
        for uid, record in self._records.shown.items():
            rs_uuid = record.extra["replicaset_uuid"]
            if rs_uuid is not None:
                members.setdefault(rs_uuid, []).append(uid)
        self._replicas = {rs: tuple(sorted(uids)) for rs, uids in members.items()}
        return events

    def _membership_moved(self) -> bool:
        """Whether an instance or replicaset changed since the last re-read."""
        return self._topology.membership_version != self._version_seen

    async def _stream(self) -> AsyncGenerator[DiscoveryEvent, None]:
        pump: asyncio.Task[None] | None = None
        if self._runner is not None:
            pump = asyncio.create_task(
                self._runner.run(self._topology, warn_empty_after=self._warn_empty_after)
            )
        elif self._source is not None:
            pump = asyncio.create_task(self._pump(self._source))
        if pump is not None:
            pump.add_done_callback(lambda _: self._wake.set())
        try:
            reread = True
            while True:
                if reread:
                    self._wake.clear()
                    self._version_seen = self._topology.membership_version
                    for event in self._reread():
                        yield event
                if pump is not None and pump.done() and not self._wake.is_set():
                    pump.result()  # the source's error, if it failed
                    return
                reread = True
                if self._wake.is_set():
                    continue
                if self._interval is None:
                    await self._wake.wait()
                    continue
                try:
                    async with asyncio.timeout(self._interval):
                        await self._wake.wait()
                except TimeoutError:
                    reread = self._membership_moved()
        finally:
            if pump is not None and not pump.done():
                await cancel_and_wait(pump)

    async def _pump(self, source: AsyncIterable[Any]) -> None:
        """Applies the source's items to the topology, waking the stream after each."""
        topology, apply = self._topology, self._apply
        resync = getattr(source, "resync", None)
        async for item in source:
            try:
                applied = apply(topology, item)
                if inspect.isawaitable(applied):
                    await applied
            except Exception as error:  # one item that cannot be applied must not end the stream
                self._rejected["rejected"] += 1
                logger.warning(
                    "the topology refused %s: %s",
                    type(item).__name__,
                    error if isinstance(error, InvalidEvent | UnknownTier) else repr(error),
                )
                if callable(resync):
                    resync()
            self._wake.set()
