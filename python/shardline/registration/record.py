"""The reachability record of a service, and the store contract every backend implements."""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["Record", "RecordStore"]


@dataclass(frozen=True, slots=True)
class Record:
    """Whether a service is reachable, as the replica that last wrote it says.

    ``owner`` is the writing replica's tag (``None`` for an untagged replica); ``address`` is
    set only while ``registered``. No record at all (a store returning ``None``) means nobody
    ever reported, which is not the same as ``registered=False``.
    """

    owner: str | None
    registered: bool
    address: str | None = None


@runtime_checkable
class RecordStore(Protocol):
    """Where the records live, with the owner guard applied atomically.

    - ``claim(service, owner)`` replaces the record, unconditionally, with
      ``Record(owner, registered=False)``: a new replica generation takes over (and clears
      what a replica killed without deregistering left behind).
    - ``report(service, True, owner, address)`` is always accepted: the writer becomes the
      owner, ``Record(owner, True, address)``.
    - ``report(service, False, owner)`` is dropped when a record exists and its owner is not
      ``owner`` (a departed replica's late deregistration cannot override its successor);
      otherwise the record becomes ``Record(owner, False)``. It returns whether it was applied.
      A retraction carries no address (``ValueError`` if given one).
    - ``get(service)`` is the record or ``None``; ``clear(service)`` removes it (undeploy).
    - ``watch(services)`` yields ``(service, record or None)`` for each of ``services``: when
      first iterated, the current state of each (in the order given, duplicates once), then
      every change, never repeating what it last yielded for a service; ``aclose()`` ends it.
      A stored record the store cannot read is yielded as ``None`` (logged): no record ends a
      watch.

    Arguments are checked before anything is written (``ValueError`` naming the value); a
    service, owner or address must be Unicode text (no surrogate code point), so whatever a
    store accepts it gives back unchanged.
    """

    async def claim(self, service: str, owner: str | None) -> None: ...

    async def report(
        self, service: str, registered: bool, owner: str | None, address: str | None = None
    ) -> bool: ...

    async def get(self, service: str) -> Record | None: ...

    async def clear(self, service: str) -> None: ...

    def watch(self, services: Collection[str]) -> AsyncIterator[tuple[str, Record | None]]: ...
