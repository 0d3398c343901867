"""EtcdDiscovery with an etcd client URL on the IPv6 loopback (``http://[::1]:port``, never
another address): records published and followed through it, and an endpoint's IPv6 host
refused without its brackets."""

from __future__ import annotations

import pytest

from shardline import InvalidAddress
from shardline.discovery.etcd import EtcdDiscovery
from support.discovery_contract import kinds, take
from support.etcd_server import EtcdServer
from support.ipv6 import requires_ipv6
from support.transport_servers import new_namespace
from support.workers import worker

pytestmark = pytest.mark.async_timeout(30)


@requires_ipv6
async def test_records_go_through_an_etcd_endpoint_on_ipv6_loopback(etcd_ipv6: EtcdServer) -> None:

    assert etcd_ipv6.endpoint.startswith("http://[::1]:")
    namespace = new_namespace()
    discovery = EtcdDiscovery([etcd_ipv6.endpoint], namespace)
    follower = EtcdDiscovery(f"[::1]:{etcd_ipv6.client_port}", namespace)
    try:
        watcher = follower.subscribe()
        record = worker(1, address="grpc://[::1]:5001")
        await discovery.publisher.publish("worker-added", record)
        assert kinds(await take(watcher, 1)) == [("worker-added", record.uid, record.address)]
    finally:
        await discovery.aclose()
        await follower.aclose()


@pytest.mark.parametrize(
    ("endpoint", "says"),
    [
        ("http://::1:2379", "an IPv6 host is written in brackets"),
        ("::1:2379", "an IPv6 host is written in brackets"),
        ("[127.0.0.1]:2379", "'127.0.0.1' is not an IPv6 address"),
        ("http://[::1]:2379/", "the port '2379/' is not a number"),
    ],
)
def test_an_endpoint_that_is_not_host_port_is_refused_naming_it(endpoint: str, says: str) -> None:

    with pytest.raises(InvalidAddress) as raised:
        EtcdDiscovery([endpoint], "ns")
    assert str(raised.value).startswith(f"etcd endpoint {endpoint!r} is not host:port: {says}")
