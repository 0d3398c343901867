"""The plugin's own tests: shardline's conformance kit, by class and by the registered name."""

from collections.abc import Callable

import pytest
from shardline_example_balancer import ShuffleLoadBalancer

from shardline.balancer_conformance import CHECKS
from shardline.balancers import balancer_names, create_balancer


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
def test_conforms(check: Callable[..., None]) -> None:
    check(ShuffleLoadBalancer)


def test_found_by_name() -> None:
    assert "example-shuffle" in balancer_names()
    assert isinstance(create_balancer("example-shuffle"), ShuffleLoadBalancer)


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
def test_conforms_by_name(check: Callable[..., None]) -> None:
    check(lambda: create_balancer("example-shuffle"))
