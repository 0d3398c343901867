"""Runs ``bench_abi3.py``: the abi3 wheel against the full-API wheel, interleaved, one table.

    python benches/abi3_cost.py ABI3_WHEEL FULL_WHEEL [--runs N]

Installs each wheel (with pytest, which ``benchkit`` imports, and nothing else) into its own
fresh virtualenv of this interpreter, runs ``bench_abi3.py`` here ``--runs`` times with
pytest-benchmark (the ``bench`` extra) pointing at the two, and prints the medians and ratios of
each run as a Markdown table for ``benches/RESULTS.md``, then which paths are more than 5%
slower under abi3 (by the median of the runs' ratios). The raw data goes to
``.benchmarks/abi3-N.json``. ``make bench-abi3`` builds both wheels and runs it.
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
# A path whose abi3 build is slower than this, as a median of per-round ratios, is reported.
TOLERATED_RATIO = 1.05


def venv_with(wheel: Path, directory: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", directory], check=True)
    python = directory / "bin" / "python"
    subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", wheel, "pytest"],
        check=True,
    )
    return python


def table(results: Path) -> tuple[str, dict[str, float]]:
    """A run's Markdown table, and its ratio abi3 / full per path."""
    rows = [
        "| path | abi3 (ns/call) | full API (ns/call) | abi3 / full, median of rounds (q1 to q3) |",
        "| --- | ---: | ---: | ---: |",
    ]
    ratios = {}
    for bench in json.loads(results.read_text())["benchmarks"]:
        info = bench["extra_info"]
        path = bench["params"]["path"]
        q1, q3 = info["abi3_over_full_q1_q3"]
        rows.append(
            f"| `{path}` | {info['abi3_ns']:.1f} | {info['full_ns']:.1f} |"
            f" {info['abi3_over_full']:.3f} ({q1:.3f} to {q3:.3f}) |"
        )
        ratios[path] = info["abi3_over_full"]
    return "\n".join(rows), ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("abi3_wheel", type=Path)
    parser.add_argument("full_wheel", type=Path)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    out = ROOT / ".benchmarks"
    out.mkdir(exist_ok=True)
    ratios: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="shardline-abi3-") as scratch:
        env = {
            **os.environ,
            "SHARDLINE_ABI3_PYTHON": str(venv_with(args.abi3_wheel.resolve(), Path(scratch, "a"))),
            "SHARDLINE_FULL_PYTHON": str(venv_with(args.full_wheel.resolve(), Path(scratch, "f"))),
        }
        for run in range(1, args.runs + 1):
            results = out / f"abi3-{run}.json"
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pytest",
                    "benches/bench_abi3.py",
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
            text, run_ratios = table(results)
            print(f"\nrun {run}:\n{text}")
            for path, ratio in run_ratios.items():
                ratios.setdefault(path, []).append(ratio)
    medians = {path: statistics.median(values) for path, values in ratios.items()}
    slower = [f"{path} ({ratio:.3f})" for path, ratio in medians.items() if ratio > TOLERATED_RATIO]
    print(
        "\nmedian of the runs' ratios: "
        + ", ".join(f"{path} {ratio:.3f}" for path, ratio in medians.items())
        + "\n"
        + (
            f"abi3 is more than {TOLERATED_RATIO - 1:.0%} slower on: {', '.join(slower)}"
            if slower
            else f"no path is more than {TOLERATED_RATIO - 1:.0%} slower under abi3"
        )
    )


if __name__ == "__main__":
    main()
