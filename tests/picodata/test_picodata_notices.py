"""``shardline.picodata.query_metadata``: a notice's message read into a statement's routing.

Any text a server sends as a notice is read without raising (the listener runs on asyncpg's
callbacks: a bad document must not end anything), and a PreparedStatementMetadata document
(``src/pgproto/backend/storage.rs``) routes an execution by the arguments it names, each read as
its oid's type, against a small reference model.
"""

from __future__ import annotations

import datetime
import decimal
import json
import uuid
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from shardline import bucket_id
from shardline.picodata.query_metadata import UNKEYED, metadata_supported, read_notice

TIERS = {"default": 3000, "cold": 300, "arbiter": 0}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
documents = st.fixed_dictionaries(
    {"query": st.text(max_size=20)},
    optional={
        "type": st.just("PreparedStatementMetadata"),
        "tier": st.sampled_from([None, "default", "cold", "arbiter", "nowhere"]) | json_values,
        "dk_meta": st.lists(
            st.lists(st.integers(-2, 70000) | json_values, min_size=0, max_size=3), max_size=4
        )
        | json_values,
    },
)

# the reference: what each oid reads an argument as (None: not routable)
EXAMPLES: dict[int, list[tuple[Any, Any]]] = {
    20: [(7, 7), (-(2**63), -(2**63)), (True, None), (7.0, None), ("7", None)],
    25: [("user:1", "user:1"), ("", ""), (1, None), (b"x", None)],
    1700: [
        (decimal.Decimal("1.50"), decimal.Decimal("1.50")),
        (5, decimal.Decimal(5)),
        (5.0, None),
    ],
    701: [(2.5, 2.5), (3, 3.0), (decimal.Decimal(1), None)],
    16: [(True, True), (1, None)],
    2950: [
        (uuid.UUID(int=9), uuid.UUID(int=9)),
        (str(uuid.UUID(int=9)), uuid.UUID(int=9)),
        ("not a uuid", None),
    ],
    1184: [
        (datetime.datetime(2026, 1, 2, tzinfo=datetime.UTC),) * 2,
        (datetime.datetime(2026, 1, 2), None),  # naive: Picodata's datetime has a zone
    ],
}


@given(st.text(max_size=60) | json_values.map(json.dumps) | documents.map(json.dumps))
def test_any_notice_text_is_read_without_raising(text: str) -> None:
    found = read_notice(text, TIERS, "default")
    if found is not None:
        query, routing = found
        assert isinstance(query, str)
        assert routing is UNKEYED or (routing.positions and TIERS[routing.tier] > 0)


@given(
    st.lists(st.sampled_from(sorted(EXAMPLES)), min_size=1, max_size=3),
    st.data(),
    st.sampled_from([None, "default", "cold"]),
)
def test_a_document_routes_by_the_typed_arguments_it_names(
    oids: list[int], data: st.DataObject, tier: str | None
) -> None:
    width = len(oids) + 2
    numbers = data.draw(st.permutations(range(1, width + 1)))[: len(oids)]
    pairs = [data.draw(st.sampled_from(EXAMPLES[oid])) for oid in oids]
    args: list[Any] = ["filler"] * width
    for number, (given_value, _) in zip(numbers, pairs, strict=True):
        args[number - 1] = given_value
    text = json.dumps(
        {
            "type": "PreparedStatementMetadata",
            "query": "q",
            "tier": tier,
            "dk_meta": [[n, oid] for n, oid in zip(numbers, oids, strict=True)],
        }
    )
    found = read_notice(text, TIERS, "default")
    assert found is not None
    query, routing = found
    assert (query, routing.tier) == ("q", tier or "default")
    assert routing.positions == tuple(n - 1 for n in numbers)
    expected = [read for _, read in pairs]
    values = routing.values(args)
    if any(read is None for read in expected):
        assert values is None
        return
    key = expected[0] if len(expected) == 1 else tuple(expected)
    assert values == key
    assert [type(v) for v in (values if len(expected) > 1 else (values,))] == [
        type(v) for v in expected
    ]
    assert bucket_id(values, 3000) == bucket_id(key, 3000)
    assert routing.values(args[: max(numbers) - 1]) is None  # too few arguments


def test_what_a_document_cannot_route_is_unkeyed() -> None:
    def routing_of(**document: Any) -> Any:
        found = read_notice(json.dumps({"query": "q", **document}), TIERS, "default")
        assert found is not None
        return found[1]

    assert routing_of(dk_meta=[]) is UNKEYED  # Picodata cannot compute the bucket
    assert routing_of(dk_meta=[[1, 20]], tier="arbiter") is UNKEYED  # no buckets
    assert routing_of(dk_meta=[[1, 20]], tier="nowhere") is UNKEYED
    assert routing_of(dk_meta=[[1, 114]]) is UNKEYED  # json: not a type a key part is read as
    assert routing_of(dk_meta=[[0, 20]]) is UNKEYED
    assert routing_of(dk_meta=[[True, 20]]) is UNKEYED
    assert read_notice("NOTICE:  table t created", TIERS, "default") is None
    assert read_notice('{"dk_meta": []}', TIERS, "default") is None  # no query


def test_metadata_comes_with_picodata_26_1() -> None:
    assert metadata_supported(["26.1.1", "26.2.0-rc1", "27.0.0"])
    assert not metadata_supported(["26.1.1", "25.5.0"])
    assert not metadata_supported([])
    assert not metadata_supported(["unknown"])
