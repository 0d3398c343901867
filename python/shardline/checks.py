"""Checks of numeric arguments shared across the library, each raising ``ValueError`` that names
the argument and the value it refuses (:class:`~shardline.errors.InvalidArgumentType`, also a
``TypeError``, when the value is not a number at all)."""

from __future__ import annotations

import math

from shardline.errors import InvalidArgumentType

__all__ = ["check_count", "check_seconds"]


def check_seconds(name: str, value: object, *, zero: bool = False) -> float:
    """``value`` as a float if it is a finite number of seconds above 0 (or also 0 when
    ``zero``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgumentType(_seconds_message(name, value, zero))
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        raise ValueError(_seconds_message(name, value, zero))
    return float(value)


def _seconds_message(name: str, value: object, zero: bool) -> str:
    sign = "non-negative" if zero else "positive"
    return f"{name} must be a {sign}, finite number of seconds, not {value!r}"


def check_count(name: str, value: object) -> int:
    """``value`` if it is an int of at least 1."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentType(f"{name} must be an int >= 1, not {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be an int >= 1, not {value!r}")
    return value
