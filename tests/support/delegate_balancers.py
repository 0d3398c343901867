"""A balancer written against the seed's async-generator protocol alone, as a plugin author
would write one: the tests that need "some delegate-only balancer" share it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator
from typing import Any


class InAdmissionOrder:
    """Offers every pooled worker in admission order (no ``select``), the next one after a
    failure, and stops at the first that serves."""

    async def delegate(
        self, task: Any, *, context: Any
    ) -> AsyncGenerator[uuid.UUID, uuid.UUID | None]:
        for uid in list(context.workers):
            try:
                served = yield uid
            except Exception:
                continue
            if served is not None:
                return
