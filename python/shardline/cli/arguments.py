"""What the commands share in reading their command line: the parser whose usage errors are one
line and status 2, and the argument types."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, NoReturn

from shardline.balancers import create_balancer
from shardline.errors import InvalidArgument

if TYPE_CHECKING:
    from shardline.transport.serving import Handler

__all__ = [
    "CommandParser",
    "balancer_name_argument",
    "handlers_argument",
    "seconds_argument",
    "usage_error",
    "weight_argument",
    "whole_seconds_argument",
]


class CommandParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line on stderr and status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")


def usage_error(command: str, message: str) -> int:
    """Says what is wrong with the command line, in one line on stderr; returns status 2."""
    print(f"shardline {command}: error: {message}", file=sys.stderr)
    return 2


def seconds_argument(*, zero: bool) -> Callable[[str], float]:
    """An argument type: a finite number of seconds, positive (or also 0 with ``zero``)."""
    least = "0 or more" if zero else "above 0"

    def seconds(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
            raise argparse.ArgumentTypeError(
                f"must be a finite number of seconds, {least}, got {text!r}"
            )
        return value

    return seconds


def whole_seconds_argument(text: str) -> int:
    """An argument type: a whole number of seconds, at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of seconds: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 second, got {text!r}")
    return value


def weight_argument(text: str) -> int | float:
    """A positive, finite weight; an integer stays an int in the record."""
    try:
        weight: int | float = int(text)
    except ValueError:
        try:
            weight = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(weight) or weight <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive, finite number, got {text!r}")
    return weight


def balancer_name_argument(text: str) -> str:
    """A name that resolves to a balancer (one is made and dropped, to check it at parse time)."""
    try:
        create_balancer(text)
    except InvalidArgument as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def handlers_argument(text: str) -> Mapping[str, Handler]:
    """The handlers at ``MODULE:ATTRIBUTE``, loaded (see
    :func:`~shardline.transport.handlers_spec.load_handlers`: a mapping of names to callables)
    with the current directory first on ``sys.path``, as ``python -m`` has it, so a module
    beside the caller is found as it is by ``python -m shardline``; anything that does not
    load is an ``ArgumentTypeError`` saying why."""
    from shardline.transport.handlers_spec import HandlersSpecError, load_handlers

    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)
    try:
        return load_handlers(text)
    except HandlersSpecError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
