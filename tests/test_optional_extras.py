"""The grpc and etcd extras are optional: importing shardline never loads them."""

from __future__ import annotations

import subprocess
import sys


def test_importing_shardline_and_discovery_loads_neither_grpc_nor_aetcd() -> None:
    probe = (
        "import sys, shardline, shardline.discovery, shardline.registration, shardline.cli;"
        "print(sorted(m for m in ('grpc', 'aetcd') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_etcd_backends_are_loaded_on_first_use() -> None:
    from shardline import discovery, registration
    from shardline.discovery.etcd import EtcdDiscovery
    from shardline.registration.etcd_store import EtcdRecordStore

    assert discovery.EtcdDiscovery is EtcdDiscovery
    assert registration.EtcdRecordStore is EtcdRecordStore
