"""The rich console the commands draw their tables on."""

from __future__ import annotations

from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from rich.console import Console


__all__ = ["rich_console"]


def rich_console(out: TextIO) -> Console:
    """A rich console writing to ``out`` (the caller has checked that rich is installed)."""
    from rich.console import Console

    return Console(file=out)
