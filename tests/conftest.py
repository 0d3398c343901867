"""The one runner of ``async def`` tests, and the fixtures every test directory may use: a
topology with two tiers, one etcd and one PostgreSQL server for the tests that only read and
write (tests that restart or reconfigure a server start their own), the balancer protocol a
module's tests run through, the discovery backend a worker process announces itself
through, and a child interpreter. Plain helpers are in ``support/`` (see README.md)."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

# gRPC's fork handlers, on by default, run in the child of every fork this process makes (each
# worker process a test starts) before it execs; with gRPC's own threads busy in this process,
# such a child once logged "epoll_wait error: Bad file descriptor" and exited before exec (a
# bounds_worker that never started, one run in ~3,000 tests). No test forks without exec, so
# the handlers have nothing to protect here. Set before anything imports grpc.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
from hypothesis import settings

from shardline import Topology
from shardline.discovery.etcd import EtcdDiscovery
from shardline.discovery.local import LocalDiscovery
from support import balancer_driving
from support.async_runner import run_async_test
from support.child_python import python_output
from support.etcd_server import EtcdServer
from support.pg_server import PgServer
from support.picodata_catalog import Catalog
from support.picodata_cluster import PicodataCluster
from support.server_process import ServerProcess
from support.worker_processes import Backend

# Property tests check behaviour, not speed: on a shared, loaded machine a per-example deadline
# only produces flaky failures.
settings.register_profile("shardline", deadline=None)
settings.load_profile("shardline")


SERVER_FIXTURES = frozenset(
    {"pg", "pg_ipv6", "etcd", "etcd_ipv6", "picodata_cluster", "backend", "catalog", "child_python"}
)
"""The fixtures that start a server or a process (a worker, a child interpreter): a test that
takes one, directly or through another fixture, is marked ``integration``."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks ``integration`` every test that takes a server fixture. A module that starts
    servers or processes itself (worker processes, RPC servers on loopback, a child
    interpreter) says so with ``pytestmark``; ``pytest -m "not integration"`` runs the rest,
    the fast tier."""
    for item in items:
        if SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Runs an ``async def`` test on a fresh event loop, failing it after the seconds of its
    ``async_timeout`` mark, if it has one: the suite's one async runner."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    parameters = inspect.signature(pyfuncitem.obj).parameters
    arguments = {name: value for name, value in pyfuncitem.funcargs.items() if name in parameters}
    mark = pyfuncitem.get_closest_marker("async_timeout")
    run_async_test(pyfuncitem.obj, arguments, mark.args[0] if mark else None)
    return True


Server = TypeVar("Server", bound=ServerProcess)


def _running(server: Server) -> Iterator[Server]:
    """``server`` started for a fixture's life and closed after it (also if it fails to start)."""
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture
def child_python() -> Callable[[str], str]:
    """:func:`support.child_python.python_output`: what ``python -c code`` prints in a fresh
    interpreter, for a test that must see a fresh ``import shardline``."""
    return python_output


@pytest.fixture
def topology() -> Topology:
    t = Topology()
    t.apply_tiers({"default": 3000, "other": 3000})
    return t


@pytest.fixture(scope="session")
def etcd() -> Iterator[EtcdServer]:
    """A real etcd on free loopback ports; a test that cannot have it fails, never skips."""
    yield from _running(EtcdServer())


@pytest.fixture(scope="session")
def pg() -> Iterator[PgServer]:
    """A real PostgreSQL on a free loopback port (`tests/support/pg_server.py`); a test that
    cannot have it fails, never skips. Tests share the server: each takes its own database with
    `pg.create_database()` (or its own server, if it restarts or reconfigures it)."""
    yield from _running(PgServer())


@pytest.fixture
def catalog(pg: PgServer) -> Iterator[Catalog]:
    """An empty Picodata-like catalog in a schema of its own (`tests/support/picodata_catalog.py`);
    a directory or module that needs one filled in overrides it."""
    with Catalog(pg.create_schema()) as catalog:
        yield catalog


@pytest.fixture(scope="session")
def etcd_ipv6() -> Iterator[EtcdServer]:
    """A real etcd serving clients on the IPv6 loopback (``http://[::1]:port``), shared like
    ``etcd``; take it only in a test marked ``support.ipv6.requires_ipv6``."""
    yield from _running(EtcdServer(host="::1"))


@pytest.fixture(scope="session")
def pg_ipv6() -> Iterator[PgServer]:
    """A real PostgreSQL listening on the IPv6 loopback only (``[::1]``), shared like ``pg``;
    take it only in a test marked ``support.ipv6.requires_ipv6``."""
    yield from _running(PgServer(host="::1"))


@pytest.fixture(scope="module", params=balancer_driving.PROTOCOLS)
def balancer_protocol(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs a module's tests through each balancer protocol: balancers driven directly go
    through ``balancer_driving.start``; with ``"delegate"``, the proxy is made to drive every
    balancer through ``delegate`` (as it does one that has no ``select``)."""
    protocol: str = request.param
    balancer_driving.PROTOCOL[0] = protocol
    with pytest.MonkeyPatch.context() as patch:
        if protocol == "delegate":
            patch.setattr("shardline.proxy.select_of", lambda balancer: None)
        yield protocol
    balancer_driving.PROTOCOL[0] = "select"


@pytest.fixture(scope="module")
def picodata_cluster() -> Iterator[PicodataCluster]:
    """A stand-in Picodata cluster (`tests/support/picodata_cluster.py`) for the module, closed
    at its end; a test that changes it calls :meth:`PicodataCluster.reset` first (or last)."""
    with PicodataCluster() as cluster:
        yield cluster


@pytest.fixture(params=["local", "etcd"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """Each discovery backend a ``shardline worker`` announces itself through: the worker's
    extra arguments, and how the test opens a handle on a namespace (the etcd one starts the
    session's etcd)."""
    if request.param == "local":
        directory = tmp_path / "shardline"
        return (), lambda namespace: LocalDiscovery(
            namespace, directory=directory, poll_interval=0.005
        )
    endpoint = request.getfixturevalue("etcd").endpoint
    return ("--etcd", endpoint), lambda namespace: EtcdDiscovery([endpoint], namespace)
