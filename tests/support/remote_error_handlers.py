"""Handlers whose errors the remote-error tests read on the caller, served by real worker
processes as ``support.remote_error_handlers:HANDLERS`` (``shardline worker --handlers`` run
from ``tests/``, or a ``LocalPool``). The other names are what bad ``--handlers`` values
point at."""

from __future__ import annotations

import os
from typing import Any

from shardline.transport import Handler

DEPTH_LIMIT = 400  # levels of `deep` at most: 800 frames, within the default recursion limit


async def echo(payload: Any) -> Any:
    return payload


async def whoami(payload: Any) -> int:
    return os.getpid()


def parse(payload: Any) -> int:
    """A sync handler (run on the server's threads) whose ``int()`` raises ``ValueError``."""
    return _parse_number(payload)


def _parse_number(text: Any) -> int:
    return int(text)


async def lookup(payload: Any) -> Any:
    """Raises ``KeyError(payload)``."""
    return {}[payload]


class Refused(Exception):
    """A handler's own exception, deriving from no built-in type but ``Exception``."""


async def refuse(payload: Any) -> None:
    raise Refused(f"refused {payload!r}")


class BadInput(ValueError):
    """A handler's own exception deriving from ``ValueError``."""


async def bad_input(payload: Any) -> None:
    raise BadInput(f"bad input {payload!r}")


async def wrapped(payload: Any) -> None:
    """A ``ValueError`` whose cause is a ``KeyError``."""
    try:
        {}[payload]
    except KeyError as error:
        raise ValueError(f"no entry {payload!r}") from error


async def deep(payload: Any) -> None:
    """Recurses ``payload`` levels through two functions in turn (so Python cannot fold the
    repeated frames), then raises ``ValueError("bottom of the recursion")``: a traceback of
    about 200 characters per level."""
    if not isinstance(payload, int) or not 0 <= payload <= DEPTH_LIMIT:
        raise TypeError(f"deep takes a depth from 0 to {DEPTH_LIMIT}, got {payload!r}")
    _down(payload)


def _down(depth: int) -> None:
    if depth == 0:
        raise ValueError("bottom of the recursion")
    _across(depth - 1)


def _across(depth: int) -> None:
    _down(depth)


HANDLERS: dict[str, Handler] = {
    "echo": echo,
    "whoami": whoami,
    "parse": parse,
    "lookup": lookup,
    "refuse": refuse,
    "bad-input": bad_input,
    "wrapped": wrapped,
    "deep": deep,
}

EMPTY: dict[str, Handler] = {}

NOT_CALLABLE: dict[str, Any] = {"echo": echo, "answer": 42}
