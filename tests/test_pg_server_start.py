"""The tests' PostgreSQL (tests/pg_server.py) starts again when its process dies by a signal
before accepting a connection (a child forked from a process with gRPC threads can), and reports
a server that keeps dying."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from pg_server import PgServer, PgUnavailable


def crashing_wrapper(server: PgServer, source: Path, crashes: int) -> tuple[Path, Path]:
    """A script in the server's folder (where its account can run it) that dies by SIGSEGV on
    its first ``crashes`` runs, then runs postgres; and the file counting its runs."""
    count = server.install_file(source / "empty", "runs")
    script = source / "postgres-wrapper"
    script.write_text(
        "#!/bin/sh\n"
        f"runs=$(cat {count}); runs=${{runs:-0}}\n"
        f"echo $((runs + 1)) > {count}\n"
        f'if [ "$runs" -lt {crashes} ]; then kill -SEGV $$; fi\n'
        'exec "$@"\n'
    )
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
