"""The tests' servers (tests/support/server_process.py: PostgreSQL and etcd) start again when
their process dies by a signal before it is ready (a child forked from a process with gRPC
threads can), and report a server that keeps dying."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from support.etcd_server import EtcdServer, EtcdUnavailable
from support.pg_server import PgServer, PgUnavailable

pytestmark = pytest.mark.integration


def wrapper_script(count: Path, crashes: int) -> str:
    """A shell script that dies by SIGSEGV on its first ``crashes`` runs, then runs its
    arguments, counting its runs in ``count``."""
    return (
        "#!/bin/sh\n"
        f"runs=$(cat {count}); runs=${{runs:-0}}\n"
        f"echo $((runs + 1)) > {count}\n"
        f'if [ "$runs" -lt {crashes} ]; then kill -SEGV $$; fi\n'
        'exec "$@"\n'
    )


def crashing_wrapper(server: PgServer, source: Path, crashes: int) -> tuple[Path, Path]:
    """The wrapper in the server's folder (where its account can run it), running postgres;
    and the file counting its runs."""
    count = server.install_file(source / "empty", "runs")
    script = source / "postgres-wrapper"
    script.write_text(wrapper_script(count, crashes))
    installed = server.install_file(script, "postgres-wrapper")
    installed.chmod(stat.S_IRWXU)
    return installed, count


@pytest.mark.parametrize(("crashes", "starts"), [(1, True), (2, True), (3, False)])
def test_a_start_that_dies_by_a_signal_is_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crashes: int, starts: bool
) -> None:
    (tmp_path / "empty").write_text("")
    server = PgServer()
    wrapper, runs = crashing_wrapper(server, tmp_path, crashes)
    command = PgServer._command
    monkeypatch.setattr(PgServer, "_command", lambda self: [str(wrapper), *command(self)])
    try:
        if starts:
            server.start()
            with server.connect() as connection:
                assert connection.execute("SELECT 1").fetchone() == (1,)
        else:
            with pytest.raises(PgUnavailable, match="status -11"):
                server.start()
        assert runs.read_text().strip() == str(min(crashes + 1, 3))
    finally:
        server.close()


@pytest.mark.parametrize(("crashes", "starts"), [(1, True), (2, True), (3, False)])
def test_an_etcd_start_that_dies_by_a_signal_is_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crashes: int, starts: bool
) -> None:
    runs = tmp_path / "runs"
    wrapper = tmp_path / "etcd-wrapper"
    wrapper.write_text(wrapper_script(runs, crashes))
    wrapper.chmod(stat.S_IRWXU)
    command = EtcdServer._command
    monkeypatch.setattr(EtcdServer, "_command", lambda self: [str(wrapper), *command(self)])
    server = EtcdServer()
    try:
        if starts:
            server.start()
            server.put(b"k", b"v")
        else:
            with pytest.raises(EtcdUnavailable, match="status -11"):
                server.start()
        assert runs.read_text().strip() == str(min(crashes + 1, 3))
    finally:
        server.close()
