"""``shardline.__version__``, read from the installed distribution's metadata when first asked
for: importing ``importlib.metadata`` costs more than the rest of ``import shardline``."""

import importlib.metadata

__all__ = ["__version__"]


def _installed_version() -> str:
    try:
        return importlib.metadata.version("shardline")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


__version__ = _installed_version()
