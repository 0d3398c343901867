"""What :class:`~shardline.topology.sources.NotificationSource` needs of a transport: a
:class:`NotificationTransport` that subscribes and hands over a :class:`NotificationSession`,
and :class:`TransportError` for what fails. :mod:`.pg_notify` is the PostgreSQL one."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Protocol

from shardline.topology.sources.state import CountedFailure

__all__ = ["NotificationSession", "NotificationTransport", "TransportError"]


class TransportError(CountedFailure):
    """A transport failed; ``reason`` is the :class:`FailureReason` it counts as (``connect``,
    ``connection-lost``, ``timeout``, ``query-error``)."""


class NotificationSession(Protocol):
    """One subscription: the tiers, the snapshot burst read after subscribing, then the
    documents pushed since.

    ``documents()`` yields every document the subscription received, in delivery order,
    starting with those that arrived while the snapshot was read (the source drops the ones the
    snapshot already holds); it raises :class:`TransportError` when the subscription breaks
    and ends only if the stream ends. Called once per session. ``aclose()`` is idempotent and
    may be called while ``documents()`` is being iterated by another task.
    """

    @property
    def server(self) -> str:
        """Where the session is connected, for :attr:`SourceState.server`."""
        ...

    @property
    def tiers(self) -> Mapping[str, int]:
        """Each tier's bucket count (0: a tier without buckets), which the ADR's documents do
        not carry."""
        ...

    @property
    def snapshot(self) -> Sequence[str | bytes]:
        """The snapshot: the burst of ``replace`` documents the server sends first, read
        *after* the subscription was in place."""
        ...

    def documents(self) -> AsyncIterator[str | bytes]: ...

    async def aclose(self) -> None: ...


class NotificationTransport(Protocol):
    """Connects to the cluster and subscribes to its topology documents.

    ``connect()`` must subscribe first and read the snapshot second, so that no document
    committed between the two is lost; it raises :class:`TransportError` if it cannot, and
    leaves nothing open if it raises or is cancelled. ``name`` describes the target for logs.
    """

    @property
    def name(self) -> str: ...

    async def connect(self) -> NotificationSession: ...
