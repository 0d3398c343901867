"""``route_many`` of a list of str keys reads each key through the list's own reference (issue 12,
goal "route_many list of str"): the keys' reference counts are untouched, every kind of str
routes as ``route`` does, and a str it cannot read raises as before. The strs are hashed in
batches, side by side (``rust/core/src/hashing/str_lanes.rs``): keys of every UTF-8 length, on
either side of the lanes' bounds (4 and 43 bytes), in batches cut short by keys of other types,
route as ``route`` hashes them one at a time."""

from __future__ import annotations

import sys
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardline import (
    BucketEvent,
    InstanceEvent,
    ReplicasetEvent,
    Topology,
    UnhashableKey,
)


def mapped_topology() -> Topology:
    """Tier 'default' of 3,000 buckets in 30 ranges, owned in turn by three replicasets."""
    topology = Topology()
    topology.apply_tiers({"default": 3000})
    for n in range(3):
        replicaset, master = str(uuid.UUID(int=0xA0 + n)), str(uuid.UUID(int=0xB0 + n))
        topology.apply(ReplicasetEvent("replace", replicaset, tier="default"))
        topology.apply(
            InstanceEvent("replace", master, replicaset_uuid=replicaset, current_state="Online")
        )
        topology.apply(ReplicasetEvent("replace", replicaset, current_master_uuid=master))
    for start in range(1, 3001, 100):
        owner = str(uuid.UUID(int=0xA0 + start // 100 % 3))
        topology.apply(BucketEvent("default", start, start + 99, owner))
    return topology


def fresh(text: str) -> str:
    """An equal str built at run time: a new object, whose UTF-8 CPython has not cached yet."""
    return "".join(list(text))


def test_the_keys_reference_counts_are_untouched() -> None:
    topology = mapped_topology()
    keys = [fresh(f"user:{n}") for n in range(50)] + [fresh(f"ключ-{n}") for n in range(50)]
    before = [sys.getrefcount(key) for key in keys]
    routes = topology.route_many("default", keys)
    assert [sys.getrefcount(key) for key in keys] == before
    assert routes == [topology.route("default", key) for key in keys]
    assert None not in routes


def test_a_str_with_lone_surrogates_after_readable_ones_raises_naming_it() -> None:
    topology = mapped_topology()
    keys = ["ok", fresh("ключ"), fresh("bad\ud800")]
    before = [sys.getrefcount(key) for key in keys]
    with pytest.raises(UnhashableKey, match="surrogates") as raised:
        topology.route_many("default", keys)
    assert "bad" in str(raised.value)
    del raised  # the error refers to the key
    assert [sys.getrefcount(key) for key in keys] == before


class Text(str):
    """A str subclass: read through the general path, not in place."""


keys_of_every_kind = st.lists(
    st.one_of(
        st.text(max_size=40),
        st.text(max_size=40).map(fresh),
        st.text(max_size=10).map(Text),
        st.integers(-(2**63), 2**64 - 1),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(keys=keys_of_every_kind)
def test_every_kind_of_key_routes_as_route_does(keys: list[Any]) -> None:
    topology = mapped_topology()
    assert topology.route_many("default", keys) == [topology.route("default", k) for k in keys]


@st.composite
def strs_of_any_length(draw: st.DrawFn) -> str:
    """0 to 60 characters of 1, 2, 3 or 4 UTF-8 bytes each: 0 to 240 bytes."""
    width = draw(st.sampled_from([127, 0x7FF, 0xFFFF, 0x10FFFF]))
    chars = st.characters(max_codepoint=width, exclude_categories=("Cs",))
    text = draw(st.text(chars, min_size=0, max_size=60))
    return fresh(text) if draw(st.booleans()) else text


batches_of_strs = st.lists(
    st.one_of(
        strs_of_any_length(),
        strs_of_any_length(),
        strs_of_any_length(),
        st.integers(-(2**63), 2**64 - 1),
        strs_of_any_length().map(Text),
    ),
    max_size=300,
)


@settings(max_examples=300, deadline=None)
@given(keys=batches_of_strs)
def test_strs_hashed_in_batches_route_as_route_does(keys: list[Any]) -> None:
    topology = mapped_topology()
    assert topology.route_many("default", keys) == [topology.route("default", k) for k in keys]


@settings(max_examples=100, deadline=None)
@given(keys=st.lists(strs_of_any_length(), min_size=1, max_size=200), data=st.data())
def test_a_lone_surrogate_anywhere_in_a_batch_raises_naming_it(
    keys: list[str], data: st.DataObject
) -> None:
    topology = mapped_topology()
    at = data.draw(st.integers(0, len(keys)), label="at")
    bad = fresh("bad\udc80key")
    keys.insert(at, bad)
    before = sys.getrefcount(bad)
    with pytest.raises(UnhashableKey, match="surrogates") as raised:
        topology.route_many("default", keys)
    assert "bad" in str(raised.value)
    del raised  # the error refers to the key
    assert sys.getrefcount(bad) == before
