"""The examples of docs/operations.md, run as written: each `print(...)` must print what the
comment lines right after it say (joined with spaces; times may differ)."""

from __future__ import annotations

import re

import pytest

from support.paths import ROOT

DOC = ROOT / "docs" / "operations.md"
TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def section_code(heading: str) -> str:
    """The first Python block of the section `heading`."""
    text = DOC.read_text(encoding="utf-8")
    assert heading in text, f"docs/operations.md lost its section {heading!r}"
    section = text.split(heading, 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def expected_prints(code: str) -> list[str]:
    """What the comments after each `print(` line say it prints, one string per print."""
    expected: list[str] = []
    lines = code.splitlines()
    for at, line in enumerate(lines):
        if not line.startswith("print("):
            continue
        said = []
        for comment in lines[at + 1 :]:
            if not comment.startswith("# "):
                break
            said.append(comment[2:])
        expected.append(" ".join(said))
    return expected


def test_why_did_this_key_go_there_runs_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    code = section_code("## Why did this key go there?\n")
    expected = expected_prints(code)
    assert len(expected) == 3
    exec(compile(code, str(DOC), "exec"), {"__name__": "operations"})
    printed = capsys.readouterr().out.splitlines()
    assert [TIME.sub("<time>", line) for line in printed] == [
        TIME.sub("<time>", line) for line in expected
    ]
