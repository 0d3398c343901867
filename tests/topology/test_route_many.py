"""``route_many``'s fast paths (issue 12, section 3) answer exactly as ``route`` does, key by key,
and its ``out=`` form fills indices into a list of distinct routes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardline import BucketEvent, InvalidArgument, Topology, UnhashableKey
from support.replicasets import add_replicaset, rs_uuid
from support.vectors import PICODATA, key_part

INT64_MIN, INT64_MAX, UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1
# Every MessagePack int width starts or ends at one of these.
INT_EDGES = sorted(
    {
        edge + delta
        for edge in (0, 2**7, 2**8, 2**15, 2**16, 2**31, 2**32, 2**63, 2**64)
        for sign in (1, -1)
        for delta in (-1, 0, 1)
        for edge in [sign * edge]
    }
    | {-32, -33, INT64_MIN, UINT64_MAX}
)
INT_EDGES = [v for v in INT_EDGES if INT64_MIN <= v <= UINT64_MAX]
INT_DTYPES = ["i1", "u1", "<i2", ">u2", "i4", "u4", "<i8", ">i8", "u8", ">u8", "intp"]


def tier_with(count: int, cuts: list[int], gap: int | None = None) -> Topology:
    """A topology whose tier 'default' has `count` buckets in ranges split at `cuts`, owned in
    turn by 4 replicasets; the range holding bucket `gap`, if any, left unmapped."""
    topology = Topology()
    topology.apply_tiers({"default": count})
    for n in range(1, 5):
        add_replicaset(topology, n)
    starts = [1, *sorted(set(cuts))]
    ends = [cut - 1 for cut in starts[1:]] + [count]
    for index, (start, end) in enumerate(zip(starts, ends, strict=True)):
        if gap is None or not start <= gap <= end:
            topology.apply(BucketEvent("default", start, end, rs_uuid(index % 4 + 1)))
    return topology


def scalar(topology: Topology, keys: list[Any]) -> list[Any]:
    """The reference: `route`, one key at a time."""
    return [topology.route("default", key) for key in keys]


def via_out(topology: Topology, keys: Any, dtype: str = "intp") -> list[Any]:
    # A filler no index equals, so an item left unwritten shows.
    out = np.full(len(keys), np.iinfo(dtype).max, dtype=dtype)
    routes = topology.route_many("default", keys, out=out)
    assert len(routes) == len(set(map(id, routes)))  # each distinct route once
    return [routes[j] for j in out.tolist()]


@pytest.mark.parametrize("vector", PICODATA, ids=lambda v: f"{v['bucket_count']}-{v['bucket_id']}")
def test_every_picodata_vector_routes_to_its_bucket(vector: dict[str, Any]) -> None:
    """One range holds exactly the vector's bucket, so the route says which bucket the key hit."""
    count, bucket = vector["bucket_count"], vector["bucket_id"]
    parts = [key_part(part) for part in vector["key"]]
    key = parts[0] if len(parts) == 1 else tuple(parts)
    cuts = [c for c in (bucket, bucket + 1) if 1 < c <= count]
    topology = tier_with(count, cuts)
    hit = topology.find_bucket_master("default", bucket)
    keys = [key, key]
    assert topology.route_many("default", keys) == [hit, hit]
    assert via_out(topology, keys) == [hit, hit]
    if isinstance(key, int) and not isinstance(key, bool):
        for dtype in ("<i8", ">i8", "u8"):
            if np.iinfo(dtype).min <= key <= np.iinfo(dtype).max:
                array = np.array(keys, dtype=dtype)
                assert topology.route_many("default", array) == [hit, hit]
                assert via_out(topology, array) == [hit, hit]


@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_int_arrays_of_every_width_at_every_encoding_boundary(dtype: str) -> None:
    topology = tier_with(3000, list(range(2, 3000, 7)), gap=1500)
    info = np.iinfo(dtype)
    keys = [v for v in INT_EDGES if info.min <= v <= info.max]
    array = np.array(keys, dtype=dtype)
    want = scalar(topology, keys)
    assert None in want or len(keys) < 50
    assert topology.route_many("default", array) == want
    assert topology.route_many("default", array[::-1]) == want[::-1]
    assert via_out(topology, array) == want
    assert topology.route_many("default", keys) == want


bucket_counts = st.sampled_from([1, 2, 3, 7, 16, 3000, 30_000, 65_536, 2**20 + 3, 2**32 - 1])
ints = st.integers(INT64_MIN, UINT64_MAX) | st.sampled_from(INT_EDGES)
strs = st.text(max_size=48) | st.text(st.characters(max_codepoint=127), min_size=3, max_size=9)
mixed = ints | strs | st.booleans() | st.none() | st.tuples(strs, ints)


@st.composite
def tiers(draw: st.DrawFn) -> Topology:
    count = draw(bucket_counts)
    cuts = draw(st.lists(st.integers(2, max(2, count)), max_size=12)) if count > 1 else []
    gap = draw(st.none() | st.integers(1, count))
    return tier_with(count, [c for c in cuts if c <= count], gap)


@settings(max_examples=300, deadline=None)
@given(topology=tiers(), keys=st.lists(ints, max_size=300))
def test_int_keys_route_as_route_does(topology: Topology, keys: list[int]) -> None:
    want = scalar(topology, keys)
    assert topology.route_many("default", keys) == want
    assert via_out(topology, keys) == want
    if all(INT64_MIN <= k <= INT64_MAX for k in keys):
        array = np.array(keys, dtype=np.int64)
        assert topology.route_many("default", array) == want
        assert via_out(topology, array, "i4") == want
    if all(k >= 0 for k in keys):
        assert topology.route_many("default", np.array(keys, dtype=np.uint64)) == want


@settings(max_examples=300, deadline=None)
@given(topology=tiers(), keys=st.lists(strs, max_size=100))
def test_str_keys_route_as_route_does(topology: Topology, keys: list[str]) -> None:
    want = scalar(topology, keys)
    assert topology.route_many("default", keys) == want
    assert topology.route_many("default", tuple(keys)) == want
    assert via_out(topology, keys) == want


@settings(max_examples=200, deadline=None)
@given(topology=tiers(), keys=st.lists(mixed, max_size=100))
def test_mixed_keys_route_as_route_does(topology: Topology, keys: list[Any]) -> None:
    want = scalar(topology, keys)
    assert topology.route_many("default", keys) == want
    assert topology.route_many("default", iter(keys)) == want
    assert via_out(topology, keys) == want


def test_str_subclasses_and_surrogates_take_the_general_path() -> None:
    class Name(str):
        pass

    topology = tier_with(3000, list(range(2, 3000, 11)))
    keys = [Name("alice"), "alice", "ключ", "\U0001f600", ""]
    assert topology.route_many("default", keys) == scalar(topology, keys)
    with pytest.raises(UnhashableKey, match="surrogates"):
        topology.route_many("default", ["ok", "\ud800"])


def test_a_list_changed_while_its_keys_hash_is_read_as_its_iterator_would() -> None:
    """A key whose hashing runs Python code (an ``__index__``) shortens the list: the keys after
    the new end are not read, as iterating the list would not read them."""
    keys: list[Any] = []

    class Shrinking:
        def __index__(self) -> int:
            del keys[2:]
            return 5

    keys.extend(["a", Shrinking(), "c", "d"])
    topology = tier_with(3000, list(range(2, 3000, 11)))
    assert topology.route_many("default", keys) == scalar(topology, ["a", 5])


def test_a_list_subclass_is_read_through_its_own_iterator() -> None:
    class Reversed(list[Any]):
        def __iter__(self) -> Any:
            return reversed(list(super().__iter__()))

    topology = tier_with(3000, list(range(2, 3000, 11)))
    keys = Reversed(["a", "b", 3, "d"])
    assert topology.route_many("default", keys) == scalar(topology, list(iter(keys)))


# ---------------------------------------------------------------------------------------------
# out=


def test_out_holds_indices_into_the_distinct_routes_in_order_of_first_use() -> None:
    topology = tier_with(3000, [1001, 2001], gap=2500)
    keys = np.arange(200, dtype=np.int64)
    want = scalar(topology, keys.tolist())
    out = np.empty(len(keys), dtype=np.intp)
    routes = topology.route_many("default", keys, out=out)
    assert [routes[j] for j in out] == want
    firsts = list(dict.fromkeys(map(id, want)))
    assert [id(route) for route in routes] == firsts
    assert None in routes  # the unmapped range's keys
    assert out[0] == 0


@pytest.mark.parametrize("dtype", ["i4", "u4", "i8", "u8", ">i8", "<u4"])
def test_out_of_any_32_or_64_bit_integer_type_and_stride(dtype: str) -> None:
    topology = tier_with(3000, list(range(2, 3000, 5)))
    keys = [f"k{i}" for i in range(300)]
    want = scalar(topology, keys)
    assert via_out(topology, keys, dtype) == want
    wide = np.full(2 * len(keys), 99, dtype=dtype)
    routes = topology.route_many("default", keys, out=wide[::2])
    assert [routes[j] for j in wide[::2]] == want
    assert (wide[1::2] == 99).all()


@pytest.mark.parametrize(
    ("out", "message"),
    [
        (np.zeros(3, dtype=np.float64), "not 32- or 64-bit integers"),
        (np.zeros(3, dtype=np.int16), "not 32- or 64-bit integers"),
        (np.zeros((3, 1), dtype=np.int64), "not one-dimensional"),
        ([0, 0, 0], "no buffer"),
        (np.zeros(3, dtype=np.int64).view(np.int64)[:2], "one item per key"),
        (np.zeros(4, dtype=np.int64), "one item per key"),
    ],
)
def test_a_bad_out_raises_and_is_left_untouched(out: Any, message: str) -> None:
    topology = tier_with(3000, [1000])
    before = list(np.asarray(out).ravel()) if not isinstance(out, list) else list(out)
    with pytest.raises(InvalidArgument, match=message) as raised:
        topology.route_many("default", ["a", "b", "c"], out=out)
    assert "out" in str(raised.value)
    after = list(np.asarray(out).ravel()) if not isinstance(out, list) else list(out)
    assert after == before


def test_a_read_only_out_raises() -> None:
    out = np.zeros(2, dtype=np.int64)
    out.flags.writeable = False
    with pytest.raises(InvalidArgument, match="read-only"):
        tier_with(3000, [1000]).route_many("default", [1, 2], out=out)


def test_an_unhashable_key_leaves_out_untouched() -> None:
    out = np.full(3, 7, dtype=np.int64)
    with pytest.raises(UnhashableKey):
        tier_with(3000, [1000]).route_many("default", ["a", "b", ["no"]], out=out)
    assert out.tolist() == [7, 7, 7]


def test_out_may_be_the_key_array_itself() -> None:
    topology = tier_with(3000, list(range(2, 3000, 13)))
    keys = np.arange(-500, 500, dtype=np.int64)
    want = scalar(topology, keys.tolist())
    routes = topology.route_many("default", keys, out=keys)
    assert [routes[j] for j in keys] == want
