"""The `shardline` command on the IPv6 loopback (``[::1]``, never another address): `worker`
announces a ``[::1]:PORT`` record over each transport (through LocalDiscovery, or an etcd on
``[::1]`` too), a `WorkerProxy` dispatches to it, and a port in use there is the usual one
line; `inspect` names a catalog's server on ``[::1]`` in brackets."""

from __future__ import annotations

import json
import socket
import uuid
from pathlib import Path

import pytest

from shardline import WorkerProxy
from shardline.cli import main
from shardline.discovery import Discovery
from shardline.discovery.etcd import EtcdDiscovery
from shardline.discovery.local import LocalDiscovery
from shardline.transport import Task, connect
from support.ipv6 import LOOPBACK, requires_ipv6
from support.pg_server import PgServer
from support.picodata_catalog import Catalog
from support.transport_servers import WAIT, new_namespace
from support.worker_processes import worker_process

pytestmark = [pytest.mark.integration, pytest.mark.async_timeout(WAIT), requires_ipv6]

SCHEMES = {"msgpack": "msgpack+tcp://", "grpc": "grpc://"}


@pytest.mark.parametrize("backend", ["local", "etcd"])
@pytest.mark.parametrize("transport", ["msgpack", "grpc"])
async def test_a_worker_on_ipv6_loopback_announces_a_bracketed_address_and_serves(
    tmp_path: Path, request: pytest.FixtureRequest, transport: str, backend: str
) -> None:

    namespace, uid = new_namespace(), uuid.uuid4()
    arguments = ["--namespace", namespace, "--address", "[::1]:0", "--transport", transport]
    discovery: Discovery
    if backend == "etcd":  # etcd too on [::1]
        endpoint = request.getfixturevalue("etcd_ipv6").endpoint
        arguments += ["--etcd", endpoint]
        discovery = EtcdDiscovery([endpoint], namespace)
    else:
        discovery = LocalDiscovery(namespace, directory=tmp_path / "shardline", poll_interval=0.005)
    try:
        async with worker_process(tmp_path, *arguments, "--uid", str(uid)) as worker:
            record = await worker.ready()
            prefix = f"{SCHEMES[transport]}[::1]:"
            assert record.address.startswith(prefix), record.address
            port = int(record.address.removeprefix(prefix))
            assert port > 0
            # the port announced is the one bound on ::1
            with socket.create_connection((LOOPBACK, port), timeout=WAIT):
                pass
            async with WorkerProxy(discovery=discovery.subscribe(), connect=connect) as proxy:
                assert await proxy.dispatch(Task("echo", {"v6": True})) == {"v6": True}
                whoami = await proxy.dispatch(Task("whoami"))
                assert whoami["pid"] == worker.process.pid
                assert [metadata.address for metadata in proxy.workers] == [record.address]
            worker.process.terminate()
            assert await worker.exit_status() == 0
    finally:
        await discovery.aclose()


@pytest.mark.parametrize("transport", ["msgpack", "grpc"])
async def test_a_taken_port_on_ipv6_loopback_is_one_line_and_status_1(
    tmp_path: Path, transport: str
) -> None:

    with socket.create_server((LOOPBACK, 0), family=socket.AF_INET6) as taken:
        address = f"[::1]:{taken.getsockname()[1]}"
        arguments = ("--namespace", new_namespace(), "--address", address)
        async with worker_process(tmp_path, *arguments, "--transport", transport) as worker:
            assert await worker.exit_status() == 1
            assert worker.stderr.read_text().splitlines() == [
                f"shardline worker: error: cannot serve at {address}: address already in use"
            ]


def test_inspect_names_a_catalog_server_on_ipv6_loopback_in_brackets(
    pg_ipv6: PgServer, capsys: pytest.CaptureFixture[str]
) -> None:

    with Catalog(pg_ipv6.create_schema()) as catalog:
        with catalog.transaction():
            catalog.add_tier("default", 3000)
            catalog.add_replicaset("r1")
            catalog.rebalance("default")
        assert main(["inspect", catalog.dsn, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["server"] == f"[::1]:{pg_ipv6.port}"
        assert main(["inspect", catalog.dsn, "--plain"]) == 0
        title = capsys.readouterr().out.splitlines()[0]
        assert title == f"[::1]:{pg_ipv6.port}: one poll, complete"
