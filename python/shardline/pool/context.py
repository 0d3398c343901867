"""The pool balancers read: `LoadBalancerContext` and its read-only `workers` view."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from shardline._core import WorkerPool, WorkersView

__all__ = ["LoadBalancerContext", "LoadBalancerContextView", "WorkersView"]

# The Rust view implements the mapping protocol; registering it makes it one for isinstance.
Mapping.register(WorkersView)


@runtime_checkable
class LoadBalancerContextView(Protocol):
    """What a balancer sees of the pool: the live, read-only ``workers`` mapping."""

    @property
    def workers(self) -> Mapping[uuid.UUID, tuple[Any, Any]]: ...


class LoadBalancerContext(WorkerPool):
    """The uid-keyed pool of workers, with the read-only view balancers are given: a
    :class:`shardline.WorkerPool` with its ``workers`` mapping.

    ``add_worker(metadata, connection)`` admits or replaces (a replace keeps the worker's
    position); ``update_worker(metadata, connection)`` refreshes only a worker already admitted
    and returns whether it was; ``remove_worker(metadata)`` evicts by ``metadata.uid``, a no-op
    when absent. Identity is ``metadata.uid``; writes are last-writer-wins; a displaced
    connection is not closed. ``load(uid)`` is ``(dispatches in flight, latency in seconds)`` as
    the proxy keeps it, for balancers that weigh it: the latency is the worker's average, moved
    toward the pool's mean latency the longer ago it was last measured, or that mean before it
    ever was. ``workers`` is the live,
    read-only :class:`WorkersView` uid → ``(metadata, connection)``, and
    ``next_in_rotation(tried)`` the pool's shared rotation (see :class:`shardline.WorkerPool`).

    Passive health is off until ``configure_health(policy)`` is given a
    :class:`~shardline.pool.health.HealthPolicy`; from then on a worker the policy ejects is
    hidden from everything a balancer reads until a probe re-admits it, while ``len(context)``,
    ``uid in context``, ``pooled(uid)`` and ``members()`` still count it. ``health(uid)`` is a
    :class:`~shardline.pool.health.WorkerHealth`.

    Implementation notes:
        Everything is the Rust pool's, ``workers`` included: the subclass adds no member. It
        is the name wool's balancers know their context by
        (``wool.runtime.loadbalancer.base.LoadBalancerContext``), kept so a balancer written
        against wool's names reads the same here, and the type each proxy makes its pool of.
    """
