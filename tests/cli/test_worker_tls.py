"""`shardline worker --tls-cert --tls-key --tls-ca` and `--insecure`: real worker processes
serving (mutual) TLS, reached through a proxy that dials TLS from their records; the options'
contradictions and a plaintext address off loopback refused before anything is served."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shardline import WorkerProxy
from shardline.discovery import Discovery
from shardline.discovery.etcd import EtcdDiscovery
from shardline.discovery.local import LocalDiscovery
from shardline.transport import Task, connect
from shardline.transport.tls import TlsSettings
from support.certificates import Certificates, make_certificates
from support.etcd_server import EtcdServer
from support.etcd_server import make_certificates as make_etcd_certificates
from support.transport_servers import WAIT, new_namespace
from support.worker_processes import WorkerProcess, worker_process

pytestmark = [pytest.mark.integration, pytest.mark.async_timeout(WAIT)]

NOT_LOOPBACK = "192.0.2.1"  # TEST-NET-1 (RFC 5737): on no interface of this machine


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("tls"))


async def reached_then_stopped(
    worker: WorkerProcess, discovery: Discovery, dialling: TlsSettings
) -> None:
    """A proxy following ``discovery`` and dialling with ``dialling`` reaches ``worker``; then
    the discovery is closed, and the worker exits cleanly on SIGTERM."""
    try:
        proxy = WorkerProxy(
            discovery=discovery.subscribe(), connect=functools.partial(connect, tls=dialling)
        )
        async with proxy:
            whoami = await proxy.dispatch(Task("whoami"), timeout=WAIT)
            assert whoami["pid"] == worker.process.pid
    finally:
        await discovery.aclose()
    worker.process.terminate()
    assert await worker.exit_status() == 0


@pytest.mark.parametrize(("transport", "scheme"), [("msgpack", "msgpack+tls"), ("grpc", "grpcs")])
async def test_a_worker_process_serves_mutual_tls_to_a_proxy(
    tmp_path: Path, certificates: Certificates, transport: str, scheme: str
) -> None:

    namespace = new_namespace()
    server = certificates.server
    tls = ("--tls-cert", server.cert, "--tls-key", server.key, "--tls-ca", certificates.ca)
    arguments = ("--namespace", namespace, "--address", "127.0.0.1:0", "--transport", transport)
    async with worker_process(tmp_path, *arguments, *tls) as worker:
        record = await worker.ready()
        assert record.address.startswith(f"{scheme}://127.0.0.1:")
        discovery = LocalDiscovery(namespace, directory=tmp_path / "shardline")
        await reached_then_stopped(worker, discovery, certificates.dialling(certificates.client))


async def test_a_worker_passes_etcd_credentials_through(
    tmp_path: Path, certificates: Certificates, monkeypatch: pytest.MonkeyPatch
) -> None:

    # etcd over TLS, with a client certificate and a password both required
    etcd_files = make_etcd_certificates(tmp_path)
    with EtcdServer(certificates=etcd_files) as etcd:
        etcd.enable_auth("root-secret")
        monkeypatch.setenv("SHARDLINE_ETCD_PASSWORD", "root-secret")
        namespace = new_namespace()
        server = certificates.server
        arguments = (
            *("--namespace", namespace, "--address", "127.0.0.1:0", "--etcd", etcd.endpoint),
            *("--etcd-ca", str(etcd_files.ca), "--etcd-cert", str(etcd_files.client_cert)),
            *("--etcd-key", str(etcd_files.client_key), "--etcd-user", "root"),
            *("--tls-cert", server.cert, "--tls-key", server.key),
        )
        async with worker_process(tmp_path, *arguments) as worker:
            record = await worker.ready()
            assert record.address.startswith("msgpack+tls://127.0.0.1:")
            discovery = EtcdDiscovery(
                [etcd.endpoint],
                namespace,
                username="root",
                password="root-secret",
                **etcd_files.client_options(),
            )
            await reached_then_stopped(worker, discovery, certificates.dialling())


def shardline_worker(directory: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shardline", "worker", "--namespace", "tls", *arguments],
        capture_output=True,
        text=True,
        timeout=WAIT * 3,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "XDG_RUNTIME_DIR": str(directory)},
        check=False,
    )


def test_the_tls_options_contradictions_are_usage_errors(
    tmp_path: Path, certificates: Certificates
) -> None:

    cert, key, ca = certificates.server.cert, certificates.server.key, certificates.ca
    loopback = ("--address", "127.0.0.1:0")
    for arguments, says in (
        ((*loopback, "--tls-cert", cert), "--tls-cert needs --tls-key"),
        ((*loopback, "--tls-key", key), "--tls-key needs --tls-cert"),
        ((*loopback, "--tls-ca", ca), "--tls-ca needs --tls-cert and --tls-key"),
        (
            (*loopback, "--tls-cert", cert, "--tls-key", key, "--insecure"),
            "--insecure serves plaintext: it contradicts --tls-cert",
        ),
        (
            ("--address", "/tmp/tls.sock", "--tls-cert", cert, "--tls-key", key),
            "is a Unix socket, served in plaintext",
        ),
        (
            (*loopback, "--tls-cert", str(tmp_path / "none.pem"), "--tls-key", key),
            "none.pem' cannot be read: No such file or directory",
        ),
        (
            (*loopback, "--tls-cert", certificates.client.cert, "--tls-key", key),
            "client.pem' and key",
        ),
        (
            ("--address", f"{NOT_LOOPBACK}:0"),
            f"refusing to serve plaintext at {NOT_LOOPBACK}",
        ),
        (
            ("--address", f"{NOT_LOOPBACK}:0", "--transport", "grpc"),
            f"refusing to serve plaintext at {NOT_LOOPBACK}",
        ),
        ((*loopback, "--etcd-ca", ca), "--etcd-ca applies to --etcd only"),
        (
            (*loopback, "--etcd", "http://127.0.0.1:1", "--etcd-user", "root"),
            "--etcd-user needs the password in $SHARDLINE_ETCD_PASSWORD",
        ),
    ):
        done = shardline_worker(tmp_path, *arguments)
        assert done.returncode == 2, (arguments, done.stderr)
        assert says in done.stderr, (arguments, done.stderr)
        assert done.stdout == ""


def test_insecure_lets_a_worker_try_plaintext_off_loopback(tmp_path: Path) -> None:

    # it goes on to bind, which this machine cannot do for that address
    done = shardline_worker(tmp_path, "--address", f"{NOT_LOOPBACK}:0", "--insecure")
    assert done.returncode == 1, done.stderr
    assert f"cannot serve at {NOT_LOOPBACK}:0" in done.stderr
