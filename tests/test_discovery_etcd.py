"""EtcdDiscovery against a real etcd: the discovery contract, then etcd's faults."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from discovery_contract import DiscoveryContract
from etcd_server import EtcdServer

from shardline.discovery import Discovery
from shardline.discovery.etcd import EtcdDiscovery


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    server = EtcdServer()
    try:
        server.start()
        yield server
    finally:
        server.close()


class TestEtcdDiscovery(DiscoveryContract):
    @pytest.fixture(autouse=True)
    def _server(self, etcd: EtcdServer) -> None:
        self.endpoint = etcd.endpoint

    async def make(self, namespace: str) -> Discovery:
        return EtcdDiscovery([self.endpoint], namespace, ttl=5)
