"""``route_many`` of a list of str keys reads each key through the list's own reference (issue 12,
goal "route_many list of str"): the keys' reference counts are untouched, every kind of str
routes as ``route`` does, and a str it cannot read raises as before."""

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
