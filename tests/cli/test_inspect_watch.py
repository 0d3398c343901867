"""``shardline inspect --watch`` (issue 15, part 2): polls again and again and says what changed.
The change computation is a pure function checked against a per-bucket, per-member model; the
command runs end to end as a subprocess against a real PostgreSQL holding a Picodata-like
catalog, changed between polls, and ends with status 0 on SIGINT."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardline.cli import main
from shardline.cli.inspect_changes import changes_between, moved_ranges
from shardline.cli.inspect_watch import _Live
from support.interruptible import SHARDLINE
from support.pg_server import PgServer
from support.picodata_catalog import Catalog, name_uuid

pytestmark = pytest.mark.integration

READ_TIMEOUT = 30.0  # for a poll to show a change: generous, a loaded machine is slow


@pytest.fixture
def catalog(pg: PgServer) -> Iterator[Catalog]:
    with Catalog(pg.create_schema()) as catalog:
        with catalog.transaction():
            catalog.add_tier("default", 300)
            catalog.add_tier("other", 100)
            catalog.add_replicaset("r1", instances=2)
            catalog.add_replicaset("r2")
            catalog.add_replicaset("r3", "other")
            catalog.rebalance("default")
            catalog.rebalance("other")
        yield catalog


class Watch:
    """``shardline inspect DSN --watch …`` as a subprocess; ``lines()`` reads its stdout a line
    at a time (raising after READ_TIMEOUT without one); ``interrupt()`` sends SIGINT and
    returns the exit status and stderr."""

    def __init__(self, *args: str) -> None:
        env = dict(os.environ, COLUMNS="200")
        self.process = subprocess.Popen(
            [*SHARDLINE, "inspect", *args, "--watch"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    def line(self) -> str:
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], READ_TIMEOUT)
        assert ready, f"no output within {READ_TIMEOUT} s"
        line = self.process.stdout.readline()
        assert line, f"the watch ended: {self.process.wait()} {self.stderr()}"
        return line

    def stderr(self) -> str:
        assert self.process.stderr is not None
        return self.process.stderr.read()

    def interrupt(self) -> tuple[int, str]:
        self.process.send_signal(signal.SIGINT)
        status = self.process.wait(timeout=READ_TIMEOUT)
        return status, self.stderr()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def change_the_catalog(catalog: Catalog) -> None:
    """An instance goes offline, a replicaset joins tier default and takes buckets."""
    with catalog.transaction():
        catalog.set_state("r1_2", "Offline")
        catalog.add_replicaset("r4")
        catalog.rebalance("default")


def test_watch_json_writes_one_document_per_poll_with_the_changes(catalog: Catalog) -> None:
    watch = Watch(catalog.dsn, "--json", "--interval", "0.1")
    try:
        first = json.loads(watch.line())
        assert first["poll"] == 1
        assert first["changes"] is None
        assert first["complete"] is True
        assert set(first["epochs"]) == {"default", "other"}
        change_the_catalog(catalog)
        # a poll reads table by table, so one change may show over two polls: gather them
        # until a poll shows the whole new catalog
        seen: list[dict[str, Any]] = []
        r4 = name_uuid("r4")
        while True:
            document = json.loads(watch.line())
            seen.append(document)
            owners = {row["replicaset_uuid"] for row in document["bucket_ranges"]}
            if r4 in owners and any(i["state"] == "Offline" for i in document["instances"]):
                break
        assert [d["poll"] for d in seen] == list(range(2, len(seen) + 2))
        changes = [d["changes"] for d in seen]
        assert {r for c in changes for r in c["replicasets"]["added"]} == {r4}
        assert {i for c in changes for i in c["instances"]["added"]} == {name_uuid("r4_1")}
        assert [
            change
            for c in changes
            for change in c["instances"]["changed"]
            if change["key"] == name_uuid("r1_2")
        ] == [{"key": name_uuid("r1_2"), "fields": {"state": ["Online", "Offline"]}}]
        epochs = [c["epochs"] for c in changes if c["epochs"]]
        assert epochs
        assert all(set(e) == {"default"} for e in epochs)
        assert epochs[0]["default"][0] == first["epochs"]["default"]
        assert epochs[-1]["default"][1] == seen[-1]["epochs"]["default"]
        moved = [m for c in changes for m in c["moved_ranges"]]
        assert moved
        assert {m["tier"] for m in moved} == {"default"}
        assert any(m["to"] == r4 for m in moved)
        assert not any(c["tiers"]["added"] or c["tiers"]["removed"] for c in changes)
        # nothing changes afterwards: the next poll says so
        quiet = json.loads(watch.line())["changes"]
        assert quiet == changes_between(seen[-1], seen[-1]).to_json()
        status, err = watch.interrupt()
        assert status == 0
        assert "Traceback" not in err
    finally:
        watch.close()


def test_watch_plain_prints_each_poll_and_its_changes(catalog: Catalog) -> None:
    watch = Watch(catalog.dsn, "--plain", "--interval", "0.1")
    try:
        assert " ".join(watch.line().split()[:2]) == "poll 1"
        lines: list[str] = []
        while "changes: (first poll)\n" not in lines:
            lines.append(watch.line())
        with catalog.transaction():
            catalog.set_state("r1_2", "Offline")
        wanted = f"  instance {name_uuid('r1_2')} changed: state Online -> Offline\n"
        while wanted not in lines:
            lines.append(watch.line())
        status, err = watch.interrupt()
        assert status == 0
        assert "Traceback" not in err
    finally:
        watch.close()


def test_watch_on_a_terminal_is_a_live_view_that_highlights_changes(catalog: Catalog) -> None:
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [
            *SHARDLINE,
            "inspect",
            catalog.dsn,
            "--watch",
            "--interval",
            "0.1",
        ],
        stdin=terminal,
        stdout=terminal,
        stderr=subprocess.PIPE,
        env=dict(os.environ, COLUMNS="200", TERM="xterm-256color"),
    )
    os.close(terminal)
    seen = b""

    def read_until(text: bytes) -> None:
        nonlocal seen
        deadline = time.monotonic() + READ_TIMEOUT
        while text not in seen:
            left = deadline - time.monotonic()
            assert left > 0, f"{text!r} not shown within {READ_TIMEOUT} s: {seen[-2000:]!r}"
            ready, _, _ = select.select([controller], [], [], left)
            if ready:
                seen += os.read(controller, 65536)

    try:
        read_until(b"changes: (first poll)")
        with catalog.transaction():
            catalog.set_state("r1_2", "Offline")
        read_until(b"state Online -> Offline")
        assert b"\x1b[" in seen  # drawn with styles (colours), not plain text
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=READ_TIMEOUT) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(controller)


@pytest.mark.parametrize("interval", ["0", "-1", "nan", "inf", "soon"])
def test_a_bad_interval_is_a_usage_error(interval: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit:
        main(["inspect", "postgresql://nowhere/db", "--watch", "--interval", interval])
    assert exit.value.code == 2
    assert "--interval" in capsys.readouterr().err


def test_an_interval_without_watch_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "postgresql://nowhere/db", "--interval", "1"]) == 2
    assert capsys.readouterr().err == "shardline inspect: error: --interval needs --watch\n"


# The pure part: changes_between against a model.

KEYS = [f"k{n}" for n in range(4)]
BUCKETS = 12


def members(fields: dict[str, Any], key: str) -> Any:
    return st.dictionaries(st.sampled_from(KEYS), st.fixed_dictionaries(fields), max_size=4).map(
        lambda rows: [dict(row, **{key: k}) for k, row in sorted(rows.items())]
    )


owners = st.lists(st.sampled_from([None, "a", "b", "c"]), min_size=BUCKETS, max_size=BUCKETS)


def ranges_of(per_bucket: list[str | None], cuts: set[int]) -> list[tuple[int, int, str]]:
    """The runs of the same owner, 1-based, unmapped buckets left out; a run is also cut
    before each bucket in ``cuts`` (a catalog may hold neighbouring ranges of one owner)."""
    ranges: list[tuple[int, int, str]] = []
    for bucket, owner in enumerate(per_bucket, 1):
        if owner is None:
            continue
        last = ranges[-1] if ranges else None
        if last is not None and last[1] == bucket - 1 and last[2] == owner and bucket not in cuts:
            ranges[-1] = (last[0], bucket, owner)
        else:
            ranges.append((bucket, bucket, owner))
    return ranges


@st.composite
def snapshots(draw: st.DrawFn) -> dict[str, Any]:
    maps = draw(st.dictionaries(st.sampled_from(["t1", "t2"]), owners, max_size=2))
    cuts = draw(st.sets(st.integers(2, BUCKETS)))
    small = st.sampled_from([None, "x", "y"])
    return {
        "tiers": draw(members({"bucket_count": st.sampled_from([10, 20])}, "name")),
        "replicasets": draw(members({"name": small, "tier": small, "master_uuid": small}, "uuid")),
        "instances": draw(
            members(
                {
                    "name": small,
                    "replicaset_uuid": small,
                    "state": small,
                    "address": small,
                    "master": st.booleans(),
                },
                "uuid",
            )
        ),
        "epochs": draw(st.dictionaries(st.sampled_from(["t1", "t2"]), st.integers(0, 3))),
        "bucket_ranges": [
            {"tier": tier, "start": s, "end": e, "replicaset_uuid": o}
            for tier, per_bucket in sorted(maps.items())
            for s, e, o in ranges_of(per_bucket, cuts)
        ],
        "per_bucket": maps,
    }


def membership_model(before: list[dict[str, Any]], after: list[dict[str, Any]], key: str) -> Any:
    old = {row[key]: row for row in before}
    new = {row[key]: row for row in after}
    changed = {
        k: {f: (old[k][f], new[k][f]) for f in old[k] if f != key and old[k][f] != new[k][f]}
        for k in old.keys() & new.keys()
    }
    return (
        sorted(new.keys() - old.keys()),
        sorted(old.keys() - new.keys()),
        {k: fields for k, fields in changed.items() if fields},
    )


@settings(max_examples=300, deadline=None)
@given(before=snapshots(), after=snapshots())
def test_changes_between_agrees_with_a_model(before: dict[str, Any], after: dict[str, Any]) -> None:
    changes = changes_between(before, after)
    for part, key in (("tiers", "name"), ("replicasets", "uuid"), ("instances", "uuid")):
        got = getattr(changes, part)
        added, removed, changed = membership_model(before[part], after[part], key)
        assert list(got.added) == added
        assert list(got.removed) == removed
        assert {c.key: dict(c.fields) for c in got.changed} == changed
    epochs_before, epochs_after = before["epochs"], after["epochs"]
    assert dict(changes.epochs) == {
        tier: (epochs_before.get(tier), epochs_after.get(tier))
        for tier in epochs_before.keys() | epochs_after.keys()
        if epochs_before.get(tier) != epochs_after.get(tier)
    }
    # per bucket: a move is shown exactly where the owner differs, from and to the right ones
    model = {
        (tier, bucket): (was, now)
        for tier in before["per_bucket"].keys() | after["per_bucket"].keys()
        for bucket, (was, now) in enumerate(
            zip(
                before["per_bucket"].get(tier, [None] * BUCKETS),
                after["per_bucket"].get(tier, [None] * BUCKETS),
                strict=True,
            ),
            1,
        )
        if was != now
    }
    shown = {
        (m.tier, bucket): (m.before, m.after)
        for m in changes.moved
        for bucket in range(m.start, m.end + 1)
    }
    assert shown == model
    assert sum(m.end - m.start + 1 for m in changes.moved) == len(model)  # no overlap
    # maximal runs, in order: neighbours never carry the same move
    for a, b in zip(changes.moved, changes.moved[1:], strict=False):
        assert (a.tier, a.start) < (b.tier, b.start)
        if a.tier == b.tier and a.end + 1 == b.start:
            assert (a.before, a.after) != (b.before, b.after)
    assert bool(changes) == bool(
        changes.tiers or changes.replicasets or changes.instances or model or changes.epochs
    )
    assert not changes_between(after, after)
    assert changes_between(after, after).lines() == []


def test_moved_ranges_reads_as_a_person_would_say_it() -> None:
    moves = moved_ranges("t", [(1, 10, "a"), (11, 20, "b")], [(1, 5, "a"), (6, 20, "b")])
    assert [(m.start, m.end, m.before, m.after) for m in moves] == [(6, 10, "a", "b")]
    changes = changes_between(
        {"tiers": [], "replicasets": [], "instances": [], "epochs": {"t": 1}, "bucket_ranges": []},
        {
            "tiers": [],
            "replicasets": [],
            "instances": [],
            "epochs": {"t": 2},
            "bucket_ranges": [{"tier": "t", "start": 1, "end": 4, "replicaset_uuid": "a"}],
        },
    )
    assert changes.lines() == ["tier t epoch 1 -> 2", "tier t buckets 1-4 moved: unmapped -> a"]


def test_the_live_view_styles_added_and_changed_rows() -> None:
    before = {
        "tiers": [{"name": "t", "bucket_count": 10}],
        "replicasets": [{"uuid": "a", "name": None, "tier": "t", "master_uuid": "i1"}],
        "instances": [{"uuid": "i1", "state": "Online"}],
        "epochs": {"t": 1},
        "bucket_ranges": [{"tier": "t", "start": 1, "end": 10, "replicaset_uuid": "a"}],
    }
    after = {
        "tiers": [{"name": "t", "bucket_count": 10}],
        "replicasets": before["replicasets"]
        + [{"uuid": "b", "name": None, "tier": "t", "master_uuid": None}],
        "instances": [{"uuid": "i1", "state": "Offline"}],
        "epochs": {"t": 2},
        "bucket_ranges": [
            {"tier": "t", "start": 1, "end": 5, "replicaset_uuid": "a"},
            {"tier": "t", "start": 6, "end": 10, "replicaset_uuid": "b"},
        ],
    }
    styles = _Live.row_styles(_Live.__new__(_Live), after, changes_between(before, after))
    assert styles == [
        [_Live.CHANGED],  # the tier's epoch moved
        [None, _Live.ADDED],
        [_Live.CHANGED],
        [None, _Live.CHANGED],
    ]
