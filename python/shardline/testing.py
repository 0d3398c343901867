"""The balancer conformance kit under the name the README first gave it: everything here is
:mod:`shardline.balancer_conformance`'s, which says what each check proves."""

from shardline.balancer_conformance import (
    CHECKS,
    check_balancer,
    check_concurrent_calls,
    check_ends_after_success,
    check_no_repeats,
    check_offers_every_worker,
    check_workers_leaving,
)

__all__ = [
    "CHECKS",
    "check_balancer",
    "check_concurrent_calls",
    "check_ends_after_success",
    "check_no_repeats",
    "check_offers_every_worker",
    "check_workers_leaving",
]
