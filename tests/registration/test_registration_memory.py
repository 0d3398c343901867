"""MemoryRecordStore: the record rules and the keeper scenarios of issue 5 (the contract
classes), and what is particular to the in-memory store."""

from __future__ import annotations

import asyncio
import gc
import re
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from shardline.registration import MemoryRecordStore, Record, RecordStore
from support.registration_contract import (
    NEW,
    OLD,
    OLD_ADDRESS,
    KeeperContract,
    RecordStoreContract,
    take,
)


class TestMemoryRecordStore(RecordStoreContract):
    async def make_store(self) -> RecordStore:
        return MemoryRecordStore()


class TestKeeperOnMemoryRecordStore(KeeperContract):
    async def make_store(self) -> RecordStore:
        return MemoryRecordStore()


@pytest.mark.parametrize(
    ("call", "named"),
    [
        (lambda s: s.claim("\ud83d\ude00", "o"), "service must be Unicode text, got '\\ud83d"),
        (lambda s: s.get("a\ud800"), "service must be Unicode text, got 'a\\ud800'"),
        (lambda s: s.claim("app", "o\udfff"), "owner must be Unicode text, got 'o\\udfff'"),
        (lambda s: s.report("app", True, "o", "h\ud800:1"), "address must be Unicode text"),
    ],
)
async def test_text_that_is_not_unicode_is_refused_as_every_store_refuses_it(
    call: Callable[[MemoryRecordStore], Awaitable[Any]], named: str
) -> None:

    store = MemoryRecordStore()
    with pytest.raises(ValueError, match=re.escape(named)):
        await call(store)
    with pytest.raises(ValueError, match="must be Unicode text"):
        store.watch(["app", "\udfff"])
    assert store._records == {}


async def test_a_watcher_is_woken_by_the_write_itself() -> None:
    async def scenario() -> list[tuple[str, Record | None]]:
        store = MemoryRecordStore()
        watch = store.watch(["app"])
        await take(watch, 1)
        waiting = asyncio.ensure_future(anext(watch))
        await asyncio.sleep(0)
        await store.report("app", True, OLD, OLD_ADDRESS)
        await asyncio.sleep(0)  # one loop turn: no polling interval to wait out
        assert waiting.done()
        return [waiting.result()]

    assert await scenario() == [("app", Record(OLD, True, OLD_ADDRESS))]


async def test_a_watch_dropped_unclosed_stops_receiving_changes() -> None:
    async def scenario() -> int:
        store = MemoryRecordStore()
        watch = store.watch(["app"])
        await take(watch, 1)
        del watch
        gc.collect()
        for _ in range(3):  # the loop's finaliser closes the collected generator in a task
            await asyncio.sleep(0)
        await store.claim("app", NEW)
        return len(store._watches)

    assert await scenario() == 0


async def test_a_closed_watch_stops_receiving_changes() -> None:
    async def scenario() -> int:
        store = MemoryRecordStore()
        watch = store.watch(["app"])
        await take(watch, 1)
        await watch.aclose()  # type: ignore[attr-defined]
        return len(store._watches)

    assert await scenario() == 0
