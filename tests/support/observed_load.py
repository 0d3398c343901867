"""The pool's load of a worker as a dispatch sees it: the tests that check which balancers get
a load kept, and that it is kept during and after a call, share it."""

from __future__ import annotations

from typing import Any

from support.fakes import Harness
from support.workers import worker

Load = tuple[int, float]
"""What ``context.load(uid)`` says: the calls in flight, the latency."""


async def load_during_and_after(loadbalancer: Any, **options: Any) -> tuple[list[Load], Load]:
    """One dispatch through a proxy (``options`` its other arguments) to its only worker: the
    worker's load each time its connection received a call (once, unless the call was sent
    again), and once the call is answered."""
    harness = Harness()
    proxy = harness.proxy(1, loadbalancer=loadbalancer, **options)
    seen: list[Load] = []
    async with proxy:
        context = proxy._context
        connection = harness.connections[worker(1).address]
        original = connection.dispatch

        async def observing(task: Any, *, timeout: float | None = None) -> Any:
            seen.append(context.load(worker(1).uid))
            return await original(task, timeout=timeout)

        connection.dispatch = observing  # type: ignore[method-assign]
        await proxy.dispatch("task")
        return seen, context.load(worker(1).uid)
