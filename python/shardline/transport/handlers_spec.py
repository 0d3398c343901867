"""Handlers named by a ``MODULE:ATTRIBUTE`` spec, as ``LocalPool`` and ``shardline worker
--handlers`` take them: checked (:func:`check_spec`) and loaded (:func:`load_handlers`)."""

from __future__ import annotations

import importlib
import traceback
from collections.abc import Mapping
from typing import Any

from shardline.errors import InvalidArgumentType
from shardline.transport.serving import Handler

__all__ = ["HandlersSpecError", "check_spec", "load_handlers"]


class HandlersSpecError(Exception):
    """A ``MODULE:ATTRIBUTE`` spec that does not name a mapping of handlers; the message names
    the spec and says what is wrong with it."""


def check_spec(spec: object) -> str:
    """``spec`` if it has the form ``module:attribute`` (dotted names on both sides), else
    ``ValueError`` naming ``handlers``. Nothing is imported."""
    if not isinstance(spec, str):
        raise InvalidArgumentType(f"handlers must be a 'module:attribute' str, not {spec!r}")
    module, colon, attribute = spec.partition(":")
    if not colon or not all(
        part.isidentifier() for name in (module, attribute) for part in name.split(".")
    ):
        raise ValueError(
            f"handlers must be 'module:attribute' (e.g. 'myapp.handlers:HANDLERS'), not {spec!r}"
        )
    return spec


def load_handlers(spec: str) -> Mapping[str, Handler]:
    """The handlers at ``spec``, ``MODULE:ATTRIBUTE``: ``MODULE`` is imported (with the
    ``sys.path`` of this process) and ``ATTRIBUTE`` read from it, a dotted one followed
    (``handlers:REGISTRY.public``). It must be a mapping (a ``dict``, a ``MappingProxyType``...)
    of at least one handler, each under a non-empty str name and callable: a coroutine
    function (awaited) or any other callable (run on the server's threads), as
    :func:`~shardline.transport.serve` takes them.

    Anything else is a :class:`HandlersSpecError` whose message names the spec and says why:
    a spec not of that form, a module that is not found (``ModuleNotFoundError``, naming the
    module missing, which may be one the handlers' module imports), a module whose import
    raised (the exception, and the file and line it came from), an attribute that is missing
    (``AttributeError``, naming what lacks it), a value that is not a mapping (its type), an
    empty mapping, or an entry whose name or handler is wrong (both named). The cause is
    chained as ``__cause__``."""
    try:
        module_name, _, attribute = check_spec(spec).partition(":")
    except ValueError as error:
        raise HandlersSpecError(str(error)) from None
    try:
        found: Any = importlib.import_module(module_name)
    except Exception as error:
        raise HandlersSpecError(
            f"cannot load the handlers {spec!r}: importing {module_name!r} raised"
            f" {type(error).__name__}: {error}{_where(error)}"
        ) from error
    path = module_name
    for name in attribute.split("."):
        try:
            found = getattr(found, name)
        except AttributeError as error:
            owner = f"module {path!r}" if path == module_name else repr(path)
            raise HandlersSpecError(
                f"cannot load the handlers {spec!r}: AttributeError: {owner} has no attribute"
                f" {name!r}"
            ) from error
        except Exception as error:
            raise HandlersSpecError(
                f"cannot load the handlers {spec!r}: reading {name!r} of {path} raised"
                f" {type(error).__name__}: {error}{_where(error)}"
            ) from error
        path = f"{path}.{name}"
    if not isinstance(found, Mapping):
        raise HandlersSpecError(
            f"the handlers {spec!r} are a {type(found).__name__}, not a mapping of handler"
            " names to handlers"
        )
    if not found:
        raise HandlersSpecError(f"the handlers {spec!r} are an empty mapping: nothing to serve")
    for name, handler in found.items():
        if not isinstance(name, str) or not name or not callable(handler):
            raise HandlersSpecError(
                f"the handlers {spec!r} map {name!r} to {handler!r}: names must be non-empty str"
                " and handlers callable"
            )
    return found


def _where(error: Exception) -> str:
    """`` (at FILE:LINE)``: the innermost frame ``error`` passed through outside the import
    machinery and this module, or nothing when there is none (a module not found at all) or
    ``error`` is a ``SyntaxError`` (its message names its place itself)."""
    if isinstance(error, SyntaxError) or error.__traceback__ is None:
        return ""
    places = [
        (frame.f_code.co_filename, line)
        for frame, line in traceback.walk_tb(error.__traceback__.tb_next)  # past load_handlers
        if not str(frame.f_globals.get("__name__", "")).startswith("importlib")
        and not frame.f_code.co_filename.startswith("<frozen")
    ]
    if not places:
        return ""
    filename, line = places[-1]
    return f" (at {filename}:{line})"
