"""IPv6 loopback for the tests: whether this machine has it, and the mark that skips a test that
needs it where it does not. The tests only ever use ``::1``, never another IPv6 address."""

from __future__ import annotations

import socket

import pytest

LOOPBACK = "::1"


def _has_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind((LOOPBACK, 0))
    except OSError:
        return False
    return True


requires_ipv6 = pytest.mark.skipif(
    not _has_loopback(), reason="this machine has no IPv6 loopback: ::1 cannot be bound"
)
"""Skips a test that needs ``::1`` when this machine has no IPv6 (a kernel without it, or a
container started with IPv6 turned off)."""
