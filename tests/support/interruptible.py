"""The ``shardline`` command as a test starts it when it will interrupt it (SIGINT, as Ctrl-C
does): with Python's own SIGINT handler, whatever the test process inherited. A test run in the
background (``pytest &`` from a script) ignores SIGINT, and a process it started would ignore
the signal too, so a watch would never end."""

from __future__ import annotations

import sys

__all__ = ["SHARDLINE"]

SHARDLINE = [
    sys.executable,
    "-c",
    "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler);"
    " runpy.run_module('shardline', run_name='__main__', alter_sys=True)",
]
"""``python -m shardline``, interruptible: append the command's arguments."""
