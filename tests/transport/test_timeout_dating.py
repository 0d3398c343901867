"""A worker connection's frame and idle timeouts, dated by the sweeps (a read stamps nothing),
against a small reference model: for any sequence of reads (whole messages, a message's
first bytes, its rest) and sweeps at any times, ``overdue`` names a timeout exactly when the
model does, never before the timeout has truly passed since the bytes came, and at most as
late as the first sweep after them. tests/transport/test_msgpack_bounds.py shows the
timeouts on a real worker process."""

from __future__ import annotations

import asyncio
import concurrent.futures
from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from shardline.transport.limits import FRAME, IDLE, WorkerLimits, connection_bounds
from shardline.transport.msgpack import wire
from shardline.transport.msgpack.server import _Link, _State

LIMITS = WorkerLimits(frame_timeout=1.0, idle_timeout=2.0, hello_timeout=1000.0)


class _Transport:
    """What a connection uses of its socket's transport: writes are taken and dropped."""

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def write(self, data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (16 * 1024, 64 * 1024)


@dataclass
class Model:
    """The reference: when bytes truly came and the unfinished message truly began, and the
    first sweep that came after each (None until one did)."""

    heard: float
    heard_swept: float | None = None
    began: float | None = None
    began_swept: float | None = None

    def received(self, now: float, *, starts: bool, unfinished: bool) -> None:
        """Bytes came at ``now``; ``starts``: they begin a message, ``unfinished``: they
        leave one unfinished."""
        self.heard, self.heard_swept = now, None
        if not unfinished:
            self.began = self.began_swept = None
        elif starts:
            self.began, self.began_swept = now, None

    def sweep(self, now: float) -> str | None:
        if self.heard_swept is None:
            self.heard_swept = now
        if self.began is not None:
            if self.began_swept is None:
                self.began_swept = now
            return FRAME if now - self.began_swept > LIMITS.frame_timeout else None
        return IDLE if now - self.heard_swept > LIMITS.idle_timeout else None


# A step: wait this many seconds, then read "whole" (a message), "head" (a message's first
# bytes), "more" (a byte more of the unfinished message), "rest" (its rest), or sweep. A read
# of a message finishes the unfinished one first.
steps = st.lists(
    st.tuples(
        st.sampled_from([0.0, 0.05, 0.3, 0.9, 1.1, 2.5]),
        st.sampled_from(["whole", "head", "more", "rest", "sweep", "sweep"]),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_timeouts_are_dated_by_the_first_sweep_after_the_bytes(
    plan: list[tuple[float, str]],
) -> None:
    asyncio.run(_check(plan))


async def _check(plan: list[tuple[float, str]]) -> None:
    loop = asyncio.get_running_loop()
    with concurrent.futures.ThreadPoolExecutor(1) as threads:
        state = _State({}, 1 << 20, 16, threads, LIMITS, *connection_bounds(LIMITS), loop)
        link = _Link(state)
        link.connection_made(_Transport())  # type: ignore[arg-type]
        now = loop.time()
        link.data_received(wire.hello(1 << 20))
        model = Model(heard=now)
        msgids = iter(range(1 << 20))
        rest = b""  # the bytes still due of the unfinished message
        for wait, step in plan:
            now += wait
            if step == "sweep":
                expected = model.sweep(now)
                judged = link.overdue(now, LIMITS)
                assert judged == expected, (judged, expected)
                if judged == FRAME:  # never early: truly past since its first byte
                    assert model.began is not None
                    assert now - model.began > LIMITS.frame_timeout
                if judged == IDLE:
                    assert now - model.heard > LIMITS.idle_timeout
                continue
            if step in ("more", "rest") and len(rest) < 2:
                continue
            if step == "more":
                data, rest = rest[:1], rest[1:]
            elif step == "rest":
                data, rest = rest, b""
            else:
                message = wire.ping(next(msgids))
                cut = len(message) // 2 if step == "head" else len(message)
                data, rest = rest + message[:cut], message[cut:]
            link.data_received(data)
            model.received(now, starts=step == "head", unfinished=bool(rest))
