"""The wheel: built for CPython's stable ABI, and its smoke check never skips an interpreter.

The smoke test itself (``tests/wheel/smoke.py``, in fresh 3.11/3.12/3.13 virtualenvs) is run by
``make wheel-smoke``, which ``make test`` runs after pytest.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import shardline._core
from support.paths import TESTS

pytestmark = pytest.mark.integration

RUN = TESTS / "wheel" / "run.py"


def test_the_extension_is_built_for_the_stable_abi() -> None:
    # One wheel per platform serves every CPython from 3.11 on only if the extension is abi3.
    assert Path(shardline._core.__file__).name == "_core.abi3.so"


def test_a_missing_interpreter_fails_the_smoke_check(tmp_path: Path) -> None:
    wheel = tmp_path / "shardline-0.1.0-cp311-abi3-manylinux2014_x86_64.whl"
    wheel.write_bytes(b"")
    done = subprocess.run(
        [sys.executable, RUN, wheel, "--python", "3.99"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "no CPython 3.99 found" in done.stderr
    assert "pyenv install 3.99" in done.stderr
    assert done.stdout == ""
