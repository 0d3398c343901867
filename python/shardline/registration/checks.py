"""Checks of the arguments the registration API shares, each raising ``ValueError`` naming the
value it refuses (the same messages from every store)."""

from __future__ import annotations

import re
from collections.abc import Collection

from shardline.checks import refusal
from shardline.errors import InvalidArgumentType

__all__ = ["check_owner", "check_service", "check_services", "check_text"]

_SURROGATE = re.compile("[\ud800-\udfff]")


def check_text(name: str, value: str | None) -> None:
    """Refuses a str ``value`` holding a surrogate code point: it is not Unicode text, so no
    store could keep it as UTF-8 and give back the same str."""
    if value is not None and _SURROGATE.search(value):
        raise ValueError(
            f"{name} must be Unicode text, got {value!r} (it holds a surrogate code point)"
        )


def check_service(service: object) -> str:
    """``service`` if it is a non-empty str of Unicode text."""
    if not isinstance(service, str) or not service:
        raise refusal(service, str)(f"service must be a non-empty str, got {service!r}")
    check_text("service", service)
    return service


def check_owner(owner: object) -> str | None:
    """``owner`` if it is a str of Unicode text or None."""
    if owner is not None and not isinstance(owner, str):
        raise InvalidArgumentType(f"owner must be a str or None, got {owner!r}")
    check_text("owner", owner)
    return owner


def check_services(services: object) -> tuple[str, ...]:
    """The names in ``services`` in the order given, each once. A bare str is refused: it is a
    collection of characters, never what the caller meant."""
    if isinstance(services, str | bytes) or not isinstance(services, Collection):
        raise InvalidArgumentType(
            f"services must be a collection of service names, got {services!r}"
        )
    names = tuple(dict.fromkeys(check_service(service) for service in services))
    if not names:
        raise ValueError("services must name at least one service, got none")
    return names
