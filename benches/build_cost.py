"""Runs ``bench_builds.py``: one wheel of shardline against another, interleaved, one table.

    python benches/build_cost.py WHEEL_A WHEEL_B [--names A B] [--extensions SUFFIX SUFFIX]
                                 [--tolerated RATIO] [--runs N]

Installs each wheel (with pytest, which ``benchkit`` imports, and numpy, for ``route_many``'s
int64 array) into its own fresh virtualenv of this interpreter, runs ``bench_builds.py`` here
``--runs`` times with pytest-benchmark (the ``bench`` extra) pointing at the two, and prints the
medians and ratios A / B of each run as a Markdown table for ``benches/RESULTS.md``, then which
paths are more than ``--tolerated`` slower in A (by the median of the runs' ratios).
``--extensions`` gives a suffix each build's ``_core`` file must end with (``!SUFFIX``: must
not), checked before timing. The raw data goes to ``.benchmarks/builds-A-vs-B-N.json``.

``make bench-abi3`` runs it on the abi3 wheel against its full-API build, ``make
bench-instrumentation`` on this tree against a base revision built from a ``git worktree``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def venv_with(wheel: Path, directory: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", directory], check=True)
    python = directory / "bin" / "python"
    subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            wheel,
            "pytest",
            "numpy",
        ],
        check=True,
    )
    return python


def table(results: Path, a: str, b: str) -> tuple[str, dict[str, float]]:
    """A run's Markdown table, and its ratio A / B per path."""
    rows = [
        f"| path | {a} (ns/call) | {b} (ns/call) | {a} / {b}, median of rounds (q1 to q3) |",
        "| --- | ---: | ---: | ---: |",
    ]
    ratios = {}
    for bench in json.loads(results.read_text())["benchmarks"]:
        info = bench["extra_info"]
        path = bench["params"]["path"]
        q1, q3 = info["a_over_b_q1_q3"]
        rows.append(
            f"| `{path}` | {info['a_ns']:.1f} | {info['b_ns']:.1f} |"
            f" {info['a_over_b']:.3f} ({q1:.3f} to {q3:.3f}) |"
        )
        ratios[path] = info["a_over_b"]
    return "\n".join(rows), ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("wheel_a", type=Path)
    parser.add_argument("wheel_b", type=Path)
    parser.add_argument("--names", nargs=2, default=["a", "b"], metavar=("A", "B"))
    parser.add_argument("--extensions", nargs=2, default=[None, None], metavar=("A", "B"))
    parser.add_argument("--tolerated", type=float, default=1.05)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    a, b = args.names
    out = ROOT / ".benchmarks"
    out.mkdir(exist_ok=True)
    ratios: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="shardline-builds-") as scratch:
        builds = [
            {
                "name": name,
                "python": str(venv_with(wheel.resolve(), Path(scratch, str(index)))),
                "extension": extension,
            }
            for index, (name, wheel, extension) in enumerate(
                zip(args.names, (args.wheel_a, args.wheel_b), args.extensions, strict=True)
            )
        ]
        env = {**os.environ, "SHARDLINE_BUILDS": json.dumps(builds)}
        for run in range(1, args.runs + 1):
            results = out / f"builds-{a}-vs-{b}-{run}.json"
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pytest",
                    "benches/bench_builds.py",
                    "-p",
                    "no:cacheprovider",
                    "--benchmark-only",
                    "--benchmark-columns=median,iqr,rounds",
                    f"--benchmark-json={results}",
                ],
                cwd=ROOT,
                env=env,
                check=True,
            )
            text, run_ratios = table(results, a, b)
            print(f"\nrun {run}:\n{text}")
            for path, ratio in run_ratios.items():
                ratios.setdefault(path, []).append(ratio)
    medians = {path: statistics.median(values) for path, values in ratios.items()}
    slower = [f"{path} ({ratio:.3f})" for path, ratio in medians.items() if ratio > args.tolerated]
    tolerated = f"{args.tolerated - 1:.0%}"
    print(
        "\nmedian of the runs' ratios: "
        + ", ".join(f"{path} {ratio:.3f}" for path, ratio in medians.items())
        + "\n"
        + (
            f"{a} is more than {tolerated} slower than {b} on: {', '.join(slower)}"
            if slower
            else f"no path is more than {tolerated} slower in {a} than in {b}"
        )
    )


if __name__ == "__main__":
    main()
