"""The credit state machine of a stream, each side against a small reference model (Hypothesis):
the worker's ``StreamProducer`` advances its generator exactly as far as the credit granted
allows, and the caller's ``MsgpackStream`` grants back a half window per half window read,
never letting the worker send past what it granted. In process; the wire itself is covered by
test_streaming.py on real worker processes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from hypothesis import given
from hypothesis import strategies as st

from shardline.transport.msgpack import stream_wire, wire
from shardline.transport.msgpack.stream import MsgpackStream, StreamFeed
from shardline.transport.msgpack.stream_worker import StreamProducer

# The producer's task runs when the loop turns: a few turns let it take every step a grant
# allows (each step is one turn at most: the generator below never waits).
TURNS = 4


async def turns() -> None:
    for _ in range(TURNS):
        await asyncio.sleep(0)


@given(
    window=st.integers(1, 8),
    total=st.integers(0, 40),
    grants=st.lists(st.integers(1, 6), max_size=12),
)
def test_the_producer_advances_the_generator_exactly_as_far_as_the_credit(
    window: int, total: int, grants: list[int]
) -> None:
    produced = 0
    closed = False

    async def numbers() -> AsyncIterator[int]:
        nonlocal produced, closed
        try:
            for n in range(total):
                produced += 1
                yield n
        finally:
            closed = True

    async def scenario() -> None:
        frames: list[bytes] = []
        producer = StreamProducer(7, "numbers", numbers(), window, frames.append, 1 << 20)
        running = asyncio.ensure_future(producer.run())
        credit = window
        for grant in [0, *grants]:
            if grant:
                producer.grant(grant)
                credit += grant
            await turns()
            expected = min(total, credit)
            assert produced == expected  # the model: never past the credit, up to it at once
            assert frames == [
                stream_wire.item(7, wire.pack_value(n, "an item", "numbers"))
                for n in range(expected)
            ]
            assert running.done() == (credit > total)
        if not running.done():
            running.cancel()
            await asyncio.wait([running])
        assert closed  # exhausted, or closed by the cancel

    asyncio.run(scenario())


@given(
    window=st.integers(1, 9),
    total=st.integers(0, 60),
    reads=st.lists(st.integers(1, 7), max_size=20),
)
def test_the_caller_grants_a_half_window_per_half_window_read(
    window: int, total: int, reads: list[int]
) -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        feed = StreamFeed("numbers", window)
        granted: list[int] = []
        ended: list[bool] = []

        def grant(msgid: int, items: int) -> None:
            assert msgid == 3
            granted.append(items)
            feed.allowed += items  # as the link does

        stream = MsgpackStream(
            feed, 3, window, None, "test", grant, lambda _: None, lambda: ended.append(True), loop
        )
        sent = 0

        def worker_sends() -> None:  # the model worker: all it may, then the end
            nonlocal sent
            while feed.allowed > 0 and sent < total:
                feed.push(sent)
                sent += 1
            if sent == total and feed.outcome is None:
                feed.end()

        read: list[int] = []
        worker_sends()
        for count in reads:
            for _ in range(count):
                if len(read) == total:
                    break
                read.append(await anext(stream))
                worker_sends()
                assert feed.allowed >= 0
                assert sent <= len(read) + window  # never past the window ahead
            half = max(1, window // 2)
            # granted per half window read, until the end came
            assert sum(granted) <= len(read)
            if feed.outcome is None:
                assert sum(granted) == len(read) // half * half
        assert read == list(range(len(read)))
        if len(read) == total:
            assert [item async for item in stream] == []
            assert ended == [True]

    asyncio.run(scenario())
