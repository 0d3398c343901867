"""The poll text of `_pico_bucket` read in Rust: same rows and answers as the dict rows, strict
JSON, bounded memory on hostile text, and a changed poll read once (`BucketPayload`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardline import InvalidEvent, Topology
from shardline.topology.sources import BucketPayload, BucketSnapshot, PollingSource, apply_change
from shardline.topology.sources import polling as polling_module
from support.picodata_catalog import Catalog
from support.polling import run_polled, seed_tier, started
from support.replicasets import add_replicaset, rs_uuid
from support.replicasets import bucket_row as row

COUNT = 3000


SEED = [row(1, 1, 1000), row(2, 1001, 2000), row(3, 2001, 3000)]


def seeded() -> Topology:
    topology = Topology()
    topology.apply_tiers({"default": COUNT, "other": COUNT})
    for n in (1, 2, 3):
        add_replicaset(topology, n)
    assert topology.apply_bucket_snapshot("default", SEED)
    return topology


# the same answers as the dict rows

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=4,
)
BAD_BOUNDS = st.sampled_from([0, -1, 3001, 2**32 - 1, 2**32, 2**64, True, 1.0, 2.5, "7", None])
FIELDS = ["bucket_id_start", "bucket_id_end", "current_replicaset_uuid", "tier_name"]


@st.composite
def polls(draw: st.DrawFn) -> list[Any]:
    """A poll of tier "default": a partition of its buckets (some ranges left out), shuffled,
    with now and then one defect: a bad field, a missing one, an overlap, a non-object row."""
    cuts = sorted(draw(st.sets(st.integers(1, COUNT - 1), max_size=5)))
    bounds = zip([1] + [cut + 1 for cut in cuts], [*cuts, COUNT], strict=True)
    rows: list[Any] = [
        row(draw(st.integers(1, 3)), start, end)
        for start, end in bounds
        if draw(st.integers(0, 4))  # a range now and then absent
    ]
    if rows and draw(st.booleans()):
        target = rows[draw(st.integers(0, len(rows) - 1))]
        target[draw(st.text(max_size=6))] = draw(JSON_VALUES)  # an extra field, skipped
    defect = draw(
        st.sampled_from(["none", "none", "bound", "missing", "value", "uuid", "overlap", "row"])
    )
    if rows and defect != "none":
        at = draw(st.integers(0, len(rows) - 1))
        field = draw(st.sampled_from(FIELDS))
        if defect == "bound":
            rows[at][draw(st.sampled_from(FIELDS[:2]))] = draw(BAD_BOUNDS)
        elif defect == "missing":
            del rows[at][field]
        elif defect == "value":
            rows[at][field] = draw(JSON_VALUES | st.sampled_from(["", "other", "Default"]))
        elif defect == "uuid":
            owner = rows[at]["current_replicaset_uuid"]
            rows[at]["current_replicaset_uuid"] = draw(
                st.sampled_from(
                    [owner.upper(), owner.replace("-", ""), "{" + owner + "}", owner[:-1]]
                )
            )
        elif defect == "overlap":
            rows.append(
                dict(rows[at], bucket_id_end=COUNT, bucket_id_start=rows[at]["bucket_id_end"])
            )
        else:
            rows[at] = draw(JSON_VALUES.filter(lambda value: not isinstance(value, dict)))
    return draw(st.permutations(rows))


def outcome(topology: Topology, apply: Any, *args: Any) -> tuple[Any, ...]:
    try:
        result: Any = apply(*args)
    except Exception as error:  # the class is compared, whatever it is
        result = type(error)
    return result, topology.ranges("default"), topology.epoch("default")


@given(st.lists(polls(), min_size=1, max_size=4), st.booleans(), st.booleans())
def test_text_answers_as_the_rows_do(
    sequence: list[list[Any]], as_bytes: bool, with_count: bool
) -> None:
    by_rows, by_text, by_payload = seeded(), seeded(), seeded()

    def via_payload(text: str | bytes) -> bool:
        payload = BucketPayload("default", text, COUNT if with_count else None)
        return by_payload.apply_bucket_snapshot("default", payload)

    for poll in sequence:
        text: str | bytes = json.dumps(poll)
        if as_bytes:
            text = text.encode()
        expected = outcome(by_rows, by_rows.apply_bucket_snapshot, "default", poll)
        assert outcome(by_text, by_text.apply_bucket_snapshot, "default", text) == expected
        assert outcome(by_payload, via_payload, text) == expected
        assert expected[0] in (True, False, InvalidEvent)


# hostile text: InvalidEvent, and the map stays

GOOD = json.dumps(row(1, 1, 10))[:-1]  # a valid row, open for one more field


def apply_as(topology: Topology, text: str | bytes, form: str) -> bool:
    if form == "payload":
        return topology.apply_bucket_snapshot("default", BucketPayload("default", text, COUNT))
    return topology.apply_bucket_snapshot("default", text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[" + "{}," * 100_000 + "{}]", "has no field 'bucket_id_start'"),
        ("[" * 20_000 + "]" * 20_000, "must be a dict, got a list"),
        ("[" + '{"a":' * 20_000 + "1" + "}" * 20_001 + "]", "recursion limit"),
        ("[" + GOOD + ', "x": ' + "[" * 200 + "]" * 200 + "}]", "recursion limit"),
        (json.dumps([row(1, 1, 10, tier="\ud800")]), "hex escape"),
        (json.dumps([row(1, 1, 10, state="\udc00")]), "hex escape"),
        ('[{"tier_name": "\\ud800x"}]', "hex escape"),
        ("[" + GOOD + ', "\\ud800": 1}]', "hex escape"),
        ("{}", "must be a JSON array, got dict"),
        ("5", "must be a JSON array, got int"),
        ('"[]"', "must be a JSON array, got str"),
        ("null", "must be a JSON array, got NoneType"),
        ("true", "must be a JSON array, got bool"),
        ("[5]", "must be a dict, got 5"),
        ('["x"]', "must be a dict, got 'x'"),
        (json.dumps([row(1, 1, 10, tier_name=5)]), "field 'tier_name' must be a str, got 5"),
        (json.dumps([row(1, 1, 10, current_replicaset_uuid=5)]), "must be a UUID string, got 5"),
        (json.dumps([row(1, "1", 10)]), r"must be a bucket id \(an int >= 1\), got '1'"),
        (json.dumps([row(1, None, 10)]), "got None"),
        (json.dumps([row(1, 1, 2**32)]), "got 4294967296"),
        (json.dumps([row(1, 1, 2**64)]), "field 'bucket_id_end' must be a bucket id"),
        (json.dumps([row(1, 1, 10**400)]), "number out of range"),
        (json.dumps([row(1, -1, 10)]), "got -1"),
        (json.dumps([row(1, 0, 10)]), "got 0"),
        (json.dumps([row(1, 1, 10.0)]), "got 10.0"),
        (json.dumps([row(1, 1, 1e3)]), "got 1000.0"),
        (json.dumps([row(1, True, 10)]), "got True"),
        (json.dumps([row(1, 1, 3001)]), "exceeds the bucket_count 3000"),
        (json.dumps([row(1, 5, 1)]), "start 5 is greater than end 1"),
        (json.dumps([row(1, 1, 10, tier="other")]), "holds a range of tier 'other'"),
        (json.dumps([row(1, 1, 10, tier="")]), "'tier_name' must not be empty"),
        (json.dumps([row(1, 1, 10), row(2, 5, 20)]), "overlapping ranges"),
        ("[" + GOOD + ', "bucket_id_start": 2}]', "'bucket_id_start' twice"),
        ("[" + GOOD + ', "bucket_id_end": 10}]', "'bucket_id_end' twice"),
        ("[" + GOOD + ', "state": NaN}]', "not valid JSON"),
        ("[" + GOOD + "}] x", "not valid JSON: trailing characters"),
        ("", "not valid JSON"),
    ],
)
@pytest.mark.parametrize("form", ["str", "bytes", "payload"])
def test_hostile_text_is_invalid_and_changes_nothing(text: str, message: str, form: str) -> None:
    topology = seeded()
    before, epoch = topology.ranges("default"), topology.epoch("default")
    given: Any = text.encode("utf-8", "surrogatepass") if form == "bytes" else text
    with pytest.raises(InvalidEvent, match=message):
        apply_as(topology, given, form)
    assert (topology.ranges("default"), topology.epoch("default")) == (before, epoch)


@pytest.mark.parametrize(
    "text",
    [
        "[" + GOOD + ', "tier_name": "\ud800"}]',  # a surrogate in the str itself, not escaped
        '[{"x": "\udfff"}]',
    ],
)
def test_a_str_holding_a_lone_surrogate_is_invalid(text: str) -> None:
    topology = seeded()
    with pytest.raises(InvalidEvent, match="lone surrogate"):
        topology.apply_bucket_snapshot("default", text)
    with pytest.raises(InvalidEvent, match="lone surrogate"):
        BucketPayload("default", text)
    assert topology.ranges("default") == [
        (s, e, rs_uuid(n)) for n, s, e in [(1, 1, 1000), (2, 1001, 2000), (3, 2001, 3000)]
    ]


@pytest.mark.parametrize(
    "text", [b"[" + b"\xff" + b"]", b'[{"tier_name": "\xc3"}]', b"\xff\xfe[\x00]\x00"]
)
def test_bytes_must_be_utf8(text: bytes) -> None:
    topology = seeded()
    with pytest.raises(InvalidEvent, match="not valid JSON"):
        topology.apply_bucket_snapshot("default", text)


@pytest.mark.parametrize("text", ["x" * (64 * 2**20 + 1), b"x" * (64 * 2**20 + 1)])
def test_the_64_mib_cap_holds_for_str_bytes_and_payloads(text: str | bytes) -> None:
    with pytest.raises(InvalidEvent, match="over the limit of 67108864"):
        seeded().apply_bucket_snapshot("default", text)
    with pytest.raises(InvalidEvent, match="over the limit of 67108864"):
        BucketPayload("default", text)


def test_what_json_accepts_around_the_rows_is_accepted() -> None:
    topology = seeded()
    text = (
        '\n [ {"bucket_id_start": 1, "bucket\\u005fid_end": 10, "tier_name": "def\\u0061ult",'
        ' "x": 1, "x": [1, {"y": 1e300}, -0.5, null, true], "z": "\\ud83d\\ude00",'
        f' "current_replicaset_uuid": "{rs_uuid(2).upper()}"}} ] \n'
    )
    assert topology.apply_bucket_snapshot("default", text)
    assert topology.ranges("default") == [(1, 10, rs_uuid(2))]
    assert topology.apply_bucket_snapshot("default", b"\xef\xbb\xbf[]")  # as json.loads does
    assert topology.ranges("default") == []
    with pytest.raises(InvalidEvent, match="not valid JSON"):  # json.loads refuses it in a str
        topology.apply_bucket_snapshot("default", "\ufeff[]")


# BucketPayload


def test_a_payload_is_read_once_and_applies_like_its_text() -> None:
    text = json.dumps(list(reversed(SEED)))
    payload = BucketPayload("default", text, COUNT)
    assert (payload.tier, payload.text, len(payload)) == ("default", text, 3)
    assert repr(payload) == "<BucketPayload of tier default: 3 ranges>"
    first, second = Topology(), Topology()
    for topology in (first, second):
        topology.apply_tiers({"default": COUNT, "other": COUNT})
        assert topology.apply_bucket_snapshot("default", payload)
        assert topology.ranges("default") == [
            (s, e, rs_uuid(n)) for n, s, e in [(1, 1, 1000), (2, 1001, 2000), (3, 2001, 3000)]
        ]
    epoch = first.epoch("default")
    assert not first.apply_bucket_snapshot("default", payload)
    # the payload's text and the text itself are the same poll: either one is recognised
    assert not first.apply_bucket_snapshot("default", "".join(text))
    assert not first.apply_bucket_snapshot("default", BucketPayload("default", "".join(text)))
    assert first.epoch("default") == epoch


def test_a_payload_of_another_tier_is_refused() -> None:
    topology = seeded()
    before, epoch = topology.ranges("default"), topology.epoch("default")
    payload = BucketPayload("other", "[]")
    with pytest.raises(
        InvalidEvent, match="snapshot of tier 'default' holds a range of tier 'other'"
    ):
        topology.apply_bucket_snapshot("default", payload)
    assert (topology.ranges("default"), topology.epoch("default")) == (before, epoch)


def test_a_payload_beyond_the_topology_bucket_count_is_refused() -> None:
    payload = BucketPayload("default", json.dumps([row(1, 1, 5000)]))  # no count to check against
    topology = seeded()
    with pytest.raises(InvalidEvent, match="bucket range end 5000 exceeds the bucket_count 3000"):
        topology.apply_bucket_snapshot("default", payload)
    with pytest.raises(InvalidEvent, match="bucket range end 5000 exceeds the bucket_count 3000"):
        BucketPayload("default", payload.text, COUNT)


@pytest.mark.parametrize(
    ("tier", "text", "message"),
    [
        ("", "[]", "must not be empty"),
        ("\ud800", "[]", "valid unicode"),
        ("t", 5, "str or bytes, got int"),
    ],
)
def test_a_payload_needs_a_tier_and_a_text(tier: str, text: Any, message: str) -> None:
    with pytest.raises(InvalidEvent, match=message):
        BucketPayload(tier, text)


# memory

PEAK_MEMORY = Path(__file__).parent.parent / "support" / "poll_peak_memory.py"


def measure(path: Path, form: str) -> tuple[str, int]:
    """``(outcome, extra bytes at the peak)`` of a fresh process applying the text in ``path``."""
    done = subprocess.run(
        [sys.executable, "-P", PEAK_MEMORY, path, form],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    outcome, extra, _seconds = done.stdout.split()
    return outcome, int(extra)


def valid_rows(size: int, *, last: str = "") -> bytes:
    """About ``size`` bytes of one-bucket rows of tier "t", then ``last`` as a final row."""
    one = (
        '{"bucket_id_start": %d, "bucket_id_end": %d, "current_replicaset_uuid":'
        ' "00000000-0000-0000-0000-00000000a00%d", "target_replicaset_uuid":'
        ' "00000000-0000-0000-0000-00000000a00%d", "state": "active", "tier_name": "t"}'
    )
    rows = [one % (n, n, n % 8, n % 8) for n in range(1, size // len(one) + 1)]
    return ("[" + ", ".join([*rows, *([last] if last else [])]) + "]").encode()


@pytest.mark.parametrize(
    ("name", "make", "expected"),
    [
        ("empty objects", lambda size: b"[" + b"{}," * (size // 3) + b"{}]", "rejected"),
        ("valid but the last row", lambda size: valid_rows(size, last="{}"), "rejected"),
        ("valid", valid_rows, "applied"),
    ],
)
@pytest.mark.parametrize("form", ["str", "bytes"])
@pytest.mark.integration  # a child interpreter
def test_a_poll_costs_at_most_four_times_its_size(
    tmp_path: Path, name: str, make: Any, expected: str, form: str
) -> None:
    data = make(16 << 20)
    path = tmp_path / "poll.json"
    path.write_bytes(data)
    outcome, extra = measure(path, form)
    assert outcome == expected
    assert extra <= 4 * len(data), (
        f"{name}: {extra / 2**20:.0f} MiB for {len(data) / 2**20:.0f} MiB"
    )


# PollingSource


async def test_polling_reads_a_changed_map_once_and_an_unchanged_one_never(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[str] = []
    real = polling_module.BucketPayload

    def counted(tier: str, text: str | bytes, bucket_count: int | None = None) -> BucketPayload:
        reads.append(tier)
        return real(tier, text, bucket_count)

    monkeypatch.setattr(polling_module, "BucketPayload", counted)
    seed_tier(catalog, 2)

    async def scenario(topology: Topology, source: PollingSource) -> None:
        await started(source)
        assert await source.refresh()
        assert reads == ["default"]
        assert await source.refresh()  # nothing changed
        assert reads == ["default"]
        with catalog.transaction():
            catalog.add_replicaset("r3", "default", uuid=rs_uuid(3))
            catalog.rebalance("default")
        assert await source.refresh()
        assert reads == ["default", "default"]
        assert len(topology.ranges("default")) == 3

    await run_polled(catalog.dsn, scenario)


def test_a_payload_in_a_bucket_snapshot_applies_without_reading_again() -> None:
    topology = seeded()
    payload = BucketPayload("default", json.dumps(SEED[:1]))
    assert apply_change(topology, BucketSnapshot("default", payload)) == 1
    assert topology.ranges("default") == [(1, 1000, rs_uuid(1))]
    assert apply_change(topology, BucketSnapshot("default", payload)) == 0
