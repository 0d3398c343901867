"""Checks of numeric arguments shared across the library, each raising ``ValueError`` that names
the argument and the value it refuses (:class:`~shardline.errors.InvalidArgumentType`, also a
``TypeError``, when the value is not of the argument's type)."""

from __future__ import annotations

import math

from shardline.errors import InvalidArgumentType

__all__ = ["check_count", "check_seconds", "refusal"]


def refusal(value: object, expected: type | tuple[type, ...]) -> type[ValueError]:
    """The class of the error that refuses ``value`` for an argument of type ``expected``:
    :class:`~shardline.errors.InvalidArgumentType` when ``value`` is not of that type (a bool
    is no number here, unless ``expected`` is ``bool``), else ``ValueError`` (the right type,
    a value outside what the argument takes)::

        if not isinstance(name, str) or not name:
            raise refusal(name, str)(f"name must be a non-empty str, got {name!r}")
    """
    wrong_bool = isinstance(value, bool) and expected is not bool
    return InvalidArgumentType if wrong_bool or not isinstance(value, expected) else ValueError


def check_seconds(name: str, value: object, *, zero: bool = False) -> float:
    """``value`` as a float if it is a finite number of seconds above 0 (or also 0 when
    ``zero``)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
        or (value == 0 and not zero)
    ):
        sign = "non-negative" if zero else "positive"
        raise refusal(value, (int, float))(
            f"{name} must be a {sign}, finite number of seconds, not {value!r}"
        )
    return float(value)


def check_count(name: str, value: object) -> int:
    """``value`` if it is an int of at least 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise refusal(value, int)(f"{name} must be an int >= 1, not {value!r}")
    return value
