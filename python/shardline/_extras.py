"""The optional dependencies: which extra brings which module, and the one way a missing one is
reported (:class:`~shardline.errors.MissingExtra`, naming the pip command)."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager

from shardline.errors import MissingExtra

__all__ = ["EXTRAS", "require_extra", "requires_extra"]

EXTRAS: dict[str, frozenset[str]] = {
    "cli": frozenset({"rich"}),
    "etcd": frozenset({"aetcd", "grpc"}),
    "grpc": frozenset({"grpc"}),
    "metrics": frozenset({"prometheus_client"}),
    "msgpack": frozenset({"msgpack"}),
    "pg": frozenset({"asyncpg"}),
}
"""Each extra of ``pyproject.toml`` that a feature of the package needs -> the top-level modules
it installs (``fast``'s uvloop is left out: without it, worker processes run on asyncio's loop)."""


@contextmanager
def requires_extra(extra: str, needed_by: str) -> Iterator[None]:
    """Wraps the imports of ``extra``'s modules: a ``ModuleNotFoundError`` for one of them
    becomes a :class:`MissingExtra` naming ``needed_by`` (a module's ``__name__``, or a
    command), the missing module and ``pip install 'shardline[extra]'``.

    A missing module that ``extra`` does not install (one that an installed dependency itself
    needs, or any other) propagates unchanged: that is a broken installation, not an extra to
    add.
    """
    try:
        yield
    except ModuleNotFoundError as error:
        missing = (error.name or "").partition(".")[0]
        if missing not in EXTRAS[extra]:
            raise
        raise MissingExtra(extra, missing, needed_by=needed_by) from error


def require_extra(extra: str, needed_by: str) -> None:
    """Imports every module of ``extra``; raises :class:`MissingExtra` as
    :func:`requires_extra` does when one is missing. For a caller that checks up front, before
    it starts work (processes, output) that would need them later."""
    with requires_extra(extra, needed_by):
        for module in sorted(EXTRAS[extra]):
            importlib.import_module(module)
