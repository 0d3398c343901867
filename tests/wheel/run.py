"""Installs one wheel into a fresh virtualenv per CPython version and runs the smoke test in each.

    python tests/wheel/run.py WHEEL [--python VERSION ...]

The same file goes into every virtualenv (CPython 3.11, 3.12 and 3.13 unless ``--python`` says
otherwise), with nothing else but what the wheel itself requires: no dev tools, no extras. The
interpreters are pyenv's (``$(pyenv root)/versions/3.X.Y``, the newest patch release) or
``python3.X`` on PATH. A version with no interpreter is a failure, never a skip: the run stops
before installing anything and names the command that would provide it. Exits non-zero on any
failure.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
VERSIONS = ("3.11", "3.12", "3.13")
# An interpreter answers this with its implementation, version and whether it is free-threaded
# (a free-threaded CPython cannot load a stable-ABI extension, so it does not count).
PROBE = (
    "import sys, sysconfig; print(sys.implementation.name, '%d.%d' % sys.version_info[:2],"
    " bool(sysconfig.get_config_var('Py_GIL_DISABLED')))"
)
STEP_TIMEOUT_SECONDS = 300


def pyenv_root() -> Path:
    pyenv = shutil.which("pyenv")
    if pyenv is not None:
        done = subprocess.run([pyenv, "root"], capture_output=True, text=True, timeout=30)
        if done.returncode == 0 and done.stdout.strip():
            return Path(done.stdout.strip())
    return Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))


def candidates(version: str) -> list[Path]:
    """Interpreters that may be CPython `version`: pyenv's newest patch release first."""
    pattern = re.compile(rf"{re.escape(version)}\.(\d+)")
    versions = pyenv_root() / "versions"
    found = []
    if versions.is_dir():
        for directory in versions.iterdir():
            if match := pattern.fullmatch(directory.name):
                found.append((int(match[1]), directory / "bin" / f"python{version}"))
    paths = [path for _, path in sorted(found, reverse=True)]
    on_path = shutil.which(f"python{version}")
    if on_path is not None:
        paths.append(Path(on_path))
    return paths


def interpreter(version: str) -> Path | None:
    """A CPython `version` with the GIL (the build the stable ABI serves), or None."""
    for path in candidates(version):
        try:
            done = subprocess.run(
                [path, "-I", "-c", PROBE], capture_output=True, text=True, timeout=30
            )
        except OSError:
            continue
        if done.returncode == 0 and done.stdout.split() == ["cpython", version, "False"]:
            return path
    return None


def run(command: list[str | Path], what: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=STEP_TIMEOUT_SECONDS)
    if done.returncode != 0:
        sys.stderr.write(done.stdout + done.stderr)
        raise SystemExit(f"wheel smoke: {what} failed (exit {done.returncode})")
    sys.stdout.write(done.stdout + done.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("wheel", type=Path)
    parser.add_argument("--python", action="append", dest="versions", metavar="VERSION")
    args = parser.parse_args()
    wheel: Path = args.wheel.resolve()
    if not wheel.is_file():
        raise SystemExit(f"wheel smoke: no wheel at {args.wheel}")
    versions = args.versions or list(VERSIONS)
    found = {version: interpreter(version) for version in versions}
    missing = [version for version, path in found.items() if path is None]
    if missing:
        names = ", ".join(f"python{version}" for version in missing)
        raise SystemExit(
            f"wheel smoke: no CPython {', '.join(missing)} found (looked in"
            f" {pyenv_root() / 'versions'} and for {names} on PATH); install"
            f" {'it' if len(missing) == 1 else 'them'}, e.g. `pyenv install {' '.join(missing)}`"
        )
    with tempfile.TemporaryDirectory(prefix="shardline-wheel-") as scratch:
        for version, python in found.items():
            assert python is not None
            venv = Path(scratch) / f"py{version}"
            print(f"wheel smoke: {wheel.name} on {python}", flush=True)
            run([python, "-m", "venv", venv], f"creating a Python {version} virtualenv")
            bin_python = venv / "bin" / "python"
            run(
                [
                    bin_python,
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    wheel,
                ],
                f"installing the wheel into Python {version}",
            )
            # -I: neither PYTHONPATH nor the working directory can put a source tree first.
            run([bin_python, "-I", HERE / "smoke.py"], f"the smoke test on Python {version}")


if __name__ == "__main__":
    main()
