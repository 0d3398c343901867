"""What every fuzz target shares: the contract check, values a hostile peer could send, the
topology's observable state, and the atheris entry point.

A target reports a contract violation by letting an exception escape ``TestOneInput``: either an
exception type the parser does not document (it escapes on its own), or :class:`Violation`,
raised by the target's checks (state changed on rejection, accepted input that does not
round-trip). atheris then prints the traceback and libFuzzer saves the input as ``crash-*``.
"""

from __future__ import annotations

import math
import reprlib
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import atheris

# tests/ holds the reference model (topology_model.py), shared with the property tests.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# Instrumented here, before anything else imports them: atheris's coverage feedback comes from
# the Python parsers' branches (the Rust core is not instrumented).
with atheris.instrument_imports(include=["shardline"]):
    pass

from shardline import InvalidEvent, Topology, UnknownTier
from support.strategies import full_state


class Violation(AssertionError):
    """The input broke the parser's documented contract; the message says how."""


def show(value: Any) -> str:
    """A short repr for messages; safe on values nested past the recursion limit."""
    try:
        return reprlib.repr(value)
    except RecursionError:
        return f"<a {type(value).__name__} too deep to show>"


def check(condition: bool, message: str) -> None:
    if not condition:
        raise Violation(message)


# Good values, so that inputs get past the first checks, and hostile ones next to them.
UUIDS = [str(uuid.UUID(int=0xA000 + n)) for n in range(3)]
TIERS = ["t", "u"]
BUCKET_COUNTS = {"t": 3000, "u": 100}  # each of TIERS, for the targets that configure them
REFUSALS = (InvalidEvent, UnknownTier)  # what the topology may refuse a hostile input with
TEXT_EDGES: list[Any] = [
    "",
    "t",
    "u",
    "Online",
    "127.0.0.1:3301",
    "\ud800",  # a lone surrogate: a valid Python str that no UTF-8 encoder accepts
    "t\udfff",
    "\x00",
    "é" * 3,
    "x" * 1100,
    UUIDS[0].upper(),
    UUIDS[1].replace("-", ""),
    "{" + UUIDS[2] + "}",
    "urn:uuid:" + UUIDS[0],
    UUIDS[0][:-1] + "g",
]
INT_EDGES = [
    -(2**64),
    -(2**63),
    -1,
    0,
    1,
    2,
    40,
    2**31 - 1,
    2**31,
    2**32 - 1,
    2**32,
    2**63 - 1,
    2**63,
    2**64,
    10**30,
]
FLOAT_EDGES = [0.0, 1.0, 2.5, -1.0, math.nan, math.inf, -math.inf, 1e300]


def text(fdp: atheris.FuzzedDataProvider) -> str:
    """A str: mostly a known edge, sometimes arbitrary (surrogates included)."""
    choice = fdp.ConsumeIntInRange(0, 3)
    if choice == 0:
        return str(fdp.PickValueInList(UUIDS))
    if choice == 1:
        return str(fdp.PickValueInList(TIERS))
    if choice == 2:
        return str(fdp.PickValueInList(TEXT_EDGES))
    return str(fdp.ConsumeUnicode(fdp.ConsumeIntInRange(0, 40)))


def integer(fdp: atheris.FuzzedDataProvider) -> int:
    if fdp.ConsumeBool():
        return int(fdp.PickValueInList(INT_EDGES))
    return int(fdp.ConsumeIntInRange(0, 3001))


def value(fdp: atheris.FuzzedDataProvider, depth: int = 0) -> Any:
    """Any value a decoded document or a careless caller could hand over."""
    choice = fdp.ConsumeIntInRange(0, 10 if depth < 3 else 7)
    if choice == 0:
        return None
    if choice == 1:
        return fdp.ConsumeBool()
    if choice in (2, 3):
        return integer(fdp)
    if choice == 4:
        return float(fdp.PickValueInList(FLOAT_EDGES))
    if choice in (5, 6):
        return text(fdp)
    if choice == 7:
        return fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 8))
    if choice == 8:
        return [value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 3))]
    if choice == 9:
        return {text(fdp): value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 3))}
    return nested(fdp.ConsumeIntInRange(1, 3000))


def json_value(fdp: atheris.FuzzedDataProvider, depth: int = 0) -> Any:
    """A value ``json.loads`` can produce (NaN and lone surrogates included: it accepts both)."""
    choice = fdp.ConsumeIntInRange(0, 8 if depth < 3 else 5)
    if choice == 0:
        return None
    if choice == 1:
        return fdp.ConsumeBool()
    if choice == 2:
        return integer(fdp)
    if choice == 3:
        return float(fdp.PickValueInList(FLOAT_EDGES))
    if choice in (4, 5):
        return text(fdp)
    if choice == 6:
        return [json_value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 3))]
    if choice == 7:
        return {text(fdp): json_value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 3))}
    return nested(fdp.ConsumeIntInRange(1, 3000))


def nested(depth: int) -> Any:
    """A list nested ``depth`` deep, built without recursion."""
    inner: Any = []
    for _ in range(depth - 1):
        inner = [inner]
    return inner


def nested_text(data: bytes) -> bytes:
    """``data[1:]`` wrapped in ``data[0] * 100`` JSON arrays: nesting deep enough to break a
    recursive decoder, which byte-level mutation alone would take a very long time to find."""
    depth = data[0] * 100 if data else 0
    return b"[" * depth + data[1:] + b"]" * depth


def same(a: Any, b: Any) -> bool:
    """Equality in which NaN equals NaN, so a decoded NaN round-trips; iterative, since decoded
    documents can be nested deeper than Python's recursion limit."""
    pending = [(a, b)]
    while pending:
        x, y = pending.pop()
        if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
            continue
        if isinstance(x, dict) and isinstance(y, dict):
            if x.keys() != y.keys():
                return False
            pending.extend((x[k], y[k]) for k in x)
        elif isinstance(x, list | tuple) and isinstance(y, list | tuple):
            if type(x) is not type(y) or len(x) != len(y):
                return False
            pending.extend(zip(x, y, strict=True))
        elif type(x) is not type(y) or x != y:
            return False
    return True


def rejects_cleanly(
    topology: Topology,
    allowed: tuple[type[BaseException], ...],
    call: Callable[[], Any],
    what: str,
) -> tuple[bool, Any]:
    """Runs ``call`` (which reads outside input into ``topology``): ``(True, result)`` when it
    accepted; ``(False, error)`` when it raised one of ``allowed`` and left the topology exactly
    as it was. Any other exception escapes: an undocumented type is a violation in itself."""
    before = full_state(topology)
    try:
        return True, call()
    except allowed as error:
        after = full_state(topology)
        check(after == before, f"{what} rejected ({show(error)}) but changed {before} to {after}")
        return False, error


def main(test_one_input: Callable[[bytes], None]) -> None:
    """Runs the target under libFuzzer; the command line takes libFuzzer's flags and corpora."""
    atheris.Setup(sys.argv, atheris.instrument_func(test_one_input))
    atheris.Fuzz()
