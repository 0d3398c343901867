"""`RegistrationDiscovery`: reachability records as pool events, one worker per service."""

from __future__ import annotations

import asyncio
import logging
import uuid
import weakref
from collections.abc import AsyncGenerator, Collection
from types import MappingProxyType

from shardline.checks import check_seconds
from shardline.discovery.protocol import RecordFilter
from shardline.discovery.subscription import RecordFeed, Subscription
from shardline.registration.checks import check_service, check_services
from shardline.registration.record import Record, RecordStore
from shardline.workers import DiscoveryEvent, WorkerMetadata

__all__ = ["SERVICE_UID_NAMESPACE", "RegistrationDiscovery", "service_uid"]

logger = logging.getLogger("shardline.registration")

SERVICE_UID_NAMESPACE = uuid.UUID("7e677079-2a81-41dd-bdff-e073876a809c")
"""The uuid5 namespace of :func:`service_uid`; it never changes, so every process and version
derives the same uid for a service."""


def service_uid(service: str) -> uuid.UUID:
    """The uid under which ``service`` appears in a pool fed by :class:`RegistrationDiscovery`:
    ``uuid5(SERVICE_UID_NAMESPACE, service)``, the same in every process."""
    return uuid.uuid5(SERVICE_UID_NAMESPACE, check_service(service))


class RegistrationDiscovery:
    """Follows the records of ``services`` in ``store`` and presents each service as one worker
    of a pool, present exactly while its record is registered with an address.

    The worker of a service is ``WorkerMetadata(uid=service_uid(service), address=<the record's
    address>, pid=0, version="", extra={"service": service})``: a record names no process
    and no version, so those are fixed, and the owner is left out, so a successor registering
    at its predecessor's address changes nothing a pool would act on.

    ``subscribe(filter=None)`` follows the subscribe half of the
    :class:`~shardline.discovery.Discovery` contract: a :class:`Subscription` that first
    replays every service whose record is registered as ``worker-added``, then streams the
    changes — a record becoming registered with an address: ``worker-added``; its address
    changing: ``worker-updated``; a record that stops being registered or disappears:
    ``worker-dropped``; a rewrite that changes none of that: nothing. ``filter`` chooses among
    the workers as it does for any backend. Subscriptions are independent of each other.

    Iterating the object itself opens a new subscription, so it can be passed as is as a
    :class:`~shardline.proxy.WorkerProxy`'s ``discovery``. There is no ``publisher``: the
    records are written by :class:`~shardline.registration.RegistrationKeeper` (or the store),
    never published as workers. ``aclose()`` closes every subscription opened here.

    When the store's watch raises, the failure is logged and a new watch is opened after
    ``retry_delay`` seconds; its first states bring every subscription up to date (a change
    undone within the gap is not seen). A watch that ends (its store was closed) ends the
    subscription. ``ValueError`` (naming the value) for ``services`` that is not a non-empty
    collection of non-empty names (a bare str is refused), or a negative ``retry_delay``.
    """

    def __init__(
        self, store: RecordStore, services: Collection[str], *, retry_delay: float = 1.0
    ) -> None:
        self._store = store
        self._services = check_services(services)
        self._retry_delay = check_seconds("retry_delay", retry_delay, zero=True)
        # weak: a subscription dropped without being closed must not be kept alive here
        self._subscriptions: weakref.WeakSet[Subscription] = weakref.WeakSet()

    @property
    def services(self) -> tuple[str, ...]:
        """The services followed, in the order given, each once."""
        return self._services

    def subscribe(self, filter: RecordFilter | None = None) -> Subscription:
        feed = RecordFeed(filter)
        subscription = Subscription(self._follow(feed), feed)
        self._subscriptions.add(subscription)
        return subscription

    def __aiter__(self) -> Subscription:
        return self.subscribe()

    async def aclose(self) -> None:
        """Closes every subscription opened here."""
        for subscription in list(self._subscriptions):
            await subscription.aclose()

    async def _follow(self, feed: RecordFeed) -> AsyncGenerator[DiscoveryEvent, None]:
        while True:
            watch = self._store.watch(self._services)
            try:
                async for service, record in watch:
                    for event in _events(feed, service, record):
                        yield event
                return
            except Exception as error:
                logger.warning(
                    "watching the registration records of %s failed, watching again in %s s: %s",
                    ", ".join(self._services),
                    self._retry_delay,
                    error,
                )
            finally:
                close = getattr(watch, "aclose", None)
                if close is not None:
                    await close()
            await asyncio.sleep(self._retry_delay)


def _events(feed: RecordFeed, service: str, record: Record | None) -> list[DiscoveryEvent]:
    uid = service_uid(service)
    if record is None or not record.registered or not record.address:
        return feed.remove(uid)
    metadata = WorkerMetadata(
        uid=uid,
        address=record.address,
        pid=0,
        version="",
        extra=MappingProxyType({"service": service}),
    )
    return feed.put(metadata)
