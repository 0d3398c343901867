"""A child interpreter, for the tests that must see a fresh ``import shardline`` (what it loads,
what it reads) or run a documented example as a user would; such a test is marked
``integration``."""

from __future__ import annotations

import subprocess
import sys

TIMEOUT = 120.0
"""Seconds a child may run: an import and a few lines, on a busy machine."""


def python_output(code: str) -> str:
    """What ``python -c code``, run by this interpreter in a child process, prints on stdout,
    stripped; ``subprocess.CalledProcessError`` (with the child's stderr) if it fails."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT, check=True
    )
    return done.stdout.strip()
