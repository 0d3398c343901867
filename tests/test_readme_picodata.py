"""The README's Picodata example, run as written against the stand-in cluster of
``tests/picodata_cluster.py`` (only its DSN replaced by the cluster's), and checked on the
servers: the row is on the owning master's server and nowhere else."""

from __future__ import annotations

from pathlib import Path

import pytest
from picodata_cluster import (
    BUCKET_COUNT,
    PicodataCluster,
    picodata_cluster_fixture,  # noqa: F401  (the picodata_cluster fixture)
)

README = Path(__file__).resolve().parent.parent / "README.md"
SECTION = "## Routed SQL for Picodata\n"
README_DSN = "postgresql://app:secret@pico-1:4327"


def picodata_example() -> str:
    """The first Python block of the README's Picodata section."""
    text = README.read_text(encoding="utf-8")
    assert SECTION in text, "the README lost its Picodata section"
    section = text.split(SECTION, 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_readme_example_runs_as_written(
    picodata_cluster: PicodataCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = picodata_cluster
    cluster.reset()
    code = picodata_example()
    assert README_DSN in code
    assert 'asyncio.run(main(7, "ada"))' in code
    # after reset(), rs2 (its master m2, no replica) owns the upper half of the buckets
    assert cluster.bucket_of(7) > BUCKET_COUNT // 2

    as_run = code.replace(README_DSN, cluster.dsn)
    exec(compile(as_run, str(README), "exec"), {"__name__": "readme"})

    row, rows, n, explanation = capsys.readouterr().out.splitlines()
    assert cluster.where(7) == ["m2"]
    assert cluster.users("m2") == [(7, "ada")]
    # read_only=True on a replicaset without replicas reads its master
    assert row == "<Record id=7 name='ada'>"
    # without a key the query runs on any instance; the stand-in's servers do not run
    # Picodata's distributed SQL, so the count is that one server's
    assert rows in ("[<Record count=1>]", "[<Record count=0>]")
    assert n == "1"
    assert explanation.startswith("Explanation(tier='default', bucket=1860, range=(1501, 3000),")
    assert "master_name='m2'" in explanation
    assert "routable=True" in explanation
