"""LocalDiscovery: the discovery contract between processes on one machine, and its faults.

Publishers in other processes are real Python processes (``local_publisher.py``) killed,
stopped and resumed with real signals; malformed records are written into the real store.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, closing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardline.discovery import Discovery, DiscoveryEvent, Subscription
from shardline.discovery.local import LocalDiscovery
from shardline.discovery.record import encode_record
from shardline.workers import WorkerMetadata
from support.discovery_contract import WAIT, DiscoveryContract, quiet, take
from support.local_discovery import write_by_hand
from support.parked import parked
from support.workers import worker

pytestmark = pytest.mark.integration

# Short enough for a quick suite, long enough that a loaded machine stalling a process for a
# moment does not get it presumed dead. Tests not about liveness keep the defaults (1 s, 5 s).
HEARTBEAT = 0.1
LIVENESS = 0.5
BOUND = LIVENESS + HEARTBEAT
SLACK = 0.4
SHORT = (HEARTBEAT, LIVENESS)
# a handle that, unless woken, looks at the log only every 4 s (to poll, or to check liveness)
SELDOM = {"poll_interval": 4.0, "heartbeat": 4.0, "liveness_timeout": 10.0}

PUBLISHER = Path(__file__).with_name("local_publisher.py")


def local(directory: Path, namespace: str, **settings: Any) -> LocalDiscovery:
    return LocalDiscovery(namespace, directory=directory, **settings)


def short_lived(directory: Path, namespace: str) -> LocalDiscovery:
    return local(directory, namespace, heartbeat=HEARTBEAT, liveness_timeout=LIVENESS)


class TestLocalDiscovery(DiscoveryContract):
    @pytest.fixture(autouse=True)
    def _directory(self, tmp_path: Path) -> None:
        self.directory = tmp_path

    async def make(self, namespace: str) -> Discovery:
        return local(self.directory, namespace)


async def lapsed(path: Path, bound: float = 10.0) -> None:
    """Until every publisher of the store at ``path`` has missed its liveness timeout, as
    the store itself tells (its rows: last heartbeat on the shared monotonic clock, timeout)."""
    deadline = time.monotonic() + bound
    while True:
        with closing(sqlite3.connect(path)) as db:
            beats = db.execute("SELECT beat_at, timeout FROM publishers").fetchall()
        if all(time.monotonic() - beat_at > timeout for beat_at, timeout in beats):
            return
        assert time.monotonic() < deadline, f"publishers still live after {bound} s: {beats}"
        await asyncio.sleep(0.01)


@asynccontextmanager
async def publisher_process(
    directory: Path,
    namespace: str,
    *,
    first: int = 1,
    count: int = 1,
    versions: int = 1,
    liveness: tuple[float, float] = (1.0, 5.0),
) -> AsyncIterator[asyncio.subprocess.Process]:
    """A process that has published its workers and keeps them alive until its stdin closes."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(PUBLISHER),
        str(directory),
        namespace,
        *("--first", str(first), "--count", str(count), "--versions", str(versions)),
        *("--heartbeat", str(liveness[0]), "--liveness", str(liveness[1])),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    try:
        assert await asyncio.wait_for(process.stdout.readline(), WAIT) == b"ready\n"
        yield process
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()


async def close_stdin(process: asyncio.subprocess.Process) -> None:
    """Lets the process close its handle and exit, as a worker shutting down cleanly does."""
    assert process.stdin is not None
    process.stdin.close()
    assert await asyncio.wait_for(process.wait(), WAIT) == 0


def uids(events: list[DiscoveryEvent]) -> set[tuple[str, uuid.UUID]]:
    return {(event.type, event.metadata.uid) for event in events}


async def test_a_killed_publisher_is_dropped_within_the_liveness_bound(tmp_path: Path) -> None:

    discovery = short_lived(tmp_path, "killed")
    subscription = discovery.subscribe()
    async with publisher_process(tmp_path, "killed", count=3, liveness=SHORT) as process:
        added = await take(subscription, 3)
        assert {event.metadata.pid for event in added} == {process.pid}
        # alive, it keeps its records well past the timeout
        assert await quiet(subscription, 3 * LIVENESS)
        process.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        dropped = await take(subscription, 3)
        elapsed = time.monotonic() - killed
    assert uids(dropped) == {("worker-dropped", worker(n).uid) for n in (1, 2, 3)}
    assert elapsed <= BOUND + SLACK, f"dropped {elapsed:.3f} s after SIGKILL"
    await discovery.aclose()


async def test_a_stalled_publisher_is_dropped_then_restored_when_it_resumes(tmp_path: Path) -> None:

    discovery = short_lived(tmp_path, "stalled")
    subscription = discovery.subscribe()
    async with publisher_process(tmp_path, "stalled", count=2, liveness=SHORT) as process:
        await take(subscription, 2)
        process.send_signal(signal.SIGSTOP)
        try:
            dropped = await take(subscription, 2)
        finally:
            process.send_signal(signal.SIGCONT)
        restored = await take(subscription, 2)
        assert uids(dropped) == {("worker-dropped", worker(n).uid) for n in (1, 2)}
        assert uids(restored) == {("worker-added", worker(n).uid) for n in (1, 2)}
        await close_stdin(process)
        assert uids(await take(subscription, 2)) == uids(dropped)
    await discovery.aclose()


def live_publishers(path: Path) -> list[bool]:
    """Whether each publisher of the store at ``path`` is within its liveness timeout now, as
    any handle that reaped now would judge it."""
    with closing(sqlite3.connect(path)) as db:
        beats = db.execute("SELECT beat_at, timeout FROM publishers").fetchall()
    return [time.monotonic() - beat_at <= timeout for beat_at, timeout in beats]


async def test_a_loop_blocked_as_soon_as_the_record_is_visible_does_not_lapse_it(
    tmp_path: Path,
) -> None:
    """Once its record can be seen, a worker can be called, and a handler that blocks the loop
    may run before ``publish`` resumes on that loop: the heartbeats must not wait for it. (A
    heartbeat thread started after the put missed every beat of the block, and the worker
    flapped: tests/transport/test_worker_faults.py, once under load.)"""
    # a heartbeat thread stalled 1.25 s (the timeout less a heartbeat) is presumed dead
    heartbeat, liveness = 0.25, 1.5
    discovery = local(tmp_path, "blocked", heartbeat=heartbeat, liveness_timeout=liveness)
    record = worker(1)
    publishing = asyncio.ensure_future(discovery.publisher.publish("worker-added", record))
    await asyncio.sleep(0)  # one turn: the publish has handed its put to the SQLite thread
    # From here the loop is blocked, as by that handler: until the put has committed (as
    # another process sees it), then past the liveness timeout.
    deadline = time.monotonic() + WAIT
    while live_publishers(discovery.path) == []:
        assert time.monotonic() < deadline, f"the record was not put within {WAIT} s"
        time.sleep(0.001)
    time.sleep(liveness + heartbeat)  # the blocking handler (what is tested)
    assert live_publishers(discovery.path) == [True]
    await publishing
    await discovery.aclose()


async def test_a_subscriber_started_after_workers_sees_them_replayed(tmp_path: Path) -> None:

    async with (
        publisher_process(tmp_path, "late", first=1, count=3) as first,
        publisher_process(tmp_path, "late", first=4, count=2) as second,
    ):
        discovery = local(tmp_path, "late")
        subscription = discovery.subscribe()
        replayed = await take(subscription, 5)
        assert uids(replayed) == {("worker-added", worker(n).uid) for n in range(1, 6)}
        assert {event.metadata.uid.int: event.metadata.pid for event in replayed} == {
            **{n: first.pid for n in (1, 2, 3)},
            **{n: second.pid for n in (4, 5)},
        }
        assert await quiet(subscription)
        await close_stdin(first)
        assert uids(await take(subscription, 3)) == {
            ("worker-dropped", worker(n).uid) for n in (1, 2, 3)
        }
        assert await quiet(subscription)
        await discovery.aclose()


async def test_a_subscriber_started_after_a_publisher_died_replays_none_of_its_workers(
    tmp_path: Path,
) -> None:

    async with publisher_process(tmp_path, "dead", count=3, liveness=SHORT) as process:
        process.send_signal(signal.SIGKILL)
        await process.wait()
    # nobody was watching while its heartbeat lapsed
    (store,) = tmp_path.glob("dead-*.sqlite3")
    await lapsed(store)
    discovery = local(tmp_path, "dead")
    survivor = worker(9)
    await discovery.publisher.publish("worker-added", survivor)
    subscription = discovery.subscribe()
    assert uids(await take(subscription, 1)) == {("worker-added", survivor.uid)}
    assert await quiet(subscription)
    await discovery.aclose()


async def test_concurrent_publisher_processes_converge_in_publication_order(tmp_path: Path) -> None:
    versions = 40

    discovery = local(tmp_path, "busy")
    subscription = discovery.subscribe()
    seen: dict[uuid.UUID, list[int]] = {}
    async with (
        publisher_process(tmp_path, "busy", first=10, count=4, versions=versions) as a,
        publisher_process(tmp_path, "busy", first=20, count=4, versions=versions) as b,
        publisher_process(tmp_path, "busy", first=30, count=4, versions=versions) as c,
    ):
        while len(seen) < 12 or any(pids[-1] != versions for pids in seen.values()):
            event = (await take(subscription, 1))[0]
            assert event.type == (
                "worker-updated" if event.metadata.uid in seen else "worker-added"
            )
            seen.setdefault(event.metadata.uid, []).append(event.metadata.pid)
        for process in (a, b, c):
            await close_stdin(process)
        dropped = await take(subscription, 12)
    for pids in seen.values():
        assert pids == sorted(set(pids))
    assert uids(dropped) == {("worker-dropped", uid) for uid in seen}
    await discovery.aclose()


def document(metadata: WorkerMetadata, **changes: Any) -> bytes:
    return json.dumps({**json.loads(encode_record(metadata)), **changes}).encode()


BAD_RECORDS = [
    (worker(11).uid, b'{"schema": 1, "uid": '),
    (worker(12).uid, document(worker(12), schema=2)),
    (worker(13).uid, document(worker(13), extra={"pad": "x" * 70_000})),
    (worker(14).uid, encode_record(worker(15))),
]
BAD_COUNTS = {"malformed": 2, "unknown-schema": 1, "oversized": 1}


async def test_malformed_records_written_by_hand_are_skipped_and_counted(tmp_path: Path) -> None:

    discovery = local(tmp_path, "malformed")
    subscription = discovery.subscribe()
    await discovery.publisher.publish("worker-added", worker(1))
    await take(subscription, 1)
    write_by_hand(discovery.path, BAD_RECORDS)
    await discovery.publisher.publish("worker-added", worker(2))
    assert uids(await take(subscription, 1)) == {("worker-added", worker(2).uid)}
    assert subscription.skipped == BAD_COUNTS

    late = discovery.subscribe()
    assert uids(await take(late, 2)) == {("worker-added", worker(n).uid) for n in (1, 2)}
    assert late.skipped == BAD_COUNTS

    # a shown record replaced by one the reader cannot read is gone for the reader
    write_by_hand(discovery.path, [(worker(1).uid, document(worker(1), schema=2))])
    await discovery.publisher.publish("worker-added", worker(3))
    for stream in (subscription, late):
        assert uids(await take(stream, 2)) == {
            ("worker-dropped", worker(1).uid),
            ("worker-added", worker(3).uid),
        }
        assert stream.skipped["unknown-schema"] == 2
    await discovery.aclose()


async def test_a_subscriber_behind_the_trimmed_log_gets_exactly_the_differences(
    tmp_path: Path,
) -> None:

    discovery = local(tmp_path, "behind", log_retention=4)
    publish = discovery.publisher.publish
    for n in (1, 2, 3):
        await publish("worker-added", worker(n))
    subscription = discovery.subscribe()
    await take(subscription, 3)
    # the subscriber reads nothing while these are written
    for pid in range(200, 210):
        await publish("worker-updated", worker(1, pid=pid))
    await publish("worker-dropped", worker(3))
    await publish("worker-added", worker(4))
    await publish("worker-added", worker(5))
    await publish("worker-dropped", worker(5))
    await publish("worker-updated", worker(2, address="10.0.0.2:1"))
    await publish("worker-updated", worker(2))
    with closing(sqlite3.connect(discovery.path)) as db:
        (trimmed,) = db.execute("SELECT value FROM meta WHERE key = 'trimmed_through'")
    assert trimmed[0] > 3
    events = await take(subscription, 3)
    assert sorted(kinds_and_pids(events)) == [
        ("worker-added", 4, worker(4).pid),
        ("worker-dropped", 3, worker(3).pid),
        ("worker-updated", 1, 209),
    ]
    # and it follows the log again
    await publish("worker-updated", worker(4, pid=1))
    assert kinds_and_pids(await take(subscription, 1)) == [("worker-updated", 4, 1)]
    assert await quiet(subscription)
    await discovery.aclose()


def kinds_and_pids(events: list[DiscoveryEvent]) -> list[tuple[str, int, int]]:
    return [(event.type, event.metadata.uid.int, event.metadata.pid) for event in events]


async def test_subscribers_are_woken_at_once_rather_than_at_the_next_poll(tmp_path: Path) -> None:
    async def scenario() -> list[float]:
        subscriber = local(tmp_path, "bell", **SELDOM)
        other = local(tmp_path, "bell")
        subscription = subscriber.subscribe()
        await other.publisher.publish("worker-added", worker(1))
        await take(subscription, 1)
        delays = []
        for pid in range(1, 6):
            waiting = asyncio.create_task(take(subscription, 1))
            await parked(subscription._events, "_changed")  # it waits for the doorbell
            published = time.monotonic()
            await other.publisher.publish("worker-updated", worker(1, pid=pid))
            await waiting
            delays.append(time.monotonic() - published)
        for handle in (subscriber, other):
            await handle.aclose()
        return delays

    delays = sorted(await scenario())
    assert delays[2] < 1.0, delays


async def test_a_change_written_without_a_wake_up_is_noticed_by_polling(tmp_path: Path) -> None:
    async def scenario() -> float:
        discovery = local(tmp_path, "polled", **{**SELDOM, "poll_interval": 0.02})
        subscription = discovery.subscribe()
        await discovery.publisher.publish("worker-added", worker(1))
        await take(subscription, 1)
        waiting = asyncio.create_task(take(subscription, 1))
        await parked(subscription._events, "_changed")  # it waits for its next look
        written = time.monotonic()
        write_by_hand(discovery.path, [(worker(7).uid, encode_record(worker(7)))])
        assert kinds_and_pids(await waiting) == [("worker-added", 7, worker(7).pid)]
        noticed = time.monotonic() - written
        await discovery.aclose()
        return noticed

    assert await scenario() < 1.0


async def test_a_doorbell_left_by_a_dead_process_is_removed(tmp_path: Path) -> None:

    discovery = local(tmp_path, "stale")
    doorbells = discovery.path.with_suffix(".doorbells")
    doorbells.mkdir()
    os.mkfifo(doorbells / "4242-dead")
    (doorbells / "4243-file").write_bytes(b"")
    await discovery.publisher.publish("worker-added", worker(1))
    assert sorted(path.name for path in doorbells.iterdir()) == ["4243-file"]
    assert (doorbells / "4243-file").read_bytes() == b""
    await discovery.aclose()


async def test_a_closed_handle_ends_its_subscriptions_and_refuses_work(tmp_path: Path) -> None:

    # only the close itself can end the wait in time
    discovery = local(tmp_path, "closed", **SELDOM)
    other = local(tmp_path, "closed")
    subscription = discovery.subscribe()
    await other.publisher.publish("worker-added", worker(1))
    await take(subscription, 1)
    waiting = asyncio.ensure_future(anext(subscription))
    await parked(subscription._events, "_changed")
    await discovery.aclose()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(waiting, 2.0)
    await other.aclose()
    with pytest.raises(RuntimeError, match=r"LocalDiscovery\('closed'\) is closed"):
        discovery.subscribe()
    with pytest.raises(RuntimeError, match="is closed"):
        await discovery.publisher.publish("worker-added", worker(2))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"heartbeat": 0}, "heartbeat must be a positive, finite number of seconds, not 0"),
        ({"heartbeat": float("nan")}, "heartbeat must be .* not nan"),
        ({"liveness_timeout": -1}, "liveness_timeout must be .* not -1"),
        ({"poll_interval": "fast"}, "poll_interval must be .* not 'fast'"),
        ({"heartbeat": 1, "liveness_timeout": 1.5}, r"liveness_timeout=1.5 .* heartbeat=1"),
        ({"log_retention": 0}, "log_retention must be at least 1, not 0"),
        ({"log_retention": 2.5}, "log_retention must be an int, not 2.5"),
    ],
)
def test_bad_settings_are_refused_by_name(
    tmp_path: Path, settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        LocalDiscovery("ns", directory=tmp_path, **settings)


@pytest.mark.parametrize("namespace", ["", None])
def test_a_bad_namespace_is_refused(tmp_path: Path, namespace: Any) -> None:
    with pytest.raises(ValueError, match="namespace must be a non-empty str"):
        LocalDiscovery(namespace, directory=tmp_path)


async def test_namespaces_that_read_alike_get_distinct_stores(tmp_path: Path) -> None:

    slash, underscore = local(tmp_path, "team/a"), local(tmp_path, "team_a")
    long = local(tmp_path, "x" * 300)
    assert len({slash.path, underscore.path, long.path}) == 3
    assert all(handle.path.parent == tmp_path for handle in (slash, underscore, long))
    subscription = underscore.subscribe()
    await slash.publisher.publish("worker-added", worker(1))
    await underscore.publisher.publish("worker-added", worker(2))
    assert uids(await take(subscription, 1)) == {("worker-added", worker(2).uid)}
    assert await quiet(subscription)
    for handle in (slash, underscore, long):
        await handle.aclose()


async def test_the_default_directory_is_private_under_the_runtime_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    discovery = LocalDiscovery("default-dir")
    assert discovery.path.parent == tmp_path / "shardline"
    assert (tmp_path / "shardline").stat().st_mode & 0o777 == 0o700
    await discovery.aclose()

    (tmp_path / "shardline").chmod(0o777)
    with pytest.raises(PermissionError, match="writable by other users"):
        LocalDiscovery("default-dir")


# -- against a reference model ---------------------------------------------------------------

MARKER = 99
Operation = tuple[Any, ...]

# puts weighted up: the interesting histories have several publishers writing the same uids
KINDS = ["put"] * 5 + ["drop"] * 2 + ["close", "check", "subscribe"]


@st.composite
def operation(draw: st.DrawFn) -> Operation:
    kind = draw(st.sampled_from(KINDS))
    name = draw(st.sampled_from("ab"))
    n = draw(st.integers(0, 2))
    if kind == "put":
        # two versions, so that a republished record is often identical
        event = draw(st.sampled_from(["worker-added", "worker-updated"]))
        return (kind, name, n, draw(st.integers(0, 1)), event)
    if kind == "drop":
        return (kind, name, n)
    if kind == "close":
        return (kind, name)
    return (kind,)


operations = st.lists(operation(), min_size=10, max_size=40)


class View:
    """A subscriber's events applied to a dict, checking each is a real change."""

    def __init__(self, subscription: Subscription) -> None:
        self.subscription = subscription
        self.records: dict[uuid.UUID, WorkerMetadata] = {}

    async def catch_up(self, marker: WorkerMetadata) -> None:
        while self.records.get(marker.uid) != marker:
            event = (await take(self.subscription, 1))[0]
            before = self.records.get(event.metadata.uid)
            if event.type == "worker-added":
                assert before is None, event
                self.records[event.metadata.uid] = event.metadata
            elif event.type == "worker-updated":
                assert before is not None, event
                assert before != event.metadata, event
                self.records[event.metadata.uid] = event.metadata
            else:
                assert before == event.metadata, event
                del self.records[event.metadata.uid]


@pytest.fixture(scope="module")
def model_directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("model")


@settings(max_examples=60, deadline=None)
@given(operations)
def test_a_subscribers_view_follows_the_reference_model(
    model_directory: Path, ops: list[Operation]
) -> None:
    namespace = f"model-{uuid.uuid4().hex}"

    async def scenario() -> None:
        handles = {name: local(model_directory, namespace) for name in ("a", "b", "s")}
        model: dict[uuid.UUID, tuple[WorkerMetadata, str]] = {}
        views = [View(handles["s"].subscribe())]
        checks = 0

        async def check() -> None:
            nonlocal checks
            checks += 1
            marker = worker(MARKER, pid=checks)
            await handles["s"].publisher.publish("worker-updated", marker)
            model[marker.uid] = (marker, "s")
            expected = {uid: metadata for uid, (metadata, _) in model.items()}
            for view in views:
                await view.catch_up(marker)
                assert view.records == expected

        try:
            for op in ops:
                if op[0] == "put":
                    _, name, n, variant, kind = op
                    metadata = worker(n, address=f"10.0.0.{variant}:1")
                    await handles[name].publisher.publish(kind, metadata)
                    model[metadata.uid] = (metadata, name)
                elif op[0] == "drop":
                    await handles[op[1]].publisher.publish("worker-dropped", worker(op[2]))
                    model.pop(worker(op[2]).uid, None)
                elif op[0] == "close":
                    await handles[op[1]].publisher.aclose()
                    model = {uid: entry for uid, entry in model.items() if entry[1] != op[1]}
                elif op[0] == "check":
                    await check()
                elif len(views) < 3:
                    views.append(View(handles["s"].subscribe()))
            await check()
            for view in views:
                assert await quiet(view.subscription, 0.01)
        finally:
            for handle in handles.values():
                await handle.aclose()

    asyncio.run(scenario())


def test_threads_opening_a_new_namespace_together_all_open_it(tmp_path: Path) -> None:
    # Switching a new database to WAL needs an exclusive lock that SQLite does not wait for:
    # without the retry, about 1 in 20 of these rounds raised "database is locked".
    import threading

    from shardline.discovery.local_store import LocalStore

    for round_ in range(60):
        path = tmp_path / f"ns-{round_}.db"
        start = threading.Barrier(4)
        failures: list[BaseException] = []

        def open_store(
            path: Path = path,
            start: threading.Barrier = start,
            failures: list[BaseException] = failures,
        ) -> None:
            start.wait()
            try:
                LocalStore(path, "ns", log_retention=100).close()
            except BaseException as error:
                failures.append(error)

        threads = [threading.Thread(target=open_store) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert failures == [], f"round {round_}: {failures!r}"
