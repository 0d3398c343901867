"""Shared fixtures: readable names for the uuids the topology tests use, and one etcd server for
the tests that only read and write keys (tests that restart or reconfigure etcd start their own)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import balancer_driving
import pytest
from etcd_server import EtcdServer
from hypothesis import settings

from shardline import InstanceEvent, ReplicasetEvent, Topology

# Property tests check behaviour, not speed: on a shared, loaded machine a per-example deadline
# only produces flaky failures.
settings.register_profile("shardline", deadline=None)
settings.load_profile("shardline")


def rs_uuid(n: int) -> str:
    """Replicaset Rn."""
    return str(uuid.UUID(int=0xA000 + n))


def inst_uuid(n: int) -> str:
    """The master instance of replicaset Rn."""
    return str(uuid.UUID(int=0xB000 + n))


def add_replicaset(topology: Topology, n: int, tier: str = "default") -> None:
    """Replicaset Rn with its master instance, in the seed's order (replicaset, then instance)."""
    topology.apply(
        ReplicasetEvent("replace", rs_uuid(n), tier=tier, current_master_uuid=inst_uuid(n))
    )
    topology.apply(
        InstanceEvent(
            "replace",
            inst_uuid(n),
            replicaset_uuid=rs_uuid(n),
            current_state="Online",
            address=f"127.0.0.1:{3300 + n}",
        )
    )


@pytest.fixture
def topology() -> Topology:
    t = Topology()
    t.apply_tiers({"default": 3000, "other": 3000})
    return t


@pytest.fixture(scope="session")
def etcd() -> Iterator[EtcdServer]:
    """A real etcd on free loopback ports; a test that cannot have it fails, never skips."""
    server = EtcdServer()
    try:
        server.start()
        yield server
    finally:
        server.close()


from pg_server import PgServer  # noqa: E402  (appended with the fixture below)


@pytest.fixture(scope="session")
def pg() -> Iterator[PgServer]:
    """A real PostgreSQL on a free loopback port (`tests/pg_server.py`); a test that cannot have
    it fails, never skips. Tests share the server: each takes its own database with
    `pg.create_database()` (or its own server, if it restarts or reconfigures it)."""
    server = PgServer()
    try:
        server.start()
        yield server
    finally:
        server.close()


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
