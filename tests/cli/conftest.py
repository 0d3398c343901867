"""Fixtures of the CLI's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.pg_server import PgServer
from support.picodata_catalog import Catalog
from support.replicasets import rs_uuid


@pytest.fixture
def catalog(pg: PgServer) -> Iterator[Catalog]:
    """A Picodata-like catalog in a schema of its own, two tiers: default (3000 buckets) on r1
    (two instances) and r2, other (100) on r3."""
    with Catalog(pg.create_schema()) as catalog:
        with catalog.transaction():
            catalog.add_tier("default", 3000)
            catalog.add_tier("other", 100)
            catalog.add_replicaset("r1", uuid=rs_uuid(1), instances=2)
            catalog.add_replicaset("r2", uuid=rs_uuid(2))
            catalog.add_replicaset("r3", "other", uuid=rs_uuid(3))
            catalog.rebalance("default")
            catalog.rebalance("other")
        yield catalog
