"""Runs the fuzz targets, each for a time budget; exits non-zero on a contract violation.

    python tests/fuzz/run.py [--seconds N] [--seed N] [--work DIR] [TARGET ...]

Each target starts from its seeds in ``tests/fuzz/corpus/<target>/`` (run first, so a saved
regression input fails at once) and writes what it learns to a scratch corpus under ``--work``
(a temporary directory unless given; the seeds in the repository are never written). On a
violation it prints the traceback, the input, and how to reproduce it and keep it as a seed.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGETS = sorted(path.stem.removeprefix("fuzz_") for path in HERE.glob("fuzz_*.py"))
# A single input running this long is a hang: a contract violation like any other.
INPUT_TIMEOUT_SECONDS = 30


def report(target: str, output: str, findings: list[Path]) -> None:
    start = output.find("=== Uncaught Python exception")
    if start < 0:
        start = output.find("ERROR: libFuzzer")
    lines = output[max(start, 0) :].splitlines() if start >= 0 else output.splitlines()[-40:]
    print(f"fuzz {target}: CONTRACT VIOLATION", file=sys.stderr)
    shown = [line for line in lines if not line.startswith(("0x", "INFO: Instrumenting"))]
    print("\n".join(shown[:60]), file=sys.stderr)
    for finding in findings:
        data = finding.read_bytes()
        shown = repr(data) if len(data) <= 2000 else repr(data[:2000]) + " …"
        print(
            f"input ({len(data)} bytes): {shown}\n"
            f"  saved as {finding}\n"
            f"  reproduce: {Path(sys.executable).name} tests/fuzz/fuzz_{target}.py {finding}\n"
            f"  keep it as a regression seed: cp {finding} tests/fuzz/corpus/{target}/",
            file=sys.stderr,
        )


def run(target: str, seconds: int, seed: int | None, work: Path) -> bool:
    scratch = work / target
    scratch.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        str(HERE / f"fuzz_{target}.py"),
        str(scratch),
        str(HERE / "corpus" / target),
        f"-max_total_time={seconds}",
        f"-timeout={INPUT_TIMEOUT_SECONDS}",
        f"-artifact_prefix={scratch}/",
        f"-dict={HERE / 'json.dict'}",
        "-print_final_stats=1",
    ]
    if seed is not None:
        command.append(f"-seed={seed}")
    done = subprocess.run(
        command, capture_output=True, text=True, errors="replace", timeout=seconds + 300
    )
    output = done.stdout + done.stderr
    findings = sorted(p for p in scratch.iterdir() if p.name.startswith(("crash-", "timeout-")))
    if done.returncode != 0 or findings:
        report(target, output, findings)
        return False
    runs = re.search(r"stat::number_of_executed_units:\s*(\d+)", output)
    rate = re.search(r"stat::average_exec_per_sec:\s*(\d+)", output)
    print(
        f"fuzz {target}: ok, {runs[1] if runs else '?'} inputs in {seconds} s"
        f" ({rate[1] if rate else '?'}/s)"
    )
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=180, help="budget per target")
    parser.add_argument("--seed", type=int, help="libFuzzer's seed (random if not given)")
    parser.add_argument("--work", type=Path, help="where scratch corpora and findings go")
    parser.add_argument("targets", nargs="*", help=f"some of {', '.join(TARGETS)} (default: all)")
    options = parser.parse_args()
    unknown = set(options.targets) - set(TARGETS)
    if unknown:
        parser.error(f"no fuzz target named {', '.join(sorted(unknown))}")
    work = options.work or Path(tempfile.mkdtemp(prefix="shardline-fuzz-"))
    targets = options.targets or TARGETS
    failed = [target for target in targets if not run(target, options.seconds, options.seed, work)]
    # the closing line CI reads, in the form every test runner's summary shares
    print(f"fuzz: {len(targets) - len(failed)} passed, {len(failed)} failed")
    if failed:
        print(f"fuzz: contract violations in {', '.join(failed)}; inputs kept in {work}")
        return 1
    if options.work is None:
        shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
