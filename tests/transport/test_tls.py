"""TLS and mutual TLS on both transports, on real loopback sockets, with certificates made at
run time: a worker served with `tls=` publishes `msgpack+tls://` or `grpcs://`, `connect` dials
TLS from that record, and each kind of bad certificate is refused at once with an error that
says why; a worker refuses to serve plaintext off loopback unless told `insecure=True`."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import stat
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from shardline.discovery import InProcessDiscovery
from shardline.errors import TransientRpcError
from shardline.transport import (
    GrpcConnection,
    MsgpackConnection,
    Task,
    TlsSettings,
    connect,
    serve,
    serve_grpc,
    serve_msgpack,
)
from shardline.transport.demo_handlers import DEMO_HANDLERS
from shardline.transport.grpc.server import WorkerServer
from shardline.transport.limits import WorkerLimits
from shardline.transport.msgpack import wire
from shardline.transport.msgpack.server import MsgpackWorkerServer
from shardline.workers import WorkerMetadata
from support.certificates import Certificates, make_certificates
from support.transport_servers import WAIT, at, new_namespace

pytestmark = [
    pytest.mark.integration,
    pytest.mark.async_timeout(WAIT * 2),
]  # each async test, start to finish

TRANSPORTS = ["msgpack", "grpc"]
# A refusal comes this soon, or it was not refused by the handshake but by a timer: every
# call below has WAIT (20 s) to connect and to finish.
FAST = 5.0
# TEST-NET-1 (RFC 5737): on no interface of this machine, so binding it fails; a worker
# must refuse it before it tries.
NOT_LOOPBACK = "192.0.2.1"


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("tls"))


@asynccontextmanager
async def worker(
    transport: str, tls: TlsSettings | None, address: str = "127.0.0.1:0", **options: Any
) -> AsyncIterator[MsgpackWorkerServer | WorkerServer]:
    discovery = InProcessDiscovery(new_namespace())
    server = await serve(DEMO_HANDLERS, address, discovery, transport=transport, tls=tls, **options)
    try:
        yield server
    finally:
        await server.stop(0)


def dial(metadata: WorkerMetadata, **options: Any) -> MsgpackConnection | GrpcConnection:
    """`connect`, with the msgpack connection's own timer out of the way (WAIT), so a refusal
    that came from it would not look fast."""
    if metadata.address.startswith("msgpack+"):
        options.setdefault("connect_timeout", WAIT)
    return connect(metadata, **options)


async def echo(metadata: WorkerMetadata, **options: Any) -> Any:
    connection = dial(metadata, **options)
    try:
        return await connection.dispatch(Task("echo", "over TLS"), timeout=WAIT)
    finally:
        connection.close()


async def refused(metadata: WorkerMetadata, **options: Any) -> TransientRpcError:
    """The error of a call that must fail, checked to have come fast and to say the task was
    not sent."""
    started = time.monotonic()
    with pytest.raises(TransientRpcError) as caught:
        await echo(metadata, **options)
    assert time.monotonic() - started < FAST, caught.value
    assert caught.value.sent is False, caught.value
    assert caught.value.address == metadata.address
    return caught.value


# --- calls that work -----------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_tls_worker_publishes_a_tls_address_and_connect_dials_it_with_tls(
    certificates: Certificates, transport: str
) -> None:

    async with worker(transport, certificates.serving()) as server:
        scheme = "msgpack+tls://" if transport == "msgpack" else "grpcs://"
        assert server.address.startswith(f"{scheme}127.0.0.1:")
        assert await echo(server.metadata, tls=certificates.dialling()) == "over TLS"
        if transport == "msgpack":
            connection = dial(server.metadata, tls=certificates.dialling())
            assert isinstance(connection, MsgpackConnection)
            try:
                await connection.dispatch(Task("echo", 1))
                link = connection._shared.link
                assert link is not None
                tls = link._transport.get_extra_info("ssl_object")  # type: ignore[union-attr]
                assert tls is not None
                assert tls.version() in ("TLSv1.2", "TLSv1.3")
            finally:
                connection.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_mutual_tls_works_with_a_client_certificate_the_worker_trusts(
    certificates: Certificates, transport: str
) -> None:

    async with worker(transport, certificates.serving(mutual=True)) as server:
        dialling = certificates.dialling(certificates.client)
        assert await echo(server.metadata, tls=dialling) == "over TLS"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_server_hostname_checks_the_name_the_certificate_gives(
    certificates: Certificates, transport: str
) -> None:

    # the certificate names worker.example, the record 127.0.0.1
    async with worker(transport, certificates.serving(certificates.named_server)) as server:
        dialling = certificates.dialling(server_hostname="worker.example")
        assert await echo(server.metadata, tls=dialling) == "over TLS"


# --- refusals ------------------------------------------------------------------------------

# (what is wrong, the worker's certificate, whether it requires client certificates, the
# caller's certificate, what the caller's error says: over msgpack, over gRPC)
REFUSALS = [
    (
        "the caller trusts another CA",
        "server",
        False,
        None,
        "other_ca",
        ("TLS handshake failed", "certificate verify failed: unable to get local issuer"),
        ("CERTIFICATE_VERIFY_FAILED: unable to get local issuer",),
    ),
    (
        "the worker's certificate has expired",
        "expired_server",
        False,
        None,
        "ca",
        ("TLS handshake failed", "certificate verify failed: certificate has expired"),
        ("CERTIFICATE_VERIFY_FAILED: certificate has expired",),
    ),
    (
        "the worker's certificate does not name its address",
        "named_server",
        False,
        None,
        "ca",
        ("TLS handshake failed", "IP address mismatch", "'127.0.0.1'"),
        ("Hostname Verification Check failed",),
    ),
    (
        "no client certificate",
        "server",
        True,
        None,
        "ca",
        ("connection lost", "requires client certificates", "refuses this side's, or none"),
        ("UNAVAILABLE", "requires client certificates", "refuses this side's, or none"),
    ),
    (
        "the client certificate has expired",
        "server",
        True,
        "expired_client",
        "ca",
        ("connection lost", "requires client certificates"),
        ("UNAVAILABLE", "requires client certificates"),
    ),
    (
        "another CA signed the client certificate",
        "server",
        True,
        "other_client",
        "ca",
        ("connection lost", "requires client certificates"),
        ("UNAVAILABLE", "requires client certificates"),
    ),
]


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(
    ("wrong", "served", "mutual", "presented", "trusted", "msgpack_says", "grpc_says"),
    REFUSALS,
    ids=[refusal[0] for refusal in REFUSALS],
)
async def test_a_bad_certificate_is_refused_at_once_saying_why(
    certificates: Certificates,
    transport: str,
    wrong: str,
    served: str,
    mutual: bool,
    presented: str | None,
    trusted: str,
    msgpack_says: tuple[str, ...],
    grpc_says: tuple[str, ...],
) -> None:

    serving = certificates.serving(getattr(certificates, served), mutual=mutual)
    pair = None if presented is None else getattr(certificates, presented)
    ca = getattr(certificates, trusted)
    dialling = TlsSettings(None if pair is None else pair.cert, pair and pair.key, ca)
    async with worker(transport, serving) as server:
        error = await refused(server.metadata, tls=dialling)
        says = msgpack_says if transport == "msgpack" else grpc_says
        for words in says:
            assert words in str(error), (wrong, str(error))
        if transport == "msgpack":
            expected = "cannot-connect" if "TLS handshake failed" in says else "connection-lost"
            assert error.reason == expected
        else:
            assert error.reason == "unavailable"
        # the worker itself is fine: a caller with the right certificates is served
        good = certificates.dialling(
            certificates.client if mutual else None,
            **({"server_hostname": "worker.example"} if served == "named_server" else {}),
        )
        if served != "expired_server":
            assert await echo(server.metadata, tls=good) == "over TLS"


async def test_a_worker_logs_the_tls_handshakes_it_refuses_one_line_per_interval(
    certificates: Certificates, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "shardline.transport.msgpack.server")
    limits = WorkerLimits(log_interval=60.0)
    async with worker("msgpack", certificates.serving(mutual=True), limits=limits) as server:
        assert isinstance(server, MsgpackWorkerServer)
        for _ in range(3):  # no client certificate
            await refused(server.metadata, tls=certificates.dialling())
        async with asyncio.timeout(WAIT):
            while server.violations < 3:
                await asyncio.sleep(0.01)
        lines = [record.getMessage() for record in caplog.records]
        (line,) = [line for line in lines if "refused the TLS handshake" in line]
        assert line.startswith("refused the TLS handshake of 127.0.0.1:"), line
        assert "certificate" in line, line
        # a caller with the right certificates is served as before
        good = certificates.dialling(certificates.client)
        assert await echo(server.metadata, tls=good) == "over TLS"
    # the rest of the interval's, said when the worker stops
    (summary,) = [r.getMessage() for r in caplog.records if "more like it" in r.getMessage()]
    assert summary.startswith("... and 2 more like it within 60 s, the last: refused the TLS")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_name_other_than_the_certificates_is_refused(
    certificates: Certificates, transport: str
) -> None:

    async with worker(transport, certificates.serving()) as server:
        error = await refused(
            server.metadata, tls=certificates.dialling(server_hostname="worker.example")
        )
        if transport == "msgpack":
            assert "Hostname mismatch, certificate is not valid for 'worker.example'" in str(error)
        else:
            assert "Hostname Verification Check failed" in str(error)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_plaintext_client_to_a_tls_worker_fails_fast(
    certificates: Certificates, transport: str
) -> None:

    async with worker(transport, certificates.serving()) as server:
        _, _, host_port = server.address.partition("://")
        plain = at(("msgpack+tcp://" if transport == "msgpack" else "grpc://") + host_port)
        error = await refused(plain)
        if transport == "msgpack":
            assert "a worker served with TLS ends a plaintext connection so" in str(error)
        else:
            assert error.reason == "unavailable"


async def test_a_raw_plaintext_peer_is_dropped_by_a_tls_worker_at_once(
    certificates: Certificates,
) -> None:

    async with worker("msgpack", certificates.serving()) as server:
        host, port = wire.record_address(server.address)
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(wire.hello(1024, 0.0))
            started = time.monotonic()
            try:
                read = await asyncio.wait_for(reader.read(), FAST)
            except ConnectionResetError:
                read = b""
            assert time.monotonic() - started < FAST
            # the worker's hello is msgpack; a TLS alert, if any, is not
            assert not read.startswith(wire.hello(1024, 0.0)[:4])
        finally:
            writer.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_tls_client_to_a_plaintext_worker_fails_fast(transport: str) -> None:

    async with worker(transport, None) as server:
        _, _, host_port = server.address.partition("://")
        error = await refused(
            at(("msgpack+tls://" if transport == "msgpack" else "grpcs://") + host_port)
        )
        if transport == "msgpack":
            assert "TLS handshake failed" in str(error)


# --- plaintext off loopback ----------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_plaintext_off_loopback_is_refused_before_binding_unless_insecure(
    transport: str,
) -> None:

    address = f"{NOT_LOOPBACK}:0"
    with pytest.raises(ValueError, match=f"refusing to serve plaintext at {NOT_LOOPBACK}"):
        async with worker(transport, None, address):
            pass
    # told insecure, it goes on to bind, which this machine cannot do for that address
    with pytest.raises(OSError, match=f"cannot serve at {NOT_LOOPBACK}"):
        async with worker(transport, None, address, insecure=True):
            pass


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("host", ["localhost", "127.0.0.2"])
async def test_plaintext_on_loopback_needs_no_insecure(transport: str, host: str) -> None:

    async with worker(transport, None, f"{host}:0") as server:
        assert await echo(server.metadata) == "over TLS"


async def test_plaintext_on_a_unix_socket_needs_no_insecure_and_the_file_is_private() -> None:

    path = f"/tmp/shardline-tls-{uuid.uuid4().hex[:12]}.sock"
    async with worker("msgpack", None, path) as server:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert await echo(server.metadata) == "over TLS"


# --- settings ------------------------------------------------------------------------------


def test_tls_settings_name_what_is_wrong_with_them(
    certificates: Certificates, tmp_path: Path
) -> None:

    missing = str(tmp_path / "missing.pem")
    with pytest.raises(ValueError, match=f"TlsSettings cert '{missing}' cannot be read"):
        TlsSettings(missing, certificates.server.key)
    with pytest.raises(ValueError, match=r"TlsSettings ca '.*' cannot be read: Is a directory"):
        TlsSettings(ca=str(tmp_path))
    with pytest.raises(ValueError, match=r"TlsSettings cert '.*server.pem' is given without key"):
        TlsSettings(certificates.server.cert)
    with pytest.raises(ValueError, match=r"TlsSettings key '.*server.key' is given without cert"):
        TlsSettings(key=certificates.server.key)
    with pytest.raises(ValueError, match="server_hostname must be a host name, got ''"):
        TlsSettings(ca=certificates.ca, server_hostname="")
    with pytest.raises(ValueError, match="without cert and key cannot serve"):
        TlsSettings(ca=certificates.ca).server_context()
    mismatched = TlsSettings(certificates.client.cert, certificates.server.key)
    with pytest.raises(ValueError, match=r"cert '.*client.pem' and key '.*server.key' cannot be"):
        mismatched.server_context()
    not_certificates = TlsSettings(ca=certificates.server.key)
    with pytest.raises(ValueError, match=r"TlsSettings ca '.*server.key' cannot be used"):
        not_certificates.client_context()
    # paths may be path-like; equal settings are equal (and share a socket)
    from_paths = TlsSettings(Path(certificates.server.cert), Path(certificates.server.key))
    assert from_paths == TlsSettings(certificates.server.cert, certificates.server.key)
    assert from_paths.cert == certificates.server.cert
    assert hash(from_paths) == hash(TlsSettings(certificates.server.cert, certificates.server.key))


def test_a_private_key_other_users_can_read_is_warned_of(
    certificates: Certificates, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:

    shared = tmp_path / "shared.key"
    shutil.copy(certificates.server.key, shared)
    caplog.set_level(logging.WARNING, "shardline.transport.tls")
    TlsSettings(certificates.server.cert, certificates.server.key).server_context()
    assert not caplog.records
    os.chmod(shared, 0o644)
    TlsSettings(certificates.server.cert, str(shared)).server_context()
    assert [r.getMessage() for r in caplog.records] == [
        f"the private key {shared} is readable by other users than its owner (mode 644): make"
        " it 0600"
    ]


async def test_serving_refuses_tls_on_a_unix_socket_and_a_tls_address_without_tls(
    certificates: Certificates,
) -> None:

    discovery = InProcessDiscovery(new_namespace())
    with pytest.raises(ValueError, match="a Unix socket is served in plaintext"):
        await serve_msgpack(DEMO_HANDLERS, "/tmp/x.sock", discovery, tls=certificates.serving())
    with pytest.raises(ValueError, match="names TLS: serve it with tls="):
        await serve_msgpack(DEMO_HANDLERS, "msgpack+tls://127.0.0.1:0", discovery)
    with pytest.raises(ValueError, match="names TLS: serve it with tls="):
        await serve_grpc(DEMO_HANDLERS, "grpcs://127.0.0.1:0", discovery)
    with pytest.raises(ValueError, match="tls or credentials, not both"):
        await serve_grpc(
            DEMO_HANDLERS,
            "127.0.0.1:0",
            discovery,
            tls=certificates.serving(),
            credentials=grpc.ssl_server_credentials(
                [
                    (
                        Path(certificates.server.key).read_bytes(),
                        Path(certificates.server.cert).read_bytes(),
                    )
                ]
            ),
        )
    # the published form is taken back, and served with TLS again
    async with worker("msgpack", certificates.serving(), "msgpack+tls://127.0.0.1:0") as server:
        assert server.address.startswith("msgpack+tls://127.0.0.1:")


async def test_connect_picks_tls_from_the_record_alone(certificates: Certificates) -> None:

    dialling = certificates.dialling()
    for address, kind, tls in (
        ("msgpack+tls://127.0.0.1:1", MsgpackConnection, True),
        ("msgpack+tcp://127.0.0.1:1", MsgpackConnection, False),
        ("msgpack+unix:///tmp/x.sock", MsgpackConnection, False),
        ("grpcs://127.0.0.1:1", GrpcConnection, True),
        ("grpc://127.0.0.1:1", GrpcConnection, False),
    ):
        connection = connect(at(address), tls=dialling)
        try:
            assert type(connection) is kind
            if isinstance(connection, MsgpackConnection):
                assert (connection._shared.tls is not None) is tls, address
        finally:
            connection.close()
    # equal settings, one socket; other settings, another
    first = MsgpackConnection(at("msgpack+tls://127.0.0.1:1"), tls=certificates.dialling())
    same = MsgpackConnection(first.metadata, tls=certificates.dialling())
    other = MsgpackConnection(first.metadata, tls=certificates.dialling(certificates.client))
    try:
        assert first._shared is same._shared
        assert first._shared is not other._shared
    finally:
        for connection in (first, same, other):
            connection.close()
