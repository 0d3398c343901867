"""An argument of the wrong type is an ``InvalidArgumentType``: a ``TypeError`` as Python's own
checks raise, and still the ``InvalidArgument`` (a ``ValueError``) it was, so every existing
``except`` keeps working. A value of the right type out of its range stays a ``ValueError``
only. Checked on the Rust core's arguments and on the Python checks the library shares."""

from __future__ import annotations

import array
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from shardline import InvalidArgument, InvalidArgumentType, Topology, bucket_id
from shardline.checks import check_count, check_seconds
from support.replicasets import add_replicaset

WRONG_TYPES = [1.0, "1", None, True, b"1", [1]]
OUT_OF_RANGE = [-1, 2**32, 2**64, np.uint64(2**32)]


@pytest.fixture(scope="module")
def topology() -> Topology:
    topology = Topology()
    topology.apply_tiers({"default": 3000})
    add_replicaset(topology, 1)
    return topology


def calls(topology: Topology) -> dict[str, Callable[[Any], object]]:
    """Each place the core reads a bucket id or count, taking the value to read."""
    return {
        "owner": lambda v: topology.owner("default", v),
        "find_bucket_master": lambda v: topology.find_bucket_master("default", v),
        "owners": lambda v: topology.owners("default", [1, v]),
        "bucket_id count": lambda v: bucket_id("key", v),
    }


def assert_wrong_type(error: BaseException) -> None:
    assert isinstance(error, InvalidArgumentType)
    assert isinstance(error, TypeError)
    assert isinstance(error, InvalidArgument)
    assert isinstance(error, ValueError)


@pytest.mark.parametrize(
    ("bad", "wrong_type"),
    [(bad, True) for bad in WRONG_TYPES] + [(bad, False) for bad in OUT_OF_RANGE],
    ids=repr,
)
@pytest.mark.parametrize("where", ["owner", "find_bucket_master", "owners", "bucket_id count"])
def test_a_bucket_id_or_count_of_another_type_is_also_a_type_error_one_out_of_range_is_not(
    topology: Topology, where: str, bad: Any, wrong_type: bool
) -> None:
    with pytest.raises(InvalidArgument, match="must be an int from") as raised:
        calls(topology)[where](bad)
    if wrong_type:
        assert_wrong_type(raised.value)
    else:
        assert not isinstance(raised.value, TypeError)


@pytest.mark.parametrize(
    "values",
    [np.array([1.0, 2.0]), np.array([True]), array.array("d", [1.0]), memoryview(np.array([1.0]))],
    ids=["float array", "bool array", "array.array of doubles", "memoryview of doubles"],
)
def test_an_array_of_other_items_than_integers_is_also_a_type_error(
    topology: Topology, values: Any
) -> None:
    with pytest.raises(TypeError) as raised:
        topology.owners("default", values)
    assert_wrong_type(raised.value)


def test_an_array_of_the_wrong_shape_is_a_value_error_only(topology: Topology) -> None:
    with pytest.raises(InvalidArgument, match="one-dimensional") as raised:
        topology.owners("default", np.ones((2, 2), dtype=np.int64))
    assert not isinstance(raised.value, TypeError)


@pytest.mark.parametrize(
    "out",
    [[0, 0], np.zeros(2, dtype=np.float64), np.zeros(2, dtype=np.int16)],
    ids=["list", "float64", "int16"],
)
def test_an_out_of_another_type_is_also_a_type_error(topology: Topology, out: Any) -> None:
    with pytest.raises(TypeError, match="out must be") as raised:
        topology.route_many("default", ["a", "b"], out=out)
    assert_wrong_type(raised.value)


def test_an_out_of_the_right_type_but_unusable_is_a_value_error_only(topology: Topology) -> None:
    read_only = np.zeros(2, dtype=np.int64)
    read_only.flags.writeable = False
    for out in (read_only, np.zeros((2, 1), dtype=np.int64), np.zeros(3, dtype=np.int64)):
        with pytest.raises(InvalidArgument) as raised:
            topology.route_many("default", ["a", "b"], out=out)
        assert not isinstance(raised.value, TypeError)


@pytest.mark.parametrize(
    ("bad", "wrong_type"),
    [("1", True), (None, True), (True, True), ([1], True), (0, False), (-1, False)],
)
@pytest.mark.parametrize("check", [check_seconds, check_count], ids=lambda c: c.__name__)
def test_the_shared_checks_call_another_type_a_type_error_and_a_number_out_of_range_not(
    check: Callable[[str, object], object], bad: Any, wrong_type: bool
) -> None:
    with pytest.raises(ValueError, match="timeout must be") as raised:
        check("timeout", bad)
    if wrong_type:
        assert_wrong_type(raised.value)
    else:
        assert not isinstance(raised.value, TypeError)
