"""Prometheus metrics for what shardline observes: :class:`ShardlineCollector` and
:func:`register` (the ``metrics`` extra, ``pip install 'shardline[metrics]'``).

Every number is read on scrape from state shardline keeps anyway (a topology's maps and
membership, a source's :class:`~shardline.topology.sources.SourceState`, a Picodata client's
:meth:`~shardline.picodata.Client.stats`, a proxy's pool), so a program that never imports this
module pays nothing for it, and one that does pays only when it is scraped. The metric table is
``docs/metrics.md``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from shardline._extras import requires_extra
from shardline._histogram import HistogramSnapshot
from shardline.registration.keeper import KEEPER_STATES
from shardline.topology.sources.notification import NotificationSource
from shardline.topology.sources.state import FailureReason

with requires_extra("metrics", __name__):
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        Metric,
    )
    from prometheus_client.registry import REGISTRY, CollectorRegistry

if TYPE_CHECKING:
    from shardline._core import Topology
    from shardline.discovery import Subscription
    from shardline.picodata import Client
    from shardline.picodata.stats import PoolStats
    from shardline.proxy import WorkerProxy
    from shardline.registration import RegistrationKeeper
    from shardline.topology.sources import TopologySource

__all__ = ["ShardlineCollector", "register"]

_REASONS = tuple(reason.value for reason in FailureReason)


class ShardlineCollector:
    """A Prometheus collector over the objects it is given; register it with a
    ``CollectorRegistry`` (or use :func:`register`).

    ``topology`` gives each tier's map (epoch, ranges, clears by cause, time spent empty) and
    the membership; with ``client`` and no ``topology``, the client's topology is used.
    ``sources`` names each topology source (``PollingSource``, ``NotificationSource``) by the
    value of its ``source`` label; ``client`` gives a Picodata client's routing and per-instance
    pool counters; ``proxies`` names each ``WorkerProxy`` by the value of its ``proxy`` label,
    ``keepers`` each ``RegistrationKeeper`` (a reachability record's keeper) by its ``keeper``
    label, ``discoveries`` each discovery stream a proxy follows (a
    :class:`~shardline.discovery.Subscription`: what ``subscribe()`` returns, or a
    ``TopologyDiscovery``) by its ``discovery`` label. Registering a proxy turns its dispatch
    latency histogram on (:meth:`~shardline.proxy.WorkerProxy.measure_latency`).
    Every label set is bounded: tiers, failure reasons and clear causes are fixed lists, the
    ``source`` and ``proxy`` names are the caller's, and ``instance`` (a client's pools) follows
    the cluster's membership. The names and meanings are listed in ``docs/metrics.md``.

    Implementation notes:
        ``collect`` reads the objects' snapshots (``Topology.map_stats``, ``state``,
        ``stats()``, ``stats``, ``workers``) each time it is called; it keeps no state of its
        own and holds no lock of shardline's while it builds the families.
    """

    def __init__(
        self,
        *,
        topology: Topology | None = None,
        sources: Mapping[str, TopologySource] | None = None,
        client: Client | None = None,
        proxies: Mapping[str, WorkerProxy] | None = None,
        keepers: Mapping[str, RegistrationKeeper] | None = None,
        discoveries: Mapping[str, Subscription] | None = None,
    ) -> None:
        if topology is None and client is not None:
            topology = client.topology
        self._topology = topology
        self._sources = dict(sources or {})
        self._client = client
        self._proxies = dict(proxies or {})
        for proxy in self._proxies.values():
            proxy.measure_latency()
        self._keepers = dict(keepers or {})
        self._discoveries = dict(discoveries or {})

    def describe(self) -> list[Metric]:
        """The families :meth:`collect` yields now: a registry reads their names when the
        collector is registered, to refuse a name another collector of it already has."""
        return list(self.collect())

    def collect(self) -> Iterator[Metric]:
        """The metric families, read now from the observed objects."""
        if self._topology is not None:
            yield from _topology_metrics(self._topology)
            yield from _route_metrics(self._topology)
        if self._sources:
            yield from _source_metrics(self._sources)
            yield from _source_duration_metrics(self._sources)
            yield from _notification_metrics(self._sources)
        if self._client is not None:
            yield from _client_metrics(self._client)
            yield from _client_poll_duration_metrics(self._client)
        if self._proxies:
            yield from _proxy_metrics(self._proxies)
            yield from _dispatch_metrics(self._proxies)
        if self._keepers:
            yield from _keeper_metrics(self._keepers)
            yield from _keeper_state_metrics(self._keepers)
        if self._discoveries:
            yield from _discovery_metrics(self._discoveries)


def register(
    registry: CollectorRegistry | None = None,
    *,
    topology: Topology | None = None,
    sources: Mapping[str, TopologySource] | None = None,
    client: Client | None = None,
    proxies: Mapping[str, WorkerProxy] | None = None,
    keepers: Mapping[str, RegistrationKeeper] | None = None,
    discoveries: Mapping[str, Subscription] | None = None,
) -> ShardlineCollector:
    """Registers a :class:`ShardlineCollector` over the given objects with ``registry``
    (prometheus_client's default registry when None) and returns it, for
    ``registry.unregister`` later. Raises ``ValueError`` (from prometheus_client) when a
    metric name is already registered there."""
    collector = ShardlineCollector(
        topology=topology,
        sources=sources,
        client=client,
        proxies=proxies,
        keepers=keepers,
        discoveries=discoveries,
    )
    (REGISTRY if registry is None else registry).register(collector)
    return collector


def _topology_metrics(topology: Topology) -> Iterator[Metric]:
    epoch = GaugeMetricFamily(
        "shardline_bucket_map_epoch",
        "The tier's bucket map epoch: moves on every change of the map, never otherwise.",
        labels=["tier"],
    )
    ranges = GaugeMetricFamily(
        "shardline_bucket_map_ranges", "Bucket ranges the tier's map holds.", labels=["tier"]
    )
    clears = CounterMetricFamily(
        "shardline_bucket_map_clears",
        "Clears of the tier's map that removed ranges, by cause.",
        labels=["tier", "cause"],
    )
    empty = CounterMetricFamily(
        "shardline_bucket_map_empty_seconds",
        "Seconds the tier's map spent empty after having held ranges, the current period "
        "included (wall clock).",
        labels=["tier"],
    )
    for tier in topology.tiers:
        stats = topology.map_stats(tier)
        epoch.add_metric([tier], stats.epoch)
        ranges.add_metric([tier], stats.ranges)
        for cause, count in stats.clears.items():
            clears.add_metric([tier, cause], count)
        empty.add_metric([tier], stats.empty_seconds)
    yield from (epoch, ranges, clears, empty)
    yield GaugeMetricFamily(
        "shardline_topology_membership_version",
        "Moves whenever an instance or a replicaset is added, changed or deleted.",
        value=topology.membership_version,
    )
    yield GaugeMetricFamily(
        "shardline_topology_instances", "Instances known.", value=len(topology.instances)
    )
    yield GaugeMetricFamily(
        "shardline_topology_replicasets", "Replicasets known.", value=len(topology.replicasets)
    )


def _route_metrics(topology: Topology) -> Iterator[Metric]:
    routes = CounterMetricFamily(
        "shardline_routes",
        "Keys and buckets looked up in the tier (owner, owners, find_bucket_master, route, "
        "route_many).",
        labels=["tier"],
    )
    misses = CounterMetricFamily(
        "shardline_route_misses",
        "Lookups of the tier answered None, by reason (as Topology.explain gives it).",
        labels=["tier", "reason"],
    )
    for tier in topology.tiers:
        stats = topology.route_stats(tier)
        routes.add_metric([tier], stats.routes)
        for reason, count in stats.misses.items():
            misses.add_metric([tier, reason], count)
    yield from (routes, misses)


def _source_metrics(sources: Mapping[str, TopologySource]) -> Iterator[Metric]:
    labels = ["source"]
    connected = GaugeMetricFamily(
        "shardline_source_connected", "1 while the source is connected to a server.", labels=labels
    )
    refreshes = CounterMetricFamily(
        "shardline_source_refreshes",
        "Refreshes (polls, or notification snapshots) that read and handed out everything.",
        labels=labels,
    )
    attempts = CounterMetricFamily(
        "shardline_source_attempts", "Refreshes attempted, successful or not.", labels=labels
    )
    failures = CounterMetricFamily(
        "shardline_source_failures",
        "Failures of a refresh or part of one, by reason.",
        labels=["source", "reason"],
    )
    tier_failures = CounterMetricFamily(
        "shardline_source_tier_failures",
        "Failures that concerned one tier alone (its bucket map), by tier.",
        labels=["source", "tier"],
    )
    emitted = CounterMetricFamily(
        "shardline_source_events_emitted", "Changes the source handed out.", labels=labels
    )
    applied = CounterMetricFamily(
        "shardline_source_events_applied",
        "Changes the source's run made to its topology.",
        labels=labels,
    )
    connects = CounterMetricFamily(
        "shardline_source_connects", "Connections the source made.", labels=labels
    )
    last_refresh = GaugeMetricFamily(
        "shardline_source_last_refresh_timestamp_seconds",
        "Unix time of the last complete refresh (absent before the first).",
        labels=labels,
    )
    for name, source in sources.items():
        state = source.state
        connected.add_metric([name], int(state.connected))
        refreshes.add_metric([name], state.refreshes)
        attempts.add_metric([name], state.attempts)
        for reason in _REASONS:
            failures.add_metric([name, reason], state.failures.get(reason, 0))
        for tier, count in sorted(state.tier_failures.items()):
            tier_failures.add_metric([name, tier], count)
        emitted.add_metric([name], state.events_emitted)
        applied.add_metric([name], state.events_applied)
        connects.add_metric([name], state.connects)
        if state.last_refresh is not None:
            last_refresh.add_metric([name], state.last_refresh)
    yield from (
        connected,
        refreshes,
        attempts,
        failures,
        tier_failures,
        emitted,
        applied,
        connects,
        last_refresh,
    )


def _client_metrics(client: Client) -> Iterator[Metric]:
    stats = client.stats()
    queries = CounterMetricFamily(
        "shardline_picodata_queries",
        "Queries sent, by kind: keyed (to the master), read-only, unkeyed.",
        labels=["kind"],
    )
    for kind, count in stats.routed.items():
        queries.add_metric([kind], count)
    misses = CounterMetricFamily(
        "shardline_picodata_route_misses",
        "Keys that found no route at first, by reason.",
        labels=["reason"],
    )
    for reason, count in sorted(stats.misses.items()):
        misses.add_metric([reason], count)
    fallbacks = CounterMetricFamily(
        "shardline_picodata_fallbacks",
        "Keyed queries sent to another instance than the bucket's master, by reason.",
        labels=["reason"],
    )
    for reason, count in sorted(stats.fallbacks.items()):
        fallbacks.add_metric([reason], count)
    yield from (queries, misses, fallbacks)
    yield CounterMetricFamily(
        "shardline_picodata_retries",
        "Queries retried after a refresh because the first instance could not be reached.",
        value=stats.retries,
    )
    yield CounterMetricFamily(
        "shardline_picodata_unavailable",
        "Queries that raised InstanceUnavailable.",
        value=stats.unavailable,
    )
    yield CounterMetricFamily(
        "shardline_picodata_polls", "Catalog polls attempted.", value=stats.polls
    )
    poll_failures = CounterMetricFamily(
        "shardline_picodata_poll_failures", "Catalog poll failures, by reason.", labels=["reason"]
    )
    for reason in _REASONS:
        poll_failures.add_metric([reason], stats.poll_failures.get(reason, 0))
    yield poll_failures
    yield CounterMetricFamily(
        "shardline_picodata_deadlines",
        "Queries that passed their deadline (raised DeadlineExceeded).",
        value=stats.deadlines,
    )
    yield CounterMetricFamily(
        "shardline_picodata_ejections",
        "Instances ejected for reads by their passive health.",
        value=stats.ejections,
    )
    yield CounterMetricFamily(
        "shardline_picodata_readmissions",
        "Ejected instances re-admitted after a probe query succeeded.",
        value=stats.readmissions,
    )
    yield GaugeMetricFamily(
        "shardline_picodata_ejected_instances",
        "Instances ejected for reads now (or waiting for their probe).",
        value=stats.ejected,
    )
    yield from _pool_metrics(stats.pools)


def _pool_metrics(pools: Mapping[str, PoolStats]) -> Iterator[Metric]:
    labels = ["instance"]
    gauges = {
        "size": GaugeMetricFamily(
            "shardline_picodata_pool_size",
            "The bound on the instance pool's open connections.",
            labels=labels,
        ),
        "open": GaugeMetricFamily(
            "shardline_picodata_pool_open_connections",
            "Connections open or being opened.",
            labels=labels,
        ),
        "idle": GaugeMetricFamily(
            "shardline_picodata_pool_idle_connections",
            "Connections waiting in the pool.",
            labels=labels,
        ),
        "in_use": GaugeMetricFamily(
            "shardline_picodata_pool_in_use_connections",
            "Connections lent to a query.",
            labels=labels,
        ),
        "down": GaugeMetricFamily(
            "shardline_picodata_pool_down",
            "1 while the instance is in its reconnection backoff.",
            labels=labels,
        ),
    }
    counters = {
        "queries": CounterMetricFamily(
            "shardline_picodata_pool_queries", "Queries run on the instance.", labels=labels
        ),
        "waits": CounterMetricFamily(
            "shardline_picodata_pool_waits",
            "Acquisitions that found every connection busy.",
            labels=labels,
        ),
        "timeouts": CounterMetricFamily(
            "shardline_picodata_pool_timeouts",
            "Acquisitions that gave up after acquire_timeout.",
            labels=labels,
        ),
        "connects": CounterMetricFamily(
            "shardline_picodata_pool_connects", "Connections opened.", labels=labels
        ),
        "connect_failures": CounterMetricFamily(
            "shardline_picodata_pool_connect_failures",
            "Connection attempts that failed.",
            labels=labels,
        ),
        "discarded": CounterMetricFamily(
            "shardline_picodata_pool_discarded",
            "Connections closed because they broke.",
            labels=labels,
        ),
    }
    for uuid, pool in sorted(pools.items()):
        for field, gauge in gauges.items():
            gauge.add_metric([uuid], int(getattr(pool, field)))
        for field, counter in counters.items():
            counter.add_metric([uuid], getattr(pool, field))
    yield from gauges.values()
    yield from counters.values()


def _proxy_metrics(proxies: Mapping[str, WorkerProxy]) -> Iterator[Metric]:
    workers = GaugeMetricFamily(
        "shardline_proxy_workers", "Workers in the proxy's pool.", labels=["proxy"]
    )
    for name, proxy in proxies.items():
        workers.add_metric([name], len(proxy.workers))
    yield workers


def _dispatch_metrics(proxies: Mapping[str, WorkerProxy]) -> Iterator[Metric]:
    labels = ["proxy", "balancer"]
    dispatches = CounterMetricFamily(
        "shardline_proxy_dispatches",
        "Dispatches to a worker the proxy started (each worker a call tried).",
        labels=labels,
    )
    failures = CounterMetricFamily(
        "shardline_proxy_dispatch_failures",
        "Dispatches to a worker that failed, by reason: transient (another worker is tried), "
        "broken (the worker is evicted, another is tried), error (it propagated).",
        labels=[*labels, "reason"],
    )
    exhausted = CounterMetricFamily(
        "shardline_proxy_exhausted",
        "Calls that raised NoWorkersAvailable: the balancer offered no worker more.",
        labels=labels,
    )
    admissions = CounterMetricFamily(
        "shardline_proxy_admissions", "Workers admitted to the pool.", labels=labels
    )
    refreshes = CounterMetricFamily(
        "shardline_proxy_refreshes",
        "Pooled workers whose connection discovery replaced.",
        labels=labels,
    )
    not_admitted = CounterMetricFamily(
        "shardline_proxy_not_admitted",
        "Workers discovery announced that the pool refused: it was at its lease, or no "
        "connection could be made to the record.",
        labels=labels,
    )
    evictions = CounterMetricFamily(
        "shardline_proxy_evictions",
        "Workers that left the pool, by reason: broken (a non-transient RpcError), dropped "
        "(by discovery), unconnectable (no connection could be made to its new record).",
        labels=[*labels, "reason"],
    )
    rpc_failures = CounterMetricFamily(
        "shardline_proxy_rpc_failures",
        "Dispatches to a worker that raised an RpcError (transient or broken), by its reason "
        "(shardline.errors.RpcReason).",
        labels=[*labels, "reason"],
    )
    calls_ended = CounterMetricFamily(
        "shardline_proxy_calls_failed",
        "Calls that raised, by outcome: deadline (DeadlineExceeded: the call's deadline "
        "passed), outcome-unknown (OutcomeUnknown: the task reached a worker whose answer never "
        "came, and was not sent again).",
        labels=[*labels, "outcome"],
    )
    retries = CounterMetricFamily(
        "shardline_proxy_retries",
        "Retries and hedges, by whether the retry budget allowed them (allowed, refused), and "
        "hedges sent (hedged).",
        labels=[*labels, "outcome"],
    )
    health = CounterMetricFamily(
        "shardline_proxy_health_transitions",
        "Passive health: workers ejected, and re-admitted after a successful probe.",
        labels=[*labels, "transition"],
    )
    ejected = GaugeMetricFamily(
        "shardline_proxy_ejected_workers",
        "Pooled workers passive health has ejected now.",
        labels=labels,
    )
    latency = HistogramMetricFamily(
        "shardline_proxy_dispatch_duration_seconds",
        "Time each timed dispatch to a worker took, whatever its outcome: every dispatch, "
        "except 1 in 8 on the round-robin native path.",
        labels=labels,
    )
    for name, proxy in proxies.items():
        stats = proxy.stats()
        values = [name, stats.balancer]
        dispatches.add_metric(values, stats.dispatched)
        failures.add_metric([*values, "transient"], stats.transient)
        failures.add_metric([*values, "broken"], stats.broken)
        failures.add_metric([*values, "error"], stats.errors)
        exhausted.add_metric(values, stats.exhausted)
        admissions.add_metric(values, stats.admissions)
        refreshes.add_metric(values, stats.refreshes)
        not_admitted.add_metric(values, stats.not_admitted)
        for reason, count in stats.evictions.items():
            evictions.add_metric([*values, reason], count)
        for reason, count in stats.rpc_failures.items():
            rpc_failures.add_metric([*values, reason], count)
        calls_ended.add_metric([*values, "deadline"], stats.deadlines)
        calls_ended.add_metric([*values, "outcome-unknown"], stats.outcomes_unknown)
        retries.add_metric([*values, "allowed"], stats.retries)
        retries.add_metric([*values, "refused"], stats.retries_refused)
        retries.add_metric([*values, "hedged"], stats.hedges)
        health.add_metric([*values, "ejected"], stats.ejections)
        health.add_metric([*values, "readmitted"], stats.readmissions)
        ejected.add_metric(values, stats.ejected)
        if stats.latency is not None:
            cumulative = list(itertools.accumulate(stats.latency.counts))
            buckets = [
                (repr(bound), count)
                for bound, count in zip(stats.latency.bounds, cumulative, strict=False)
            ]
            buckets.append(("+Inf", cumulative[-1]))
            latency.add_metric(values, buckets, sum_value=stats.latency.sum)
    yield from (
        dispatches,
        failures,
        exhausted,
        admissions,
        refreshes,
        not_admitted,
        evictions,
        rpc_failures,
        calls_ended,
        retries,
        health,
        ejected,
        latency,
    )


def _keeper_metrics(keepers: Mapping[str, RegistrationKeeper]) -> Iterator[Metric]:
    registered = GaugeMetricFamily(
        "shardline_keeper_registered",
        "1 while the keeper holds a registration of its replica.",
        labels=["keeper"],
    )
    registrations = CounterMetricFamily(
        "shardline_keeper_registrations",
        "register() calls, by result: ok (an address), failed.",
        labels=["keeper", "result"],
    )
    probes = CounterMetricFamily(
        "shardline_keeper_probes",
        "probe() calls, by result: served, failed (not served, or raised: re-registers).",
        labels=["keeper", "result"],
    )
    reports = CounterMetricFamily(
        "shardline_keeper_reports",
        "Writes of the record as registered, by result: ok, failed.",
        labels=["keeper", "result"],
    )
    for name, keeper in keepers.items():
        stats = keeper.stats
        registered.add_metric([name], int(stats.registered))
        registrations.add_metric([name, "ok"], stats.registrations)
        registrations.add_metric([name, "failed"], stats.registration_failures)
        probes.add_metric([name, "served"], stats.probes)
        probes.add_metric([name, "failed"], stats.probe_failures)
        reports.add_metric([name, "ok"], stats.reports)
        reports.add_metric([name, "failed"], stats.report_failures)
    yield from (registered, registrations, probes, reports)


def _histogram(
    family: HistogramMetricFamily, labels: list[str], snapshot: HistogramSnapshot
) -> None:
    family.add_metric(labels, buckets=snapshot.cumulative(), sum_value=snapshot.sum)


def _source_duration_metrics(sources: Mapping[str, TopologySource]) -> Iterator[Metric]:
    reads = HistogramMetricFamily(
        "shardline_source_read_seconds",
        "Time each refresh attempt took to read (a poll's connect and catalog queries; a "
        "notification session's connect and snapshot).",
        labels=["source"],
    )
    applies = HistogramMetricFamily(
        "shardline_source_apply_seconds",
        "Time the source's run took to apply each change (a snapshot, an event, a bucket map) "
        "to its topology, refused ones included.",
        labels=["source"],
    )
    for name, source in sources.items():
        state = source.state
        _histogram(reads, [name], state.read_durations)
        _histogram(applies, [name], state.apply_durations)
    yield from (reads, applies)


def _keeper_state_metrics(keepers: Mapping[str, RegistrationKeeper]) -> Iterator[Metric]:
    state = GaugeMetricFamily(
        "shardline_keeper_state",
        "1 for the state the keeper is in (idle, unregistered, registered, deregistered), "
        "0 for the others.",
        labels=["keeper", "state"],
    )
    reasserts = CounterMetricFamily(
        "shardline_keeper_reasserts",
        "Writes of the record as registered made after a successful probe (re-assertions).",
        labels=["keeper"],
    )
    info = GaugeMetricFamily(
        "shardline_keeper_info",
        "1, labelled with the keeper's service and owner tag (empty for an untagged replica).",
        labels=["keeper", "service", "owner"],
    )
    for name, keeper in keepers.items():
        stats = keeper.stats
        for each in KEEPER_STATES:
            state.add_metric([name, each], int(stats.state == each))
        reasserts.add_metric([name], stats.reasserts)
        info.add_metric([name, keeper.service, keeper.owner or ""], 1)
    yield from (state, reasserts, info)


_EVENT_TYPES = ("worker-added", "worker-updated", "worker-dropped")
_SKIP_REASONS = ("oversized", "malformed", "unknown-schema", "filter-error", "rejected")


def _discovery_metrics(discoveries: Mapping[str, Subscription]) -> Iterator[Metric]:
    events = CounterMetricFamily(
        "shardline_discovery_events",
        "Discovery events taken from the stream (applied to the proxy's pool), by type.",
        labels=["discovery", "type"],
    )
    skipped = CounterMetricFamily(
        "shardline_discovery_skipped",
        "Records skipped, by reason: unreadable (oversized, malformed, unknown-schema), "
        "refused by a raising filter (filter-error), or refused by the topology (rejected).",
        labels=["discovery", "reason"],
    )
    lag = HistogramMetricFamily(
        "shardline_discovery_event_lag_seconds",
        "Seconds from a record's publish (the publisher's wall clock) to its event being taken "
        "(this host's): meaningful only between synchronised clocks.",
        labels=["discovery"],
    )
    ahead = CounterMetricFamily(
        "shardline_discovery_clock_ahead",
        "Events whose publish time was later than their taking (the publisher's clock ahead), "
        "counted in the lag as 0.",
        labels=["discovery"],
    )
    for name, discovery in discoveries.items():
        stats = discovery.stats
        for kind in _EVENT_TYPES:
            events.add_metric([name, kind], stats.events.get(kind, 0))
        reasons = dict.fromkeys(_SKIP_REASONS, 0) | dict(stats.skipped)
        for reason, count in reasons.items():
            skipped.add_metric([name, reason], count)
        _histogram(lag, [name], stats.lag)
        ahead.add_metric([name], stats.clock_ahead)
    yield from (events, skipped, lag, ahead)


def _client_poll_duration_metrics(client: Client) -> Iterator[Metric]:
    polls = HistogramMetricFamily(
        "shardline_picodata_poll_seconds",
        "Time each catalog poll took to read (connect and catalog queries).",
    )
    _histogram(polls, [], client.stats().poll_durations)
    yield polls


_DELIVERY_OUTCOMES = ("handed-out", "duplicate", "stale", "skipped", "ignored")


def _notification_metrics(sources: Mapping[str, TopologySource]) -> Iterator[Metric]:
    notifications = CounterMetricFamily(
        "shardline_source_notifications",
        "Documents a notification source received, by what became of each: handed-out, "
        "duplicate, stale, skipped (malformed, too large, unknown tier), ignored (a map not "
        "followed).",
        labels=["source", "outcome"],
    )
    snapshots = CounterMetricFamily(
        "shardline_source_notification_snapshots",
        "Snapshots a notification source handed out (one per session, and per re-read).",
        labels=["source"],
    )
    last_event = GaugeMetricFamily(
        "shardline_source_last_notification_timestamp_seconds",
        "Unix time a notification source last handed out an event (absent before the first).",
        labels=["source"],
    )
    for name, source in sources.items():
        if not isinstance(source, NotificationSource):
            continue
        deliveries = source.deliveries
        counts = (
            deliveries.handed_out,
            deliveries.duplicates,
            deliveries.stale,
            deliveries.skipped,
            deliveries.ignored,
        )
        for outcome, count in zip(_DELIVERY_OUTCOMES, counts, strict=True):
            notifications.add_metric([name, outcome], count)
        snapshots.add_metric([name], deliveries.snapshots)
        if deliveries.last_event is not None:
            last_event.add_metric([name], deliveries.last_event)
    yield from (notifications, snapshots, last_event)
