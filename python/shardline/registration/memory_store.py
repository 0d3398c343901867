"""`MemoryRecordStore`: the reachability records of one process, in memory."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Collection

from shardline.errors import InvalidArgumentType
from shardline.registration.checks import (
    check_owner,
    check_service,
    check_services,
    check_text,
)
from shardline.registration.record import Record

__all__ = ["MemoryRecordStore"]


# A change as watchers receive it: the service and its record, None when cleared.
_Change = tuple[str, Record | None]


class MemoryRecordStore:
    """The :class:`~shardline.registration.RecordStore` rules within one process: keepers,
    readers and discovery sharing this object see the same records.

    Every operation takes effect when its call returns (there is nothing to fail).
    ``watch(services)`` follows the protocol: the current state of each service when first
    iterated, then each change of one of them as it is written; a write that leaves a record
    as it was is not a change. A watch that is dropped without ``aclose()`` stops receiving
    changes once it is garbage-collected; one kept but no longer read holds every later change
    of its services in memory.

    Implementation notes:
        Writes never suspend, so the owner guard's check and write are atomic on the event
        loop. Each watch has a queue; a write puts the change into the queues of the watches
        of that service before returning, so a watcher is woken at once (no polling). The
        queues are held weakly, so an abandoned watch cannot keep them growing.
    """

    def __init__(self) -> None:
        self._records: dict[str, Record] = {}
        self._watches: weakref.WeakKeyDictionary[asyncio.Queue[_Change], frozenset[str]] = (
            weakref.WeakKeyDictionary()
        )

    async def claim(self, service: str, owner: str | None) -> None:
        """Replaces the record with ``Record(owner, registered=False)``, unconditionally."""
        self._write(check_service(service), Record(check_owner(owner), registered=False))

    async def report(
        self, service: str, registered: bool, owner: str | None, address: str | None = None
    ) -> bool:
        """``True``: the record becomes ``Record(owner, True, address)``, always. ``False``:
        the record becomes ``Record(owner, False)`` unless it exists and belongs to another
        owner; returns whether it was applied."""
        check_service(service)
        check_owner(owner)
        if not isinstance(registered, bool):
            raise InvalidArgumentType(f"registered must be a bool, got {registered!r}")
        if address is not None and not isinstance(address, str):
            raise InvalidArgumentType(f"address must be a str or None, got {address!r}")
        check_text("address", address)
        if not registered and address is not None:
            raise ValueError(f"an unregistered record has no address, got {address!r}")
        if not registered:
            current = self._records.get(service)
            if current is not None and current.owner != owner:
                return False
        self._write(service, Record(owner, registered, address))
        return True

    async def get(self, service: str) -> Record | None:
        """The record, or ``None`` if there is none."""
        return self._records.get(check_service(service))

    async def clear(self, service: str) -> None:
        """Removes the record (undeploy): ``get`` answers ``None`` until the next write."""
        if self._records.pop(check_service(service), None) is not None:
            self._notify(service, None)

    def watch(self, services: Collection[str]) -> AsyncIterator[_Change]:
        """The current state of each of ``services``, then every change (see the class)."""
        return self._follow(check_services(services))

    def _write(self, service: str, record: Record) -> None:
        if self._records.get(service) == record:
            return
        self._records[service] = record
        self._notify(service, record)

    def _notify(self, service: str, record: Record | None) -> None:
        for queue, services in list(self._watches.items()):
            if service in services:
                queue.put_nowait((service, record))

    async def _follow(self, names: tuple[str, ...]) -> AsyncGenerator[_Change, None]:
        queue: asyncio.Queue[_Change] = asyncio.Queue()
        # the snapshot and the registration happen together, so no change falls between them
        initial = [(name, self._records.get(name)) for name in names]
        self._watches[queue] = frozenset(names)
        try:
            for change in initial:
                yield change
            while True:
                yield await queue.get()
        finally:
            self._watches.pop(queue, None)
