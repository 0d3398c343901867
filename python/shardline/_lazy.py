"""Lazy exports: a package names the modules its exports come from, and a module is imported only
when one of its names is first read, so importing the package costs only what it loads eagerly."""

from __future__ import annotations

import importlib
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping
    from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, Iterable[str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` for ``package`` (its ``__name__``), which
    lazily exports the names of ``exports`` (a module's full name -> the names it defines)::

        __getattr__, __dir__ = lazy_exports(__name__, {"package.module": ["Name"]})

    Reading one of those names, as an attribute or with ``from package import name``, imports
    its module and returns the module's attribute of that name; that module's own import
    errors (a :class:`~shardline.errors.MissingExtra` for one that needs an extra) reach the
    reader. Any other name raises ``AttributeError``, as for a module without ``__getattr__``.

    ``dir(package)`` lists the package's public names (its ``__all__``) and every lazy export,
    loaded or not, with the module's dunder attributes; not the names its ``__init__`` uses
    to load them (this function, ``TYPE_CHECKING``, submodules).

    Implementation notes:
        The value is then stored in the package's namespace, so later reads find it there and
        never call ``__getattr__`` again.
    """
    source = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = source.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        namespace = vars(sys.modules[package])
        dunders = {
            name
            for name in namespace
            if name.startswith("__") and name not in ("__getattr__", "__dir__")
        }
        return sorted(dunders | set(namespace.get("__all__", ())) | source.keys())

    return __getattr__, __dir__
