"""`LocalPool` and TLS: workers on loopback TCP serve with the pool's `tls` and the proxy dials
them with it; workers on Unix sockets stay plaintext, each socket mode 0600 in a directory
only this user can enter."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest

from shardline.transport import LocalPool, Task
from shardline.transport.msgpack.wire import record_address
from support.certificates import Certificates, make_certificates
from support.transport_servers import WAIT

pytestmark = [pytest.mark.integration, pytest.mark.async_timeout(WAIT * 3)]

SPEC = "local_pool_handlers:HANDLERS"


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("tls"))


async def test_unix_socket_workers_stay_plaintext_in_a_private_directory(
    certificates: Certificates, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a short directory of its own: pytest's tmp_path can be too long for a socket's path
    monkeypatch.setattr(tempfile, "tempdir", tempfile.mkdtemp(prefix="lp-"))
    tls = certificates.serving(mutual=True)
    async with LocalPool(SPEC, workers=2, tls=tls) as pool:
        for record in pool.workers:
            assert record.address.startswith("msgpack+unix:///")
            path = record_address(record.address)
            assert isinstance(path, str)
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
            assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
        assert await pool.dispatch(Task("echo", "plain"), timeout=5.0) == "plain"
    os.rmdir(tempfile.tempdir or "")


@pytest.mark.parametrize("transport", ["msgpack", "grpc"])
async def test_tcp_workers_serve_mutual_tls_and_the_proxy_dials_it(
    certificates: Certificates, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, transport: str
) -> None:
    # msgpack's workers go to loopback TCP when the directory is too long for a socket's path
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    # the same settings on both sides: the certificate is the worker's and the caller's
    tls = certificates.serving(mutual=True)
    async with LocalPool(SPEC, workers=2, transport=transport, tls=tls) as pool:
        scheme = "msgpack+tls://127.0.0.1:" if transport == "msgpack" else "grpcs://127.0.0.1:"
        assert all(record.address.startswith(scheme) for record in pool.workers)
        assert {await pool.dispatch(Task("whoami"), timeout=5.0) for _ in range(4)} == set(
            pool.pids
        )


def test_a_pool_refuses_tls_settings_its_workers_cannot_serve_with(
    certificates: Certificates,
) -> None:

    with pytest.raises(ValueError, match="without cert and key cannot serve"):
        LocalPool(SPEC, workers=1, tls=certificates.dialling())
