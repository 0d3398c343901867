"""advertised_address: the record decides when there is one; the caller's liveness signal when
there is none or it cannot be read."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from shardline.registration import MemoryRecordStore, Record, advertised_address
from support.registration_contract import NEW, OLD, OLD_ADDRESS

LIVE = "10.9.9.9:7000"  # what the liveness signal would advertise


class Liveness:
    """A liveness signal that counts its calls."""

    def __init__(self, answer: str | None) -> None:
        self.answer = answer
        self.calls = 0

    def __call__(self) -> str | None:
        self.calls += 1
        return self.answer


class UnreadableStore(MemoryRecordStore):
    async def get(self, service: str) -> Record | None:
        raise ConnectionError("the store cannot be reached")


async def read(store: MemoryRecordStore, alive: Liveness) -> str | None:
    return await advertised_address(store, "app", alive=alive)


async def store_with(*writes: tuple[Any, ...]) -> MemoryRecordStore:
    store = MemoryRecordStore()
    for kind, *arguments in writes:
        await getattr(store, kind)("app", *arguments)
    return store


async def test_a_registered_record_advertises_its_address_without_asking_liveness() -> None:
    alive = Liveness(None)
    assert await read(await store_with(("report", True, OLD, OLD_ADDRESS)), alive) == OLD_ADDRESS
    assert alive.calls == 0


async def test_an_unregistered_record_advertises_nothing_whatever_liveness_says() -> None:
    alive = Liveness(LIVE)
    assert (
        await read(await store_with(("report", True, OLD, OLD_ADDRESS), ("claim", NEW)), alive)
        is None
    )
    assert alive.calls == 0


@pytest.mark.parametrize("answer", [LIVE, None])
async def test_no_record_falls_back_to_the_liveness_signal(answer: str | None) -> None:
    alive = Liveness(answer)
    assert await read(MemoryRecordStore(), alive) == answer
    assert alive.calls == 1


async def test_a_cleared_record_falls_back_to_the_liveness_signal() -> None:
    store = await store_with(("report", True, OLD, OLD_ADDRESS), ("clear",))
    assert await read(store, Liveness(LIVE)) == LIVE


async def test_a_record_that_cannot_be_read_falls_back_to_the_liveness_signal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, "shardline.registration"):
        assert await read(UnreadableStore(), Liveness(LIVE)) == LIVE
    assert "the store cannot be reached" in caplog.text


async def test_an_async_liveness_signal_is_awaited() -> None:
    async def alive() -> str | None:
        await asyncio.sleep(0)
        return LIVE

    assert await advertised_address(MemoryRecordStore(), "app", alive=alive) == LIVE


async def test_a_bad_service_is_refused_not_taken_for_an_unreadable_record() -> None:
    with pytest.raises(ValueError, match="service"):
        await advertised_address(MemoryRecordStore(), "", alive=Liveness(LIVE))
