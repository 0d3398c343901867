"""Worker processes run on uvloop when it is installed, on asyncio's loop otherwise."""

from __future__ import annotations

import asyncio
import builtins
from typing import Any

import pytest

from shardline.transport.event_loop import run


async def loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_run_uses_uvloop_when_installed() -> None:
    pytest.importorskip("uvloop")
    assert run(loop_module()).startswith("uvloop")


def test_run_falls_back_to_asyncio_without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def without_uvloop(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "uvloop":
            raise ImportError("No module named 'uvloop'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_uvloop)
    assert run(loop_module()).startswith("asyncio")
