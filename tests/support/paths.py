"""Where things are, for tests that read files of the repository (docs, examples, data)."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent
# shared fixtures: the bucket_id vectors, a trimmed benchmark run
DATA = TESTS / "data"
SUPPORT = TESTS / "support"
