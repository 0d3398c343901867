"""The version users see: ``shardline.__version__`` and ``shardline --version``, both the
installed distribution's."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

import shardline

pytestmark = pytest.mark.integration


def test_the_package_and_the_command_report_the_installed_version() -> None:
    installed = importlib.metadata.version("shardline")
    assert shardline.__version__ == installed
    shown = subprocess.run(
        [sys.executable, "-m", "shardline", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert shown.stdout == f"shardline {installed}\n"
