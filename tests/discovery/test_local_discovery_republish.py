"""``LocalDiscovery`` logs a change only when a record changed: publishing an unchanged record
again (every publish carries a new ``published`` time) adds no row to the change log, as record
comparison ignores the publish time too."""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
import uuid
from pathlib import Path

from shardline import WorkerMetadata
from shardline.discovery.local import LocalDiscovery


def worker(n: int) -> WorkerMetadata:
    return WorkerMetadata(
        uid=uuid.UUID(int=n), address=f"127.0.0.1:{7000 + n}", pid=300 + n, version="1.0"
    )


def log_rows(path: Path) -> list[tuple[bytes, bytes | None]]:
    """The change log of the store's file, as its layout documents it."""
    with sqlite3.connect(path) as db:
        return db.execute("SELECT uid, data FROM changes ORDER BY seq").fetchall()


def owners(path: Path) -> list[int]:
    with sqlite3.connect(path) as db:
        return [owner for (owner,) in db.execute("SELECT owner FROM records ORDER BY uid")]


async def test_an_unchanged_republish_logs_no_change_and_a_changed_one_does(tmp_path: Path) -> None:
    discovery = LocalDiscovery("republish", directory=tmp_path)
    path = discovery.path
    try:
        publisher = discovery.publisher
        await publisher.publish("worker-added", worker(1))
        assert len(log_rows(path)) == 1
        for _ in range(3):
            await publisher.publish("worker-updated", worker(1))
        assert len(log_rows(path)) == 1
        changed = dataclasses.replace(worker(1), version="1.1")
        await publisher.publish("worker-updated", changed)
        rows = log_rows(path)
        assert len(rows) == 2
        assert b'"1.1"' in (rows[1][1] or b"")
    finally:
        await discovery.aclose()


async def test_a_takeover_with_an_unchanged_record_changes_its_owner_but_logs_nothing(
    tmp_path: Path,
) -> None:
    first = LocalDiscovery("takeover", directory=tmp_path)
    second = LocalDiscovery("takeover", directory=tmp_path)
    path = first.path
    try:
        await first.publisher.publish("worker-added", worker(1))
        (owner_before,) = owners(path)
        await second.publisher.publish("worker-added", worker(1))
        (owner_after,) = owners(path)
        assert owner_after != owner_before
        assert len(log_rows(path)) == 1
        # the first publisher no longer owns it: closing it leaves the record in place
        await first.publisher.aclose()
        assert len(owners(path)) == 1
    finally:
        await first.aclose()
        await second.aclose()


async def test_a_subscriber_sees_one_event_for_a_record_published_again_unchanged(
    tmp_path: Path,
) -> None:
    discovery = LocalDiscovery("quiet", directory=tmp_path, poll_interval=0.01)
    try:
        subscription = discovery.subscribe()
        await discovery.publisher.publish("worker-added", worker(1))
        added = await asyncio.wait_for(anext(subscription), 10)
        assert (added.type, added.metadata) == ("worker-added", worker(1))
        await discovery.publisher.publish("worker-updated", worker(1))
        await discovery.publisher.publish("worker-added", worker(2))
        after = await asyncio.wait_for(anext(subscription), 10)
        assert (after.type, after.metadata) == ("worker-added", worker(2))
    finally:
        await discovery.aclose()
