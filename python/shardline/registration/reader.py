"""`advertised_address`: what a reader should advertise for a service, given its record."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from shardline.registration.checks import check_service
from shardline.registration.record import RecordStore

__all__ = ["Liveness", "advertised_address"]

logger = logging.getLogger("shardline.registration")

Liveness = Callable[[], str | Awaitable[str | None] | None]
"""The caller's own liveness signal: the address to advertise when a replica is alive, else
``None``; plain or async."""


async def advertised_address(store: RecordStore, service: str, *, alive: Liveness) -> str | None:
    """The address to advertise for ``service``, or ``None`` to advertise none.

    - record ``registered``: its address;
    - record not ``registered``: ``None`` (``alive`` is not consulted: the record says no);
    - no record (nobody ever reported, or it was cleared), or a record that cannot be read
      (any exception from ``store.get``, logged as a warning): what ``alive()`` returns —
      the caller's liveness signal, called (and awaited if it returns an awaitable) only then.

    A ``service`` that is not a non-empty str raises ``ValueError``; ``alive()``'s own errors
    propagate.
    """
    check_service(service)  # refused here, never mistaken for a store that cannot be read
    try:
        record = await store.get(service)
    except Exception as error:
        logger.warning(
            "the registration record of %r cannot be read, using the liveness signal: %s",
            service,
            error,
        )
        record = None
    if record is not None:
        return record.address if record.registered else None
    fallback = alive()
    if fallback is None or isinstance(fallback, str):
        return fallback
    return await fallback
