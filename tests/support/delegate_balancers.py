"""A balancer written against the seed's async-generator protocol alone, as a plugin author
would write one: the tests that need "some delegate-only balancer" share it, and
:func:`in_turn`, the loop such a balancer is made of, for the ones that offer other
candidates."""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator, Iterable
from typing import Any

Gen = AsyncGenerator[uuid.UUID, uuid.UUID | None]


async def in_turn(uids: Iterable[uuid.UUID]) -> Gen:
    """Offers each of ``uids`` as the iteration reaches it, the next one after a failure, and
    stops at the first that serves."""
    for uid in uids:
        try:
            served = yield uid
        except Exception:
            continue
        if served is not None:
            return


class InAdmissionOrder:
    """Offers every pooled worker in admission order (no ``select``), the next one after a
    failure, and stops at the first that serves."""

    def delegate(self, task: Any, *, context: Any) -> Gen:
        return in_turn(list(context.workers))
