"""Rule 8: a full poll of a tier applied atomically with `apply_bucket_snapshot`."""

from __future__ import annotations

import json

import pytest

from shardline import BucketEvent, InvalidEvent, Topology
from support.replicasets import add_replicaset, names, rs_uuid
from support.replicasets import bucket_row as row

SEED_ROWS = [row(1, 1, 1000), row(2, 1001, 2000), row(3, 2001, 3000)]


@pytest.fixture
def seeded(topology: Topology) -> Topology:
    for n in (1, 2, 3):
        add_replicaset(topology, n)
    assert topology.apply_bucket_snapshot("default", SEED_ROWS)
    return topology


def test_snapshot_becomes_exactly_the_polled_ranges(seeded: Topology) -> None:
    assert seeded.apply_bucket_snapshot("default", [row(1, 1, 1500), row(3, 1501, 3000)])
    assert names(seeded) == [(1, 1500, "R1"), (1501, 3000, "R3")]


def test_vanished_ranges_are_gone(seeded: Topology) -> None:
    seeded.apply_bucket_snapshot("default", [row(2, 1001, 2000)])
    assert names(seeded) == [(1001, 2000, "R2")]


def test_ranges_early_in_a_poll_survive_a_later_overlap_with_the_old_map(seeded: Topology) -> None:
    # Applied one by one, the third row would overlap the old R3 range and clear R1's new range
    # applied just before: the reference driver's defect. A snapshot keeps the whole poll.
    seeded.apply_bucket_snapshot("default", [row(1, 1, 750), row(2, 751, 1500), row(3, 1501, 3000)])
    assert names(seeded) == [(1, 750, "R1"), (751, 1500, "R2"), (1501, 3000, "R3")]


def test_unordered_snapshot_is_sorted(seeded: Topology) -> None:
    seeded.apply_bucket_snapshot("default", list(reversed(SEED_ROWS)))
    assert names(seeded) == [(1, 1000, "R1"), (1001, 2000, "R2"), (2001, 3000, "R3")]


def test_unchanged_poll_changes_nothing_and_keeps_the_epoch(seeded: Topology) -> None:
    epoch = seeded.epoch("default")
    assert not seeded.apply_bucket_snapshot("default", [dict(r) for r in SEED_ROWS])
    assert seeded.epoch("default") == epoch


def test_snapshot_accepts_bucket_events(seeded: Topology) -> None:
    events = [BucketEvent("default", 1, 3000, rs_uuid(2))]
    assert seeded.apply_bucket_snapshot("default", events)
    assert names(seeded) == [(1, 3000, "R2")]
    assert seeded.epoch("default") == 2


def test_empty_snapshot_empties_the_map(seeded: Topology) -> None:
    assert seeded.apply_bucket_snapshot("default", [])
    assert seeded.ranges("default") == []


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ([row(1, 1, 1000), row(2, 1000, 2000)], "overlapping ranges"),
        ([row(1, 1, 1000), row(2, 1, 1000)], "overlapping ranges"),
        ([row(1, 1, 1000), row(2, 1001, 3001)], "3001"),
        ([row(1, 1, 1000), row(2, 1001, 2000, tier="other")], "'other'"),
        ([row(1, 1, 1000), {**row(2, 1001, 2000), "bucket_id_start": 0}], "bucket_id_start"),
        ([row(1, 1, 1000), {**row(2, 1001, 2000), "current_replicaset_uuid": "r2"}], "'r2'"),
        ([row(1, 1, 1000), BucketEvent("default", 1001, 2000, rs_uuid(2), op="delete")], "delete"),
        ([row(1, 1, 1000), "not a row"], "start"),
    ],
)
def test_bad_snapshot_is_rejected_whole_and_the_old_map_stays(
    seeded: Topology, bad: list[object], message: str
) -> None:
    before, epoch = seeded.ranges("default"), seeded.epoch("default")
    with pytest.raises(InvalidEvent, match=message):
        seeded.apply_bucket_snapshot("default", bad)
    assert seeded.ranges("default") == before
    assert seeded.epoch("default") == epoch


def test_from_row_reads_a_pico_bucket_row() -> None:
    event = BucketEvent.from_row({**row(1, 1, 1500), "current_replicaset_uuid": rs_uuid(1).upper()})
    assert event == BucketEvent("default", 1, 1500, rs_uuid(1), state="active")


@pytest.mark.parametrize(
    "missing", ["bucket_id_start", "bucket_id_end", "current_replicaset_uuid", "tier_name"]
)
def test_from_row_names_a_missing_field(missing: str) -> None:
    with pytest.raises(InvalidEvent, match=missing):
        BucketEvent.from_row({k: v for k, v in row(1, 1, 10).items() if k != missing})


def payload(rows: list[dict[str, object]]) -> str:
    """What `SELECT _pico_bucket(tier)` returns over pgwire: the rows as one JSON text."""
    return json.dumps(rows)


def test_snapshot_accepts_the_json_text_of_a_poll(topology: Topology) -> None:
    for n in (1, 2, 3):
        add_replicaset(topology, n)
    assert topology.apply_bucket_snapshot("default", payload(SEED_ROWS))
    assert names(topology) == [(1, 1000, "R1"), (1001, 2000, "R2"), (2001, 3000, "R3")]
    assert topology.apply_bucket_snapshot("default", payload(SEED_ROWS[:1]).encode())
    assert names(topology) == [(1, 1000, "R1")]


def test_unchanged_text_is_a_no_op(seeded: Topology) -> None:
    text = payload(SEED_ROWS)
    seeded.apply_bucket_snapshot("default", text)
    epoch = seeded.epoch("default")
    assert not seeded.apply_bucket_snapshot("default", "".join(text))
    assert seeded.epoch("default") == epoch


def test_same_text_after_a_clear_refills_the_map(seeded: Topology) -> None:
    text = payload(SEED_ROWS)
    seeded.apply_bucket_snapshot("default", text)
    add_replicaset(seeded, 4)  # a new replicaset clears the tier
    assert seeded.ranges("default") == []
    assert seeded.apply_bucket_snapshot("default", text)
    assert names(seeded) == [(1, 1000, "R1"), (1001, 2000, "R2"), (2001, 3000, "R3")]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[{", "not valid JSON"),
        ('{"bucket_id_start": 1}', "must be a JSON array, got dict"),
        (payload([row(1, 1, 1000), row(2, 900, 2000)]), "overlapping ranges"),
        (" " * (64 * 2**20 + 1), "over the limit"),
    ],
)
def test_bad_text_is_rejected_and_the_old_map_stays(
    seeded: Topology, text: str, message: str
) -> None:
    before, epoch = seeded.ranges("default"), seeded.epoch("default")
    with pytest.raises(InvalidEvent, match=message):
        seeded.apply_bucket_snapshot("default", text)
    assert seeded.ranges("default") == before
    assert seeded.epoch("default") == epoch


def test_clear_forgets_everything_but_the_tier_configuration_in_one_change(
    seeded: Topology,
) -> None:
    text = json.dumps(SEED_ROWS)
    assert not seeded.apply_bucket_snapshot("default", text)  # the same map, now remembered as text
    epoch, tiers = seeded.epoch("default"), seeded.tiers
    assert seeded.clear()
    assert (seeded.instances, seeded.replicasets) == ({}, {})
    assert seeded.ranges("default") == []
    assert seeded.route("default", "user:42") is None
    assert seeded.epoch("default") > epoch  # the map changed: decisions made on it are stale
    assert seeded.tiers == tiers
    assert not seeded.clear()  # nothing left to forget
    # the remembered poll text went with the map: the same text rebuilds it
    for n in (1, 2, 3):
        add_replicaset(seeded, n)
    assert seeded.apply_bucket_snapshot("default", text)
    assert seeded.owner("default", 1500) == rs_uuid(2)
    assert seeded.route("default", "user:42") is not None
