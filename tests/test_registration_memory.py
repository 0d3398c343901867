"""MemoryRecordStore: the record rules and the keeper scenarios of issue 5 (the contract
classes), and what is particular to the in-memory store."""

from __future__ import annotations

import asyncio
import gc

from registration_contract import (
    NEW,
    OLD,
    OLD_ADDRESS,
    KeeperContract,
    RecordStoreContract,
    take,
)

from shardline.registration import MemoryRecordStore, Record, RecordStore


class TestMemoryRecordStore(RecordStoreContract):
    async def make_store(self) -> RecordStore:
        return MemoryRecordStore()


class TestKeeperOnMemoryRecordStore(KeeperContract):
    async def make_store(self) -> RecordStore:
        return MemoryRecordStore()


def test_a_watcher_is_woken_by_the_write_itself() -> None:
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

    assert asyncio.run(scenario()) == [("app", Record(OLD, True, OLD_ADDRESS))]


def test_a_watch_dropped_unclosed_stops_receiving_changes() -> None:
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

    assert asyncio.run(scenario()) == 0


def test_a_closed_watch_stops_receiving_changes() -> None:
    async def scenario() -> int:
        store = MemoryRecordStore()
        watch = store.watch(["app"])
        await take(watch, 1)
        await watch.aclose()  # type: ignore[attr-defined]
        return len(store._watches)

    assert asyncio.run(scenario()) == 0
