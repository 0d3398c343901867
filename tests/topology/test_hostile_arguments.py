"""Hostile arguments: out-of-range bucket ids and counts, arrays of every form, rows that are not
objects. Each is either answered exactly as the same values in a plain list would be, or rejected
with a documented error (``InvalidArgument``, ``InvalidEvent``) naming the value."""

from __future__ import annotations

import array
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardline import (
    BucketEvent,
    InvalidArgument,
    InvalidEvent,
    ShardlineError,
    Topology,
    UnhashableKey,
    bucket_id,
)
from support.replicasets import add_replicaset, rs_uuid

U32_MAX = 2**32 - 1
SCHEMES = ["picodata", "vshard-strcrc32", "vshard-mpcrc32"]
# Every integer dtype, in native and in explicit non-native byte order.
INT_DTYPES = [
    np.dtype(f"{order}{code}")
    for code in ("i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8")
    for order in ("<", ">")
]


@pytest.fixture(scope="module")
def routed() -> Topology:
    """Buckets 1..2999 of "default" mapped in three ranges; 3000 and above unmapped. Shared by
    the module's tests (and Hypothesis examples), which only read it."""
    topology = Topology()
    topology.apply_tiers({"default": 3000})
    for n in (1, 2, 3):
        add_replicaset(topology, n)
    for n, (start, end) in zip((1, 2, 3), [(1, 1000), (1001, 2000), (2001, 2999)], strict=True):
        topology.apply(BucketEvent("default", start, end, rs_uuid(n)))
    return topology


def raised(call: Callable[[], Any]) -> tuple[type[BaseException], str] | None:
    """The type and message of what `call` raises, or None if it returns."""
    try:
        call()
    except Exception as error:
        return type(error), str(error)
    return None


def answer(call: Callable[[], Any]) -> Any:
    """What `call` returns, or the type and message of what it raises."""
    outcome = raised(call)
    return call() if outcome is None else outcome


# ---------------------------------------------------------------------------------------------
# One bucket id, one bucket count

BAD_IDS = [-1, 2**32, 2**64, -(2**63) - 1, True, False, 1.0, "1", None, np.uint64(2**32)]


@pytest.mark.parametrize("bad", BAD_IDS, ids=repr)
@pytest.mark.parametrize("method", ["owner", "find_bucket_master"])
def test_a_bad_bucket_id_raises_invalid_argument_naming_it(
    routed: Topology, method: str, bad: Any
) -> None:
    with pytest.raises(InvalidArgument, match=f"bucket_id .*got {re.escape(repr(bad))}") as info:
        getattr(routed, method)("default", bad)
    assert isinstance(info.value, ShardlineError)
    assert isinstance(info.value, ValueError)


def test_bucket_ids_at_the_ends_of_the_range_are_looked_up(routed: Topology) -> None:
    assert routed.owner("default", 0) is None
    assert routed.owner("default", U32_MAX) is None
    assert routed.find_bucket_master("default", U32_MAX) is None
    assert routed.owner("default", np.int64(1)) == rs_uuid(1)
    assert routed.owner("default", np.uint8(1)) == rs_uuid(1)


BAD_COUNTS = [-1, 0, 2**32, 2**64, True, False, 3000.0, "3000", None]


@pytest.mark.parametrize("bad", BAD_COUNTS, ids=repr)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_bad_bucket_count_raises_invalid_argument_naming_it(scheme: str, bad: Any) -> None:
    with pytest.raises(InvalidArgument, match=f"bucket_count .*got {re.escape(repr(bad))}"):
        bucket_id("k", bad, scheme=scheme)


@given(key=st.one_of(st.text(), st.integers(-(2**63), 2**64 - 1)))
def test_bucket_counts_at_the_ends_of_the_range_hash(key: str | int) -> None:
    assert bucket_id(key, 1) == 1
    assert 1 <= bucket_id(key, U32_MAX) <= U32_MAX
    assert bucket_id(key, np.int64(3000)) == bucket_id(key, 3000)


@given(key=st.one_of(st.text(), st.integers(-(2**63), 2**64 - 1)))
def test_topology_bucket_id_is_the_function_at_the_largest_count(key: str | int) -> None:
    topology = Topology()
    topology.apply_tiers({"wide": U32_MAX})
    assert topology.bucket_id("wide", key) == bucket_id(key, U32_MAX)


@pytest.mark.parametrize("bad", [2**64, -(2**63) - 1])
def test_topology_bucket_id_rejects_an_int_key_out_of_range_as_unhashable(
    routed: Topology, bad: int
) -> None:
    with pytest.raises(UnhashableKey, match=str(bad)):
        routed.bucket_id("default", bad)


# ---------------------------------------------------------------------------------------------
# Many bucket ids: lists, tuples, arrays


def in_dtype(values: list[int], dtype: np.dtype[Any]) -> bool:
    info = np.iinfo(dtype)
    return all(info.min <= v <= info.max for v in values)


@pytest.mark.parametrize("bad", [-1, 2**32, 2**64, True, 2.0, "7", None], ids=repr)
@pytest.mark.parametrize("container", [list, tuple, iter], ids=["list", "tuple", "iterator"])
def test_a_bad_id_in_a_sequence_raises_naming_it_and_its_position(
    routed: Topology, container: Callable[[list[Any]], Any], bad: Any
) -> None:
    ids = container([1, 1500, bad, 5])
    with pytest.raises(InvalidArgument, match=rf"bucket_ids\[2\] .*got {re.escape(repr(bad))}"):
        routed.owners("default", ids)


@pytest.mark.parametrize(
    ("dtype", "bad"),
    [
        (dtype, bad)
        for dtype in INT_DTYPES
        for bad in (-1, -128, 2**32, 2**63 - 1, 2**64 - 1)
        if in_dtype([bad], dtype)
    ],
    ids=str,
)
def test_a_bad_id_in_an_array_raises_naming_it_and_its_position(
    routed: Topology, dtype: np.dtype[Any], bad: int
) -> None:
    ids = np.array([1, 2, bad, 4], dtype=dtype)
    with pytest.raises(InvalidArgument, match=rf"bucket_ids\[2\] .*got {bad}"):
        routed.owners("default", ids)


def array_forms(values: list[int], dtype: np.dtype[Any]) -> dict[str, Any]:
    """The same values as arrays laid out in every way an exporter may lay them out."""
    base = np.array(values, dtype=dtype)
    padded = np.zeros(3 * len(values), dtype=dtype)
    padded[::3] = values
    reverse = np.array(values[::-1], dtype=dtype)
    unaligned = np.frombuffer(b"\0" + base.tobytes(), dtype=dtype, offset=1)
    forms = {
        "contiguous": base,
        "strided": padded[::3],
        "reversed": reverse[::-1],
        "unaligned": unaligned,
        "column of a 2-D array": np.ascontiguousarray(np.stack([base, base], axis=1))[:, 1],
        "memoryview": memoryview(base),
    }
    if dtype.isnative and dtype.char in "bBhHiIlLqQ":
        forms["array.array"] = array.array(dtype.char, values)
    return forms


ids_strategy = st.lists(
    st.one_of(st.integers(0, 3100), st.integers(-(2**63), 2**64 - 1)), max_size=12
)


@given(ids=ids_strategy, dtype=st.sampled_from(INT_DTYPES))
def test_owners_of_any_array_form_equals_owners_of_the_list(
    routed: Topology, ids: list[int], dtype: np.dtype[Any]
) -> None:
    ids = [v for v in ids if in_dtype([v], dtype)]
    expected = answer(lambda: routed.owners("default", ids))
    assert answer(lambda: routed.owners("default", tuple(ids))) == expected
    for form, values in array_forms(ids, dtype).items():
        assert answer(lambda v=values: routed.owners("default", v)) == expected, form
    if not isinstance(expected, tuple):
        assert expected == [answer(lambda v=v: routed.owner("default", v)) for v in ids]


def test_owners_of_a_float_or_bool_array_rejects_the_first_element(routed: Topology) -> None:
    with pytest.raises(InvalidArgument, match=r"bucket_ids\[0\] .*1\.0"):
        routed.owners("default", np.array([1.0, 2.0]))
    with pytest.raises(InvalidArgument, match=r"bucket_ids\[0\] .*True"):
        routed.owners("default", np.array([True]))
    with pytest.raises(InvalidArgument, match=r"bucket_ids\[0\] .*1\.0"):
        routed.owners("default", array.array("d", [1.0]))


def test_owners_of_an_object_array_reads_its_elements(routed: Topology) -> None:
    assert routed.owners("default", np.array([1, 1500], dtype=object)) == [rs_uuid(1), rs_uuid(2)]
    with pytest.raises(InvalidArgument, match=r"bucket_ids\[1\] .*got -1$"):
        routed.owners("default", np.array([1, -1], dtype=object))


# ---------------------------------------------------------------------------------------------
# Many keys: route_many over arrays

keys_strategy = st.lists(st.integers(-(2**63), 2**64 - 1), max_size=12)


@given(keys=keys_strategy, dtype=st.sampled_from(INT_DTYPES))
def test_route_many_of_any_array_form_equals_route_many_of_the_list(
    routed: Topology, keys: list[int], dtype: np.dtype[Any]
) -> None:
    keys = [k for k in keys if in_dtype([k], dtype)]
    expected = routed.route_many("default", keys)
    assert expected == [routed.route("default", k) for k in keys]
    for form, values in array_forms(keys, dtype).items():
        assert routed.route_many("default", values) == expected, form


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
def test_route_many_of_a_long_array_equals_route_many_of_the_list(
    routed: Topology, dtype: np.dtype[Any]
) -> None:
    # Longer than the chunks an array is read in (256), and not a multiple of them.
    info = np.iinfo(dtype)
    rng = np.random.default_rng(7)
    keys = [
        int(k)
        for k in rng.integers(
            info.min, info.max, size=1001, dtype=dtype.newbyteorder("="), endpoint=True
        )
    ]
    expected = routed.route_many("default", keys)
    for form, values in array_forms(keys, dtype).items():
        assert routed.route_many("default", values) == expected, form
    ids = [k % 3100 for k in keys] + [-1 if info.min < 0 else 2**32]
    if in_dtype(ids, dtype):
        with pytest.raises(InvalidArgument, match=r"bucket_ids\[1001\] "):
            routed.owners("default", np.array(ids, dtype=dtype))


def test_a_big_endian_array_routes_like_its_values(routed: Topology) -> None:
    keys = list(range(-200, 200))
    big = np.array(keys, dtype=">i8")
    assert routed.route_many("default", big) == routed.route_many("default", keys)
    buckets = [routed.bucket_id("default", k) for k in keys]
    assert routed.owners("default", np.array(buckets, dtype=">i8")) == routed.owners(
        "default", buckets
    )


def test_route_many_of_bytes_routes_each_byte_as_an_int(routed: Topology) -> None:
    assert routed.route_many("default", b"\x00\x7f\xff") == routed.route_many(
        "default", [0, 127, 255]
    )


def test_route_many_of_a_float_array_routes_its_floats(routed: Topology) -> None:
    floats = [0.5, 1.0, -3.0, 1e300]
    assert routed.route_many("default", np.array(floats)) == routed.route_many("default", floats)


@pytest.mark.parametrize(
    "view",
    [
        memoryview(np.array([1.0], dtype=">f8")),
        memoryview(np.zeros(2, dtype=[("a", "i8")])),
        memoryview(np.array([1.0])),
    ],
    ids=["big-endian float", "struct", "float"],
)
def test_a_memoryview_of_other_items_than_integers_is_rejected(
    routed: Topology, view: memoryview
) -> None:
    fmt = re.escape(repr(view.format))
    with pytest.raises(InvalidArgument, match=f"keys must be a memoryview of integers.*{fmt}"):
        routed.route_many("default", view)
    with pytest.raises(InvalidArgument, match=f"bucket_ids must be a memoryview .*{fmt}"):
        routed.owners("default", view)


NOT_ONE_DIMENSIONAL = {
    "3x3 int64": np.arange(9, dtype=np.int64).reshape(3, 3),
    "1x3 int32": np.arange(3, dtype=np.int32).reshape(1, 3),
    "3x1 big-endian": np.arange(3, dtype=">i8").reshape(3, 1),
    "transposed": np.arange(6, dtype=np.int64).reshape(2, 3).T,
    "2x2x2 uint8": np.zeros((2, 2, 2), dtype=np.uint8),
    "0x3": np.zeros((0, 3), dtype=np.int64),
    "3x3 float": np.zeros((3, 3)),
    "2x2 object": np.array([[1, 2], [3, 4]], dtype=object),
    "2-D memoryview": memoryview(np.zeros((2, 2), dtype=np.int64)),
}


@pytest.mark.parametrize("values", NOT_ONE_DIMENSIONAL.values(), ids=NOT_ONE_DIMENSIONAL.keys())
def test_an_array_that_is_not_one_dimensional_is_rejected(routed: Topology, values: Any) -> None:
    shape = re.escape(str(tuple(np.asarray(values).shape)))
    with pytest.raises(InvalidArgument, match=f"keys must be one-dimensional.*{shape}"):
        routed.route_many("default", values)
    with pytest.raises(InvalidArgument, match=f"bucket_ids must be one-dimensional.*{shape}"):
        routed.owners("default", values)


# ---------------------------------------------------------------------------------------------
# BucketEvent.from_row of anything

ROW = {
    "tier_name": "default",
    "bucket_id_start": 1,
    "bucket_id_end": 10,
    "current_replicaset_uuid": rs_uuid(1),
    "target_replicaset_uuid": None,
    "state": "active",
}


@pytest.mark.parametrize(
    "row",
    [5, "xy", None, [], [("tier_name", "default")], list(ROW.items()), True, 1.5, b"{}"],
    ids=repr,
)
def test_from_row_of_a_non_object_raises_invalid_event(row: Any) -> None:
    with pytest.raises(InvalidEvent, match="must be a dict"):
        BucketEvent.from_row(row)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
# Values that make a field valid often enough for whole rows to pass.
field_values = st.one_of(
    json_values,
    st.integers(-2, 2**32 + 1),
    st.sampled_from(["default", "", "active", rs_uuid(1), rs_uuid(2).upper()]),
)
rows = st.one_of(
    json_values,
    st.fixed_dictionaries({}, optional={name: field_values for name in ROW}),
    st.builds(
        lambda row, extra: {**row, **extra},
        st.just(ROW),
        st.dictionaries(st.sampled_from(list(ROW)), field_values),
    ),
)


@given(row=rows)
def test_from_row_of_any_json_value_is_an_event_or_invalid_event(row: Any) -> None:
    try:
        event = BucketEvent.from_row(row)
    except InvalidEvent:
        return
    assert isinstance(row, dict)
    assert (event.tier, event.start, event.end, event.state) == (
        row["tier_name"],
        row["bucket_id_start"],
        row["bucket_id_end"],
        row["state"],
    )
    assert event.current_replicaset_uuid == row["current_replicaset_uuid"].lower()
    assert 1 <= event.start <= event.end <= U32_MAX
