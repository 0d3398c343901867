"""Smoke test of an installed shardline wheel: plain Python, nothing but the wheel installed.

    python -I tests/wheel/smoke.py

Run by ``tests/wheel/run.py`` in a fresh virtualenv per CPython version, so a packaging mistake
(a missing module or data file, an extension built for the wrong ABI, a symbol the stable ABI
lacks) fails here rather than on a user's machine. It imports the package, checks ``bucket_id``
against shared test vectors, routes keys through a ``Topology`` fed a poll's JSON text, and
dispatches through a ``WorkerProxy`` over an in-process connection. Exits non-zero on the first
failed check (an ``AssertionError`` and its traceback).
"""

from __future__ import annotations

import array
import asyncio
import datetime as dt
import json
import logging
import sys
import uuid
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import shardline
from shardline import (
    BucketEvent,
    DiscoveryEvent,
    InstanceEvent,
    ReplicasetEvent,
    Topology,
    TransientRpcError,
    UnhashableKey,
    WorkerMetadata,
    WorkerProxy,
    bucket_id,
)

log = logging.getLogger("shardline.wheel_smoke")

# Latin and Cyrillic letters and a euro sign, escaped so that none passes for another.
MIXED_SCRIPT_KEY = "b\u0441zz9\u0441a9-_\u20ac_1b 0"

# From shared/data/bucket_id_picodata_vectors.json (the Picodata driver's vectors; indexes 0, 2,
# 12, 16, 18, 23, 24, 35, 38, 39): every key part type, one and several parts, non-ASCII text.
PICODATA_VECTORS: list[tuple[tuple[Any, ...], int, int]] = [
    ((-1940095024,), 65536, 32770),
    (("", True, True), 65536, 45589),
    ((MIXED_SCRIPT_KEY,), 3000, 1273),
    (
        (-6466263511876810492, 222, dt.datetime.fromisoformat("2011-06-20T14:33:00.866552+00:00")),
        16,
        14,
    ),
    ((Decimal("1"),), 30000, 11135),
    ((828442609, -9, uuid.UUID("197a14e2-ac08-4ba5-f8f6-59ac44ce4ab3")), 16, 7),
    (
        (float("-428912915.8159666"), uuid.UUID("fe48ef63-1e56-3408-c465-3cde776200b5")),
        65536,
        22613,
    ),
    ((None, Decimal("1.10")), 16, 5),
    ((False, Decimal("-123456789.987654321")), 65536, 17434),
    ((2842472588,), 16, 10),
]

# From shared/data/bucket_id_vshard_vectors.json (vshard's own unit test, test/unit/router.result).
VSHARD_VECTORS: list[tuple[str, Any, int, int]] = [
    ("vshard-strcrc32", "1", 3000, 477),
    ("vshard-strcrc32", "1LL", 3000, 730),
    ("vshard-strcrc32", "1ULL", 3000, 982),
    ("vshard-mpcrc32", 1, 3000, 1614),
    ("vshard-mpcrc32", "1", 3000, 477),
    ("vshard-mpcrc32", Decimal("1"), 3000, 1696),
]


def check_install() -> None:
    # The package and its extension come from the virtualenv, not from a source checkout.
    core = Path(shardline._core.__file__).resolve()
    assert core.is_relative_to(Path(sys.prefix).resolve()), f"_core loaded from {core}"
    assert shardline.__version__, "no __version__"
    log.info("shardline %s, extension %s", shardline.__version__, core.name)


def check_bucket_id() -> None:
    for key, count, want in PICODATA_VECTORS:
        assert bucket_id(key, count) == want, ("picodata", key, count, want)
    for scheme, key, count, want in VSHARD_VECTORS:
        assert bucket_id(key, count, scheme=scheme) == want, (scheme, key, count, want)
    try:
        bucket_id(object(), 3000)
    except UnhashableKey:
        pass
    else:
        raise AssertionError("an object() key was hashed")


def rs(n: int) -> str:
    return str(uuid.UUID(int=0xA000 + n))


def inst(n: int) -> str:
    return str(uuid.UUID(int=0xB000 + n))


def check_route() -> None:
    topology = Topology()
    topology.apply_tiers({"default": 3000})
    for n in (1, 2):
        topology.apply(
            ReplicasetEvent("replace", rs(n), tier="default", current_master_uuid=inst(n))
        )
        topology.apply(
            InstanceEvent(
                "replace",
                inst(n),
                replicaset_uuid=rs(n),
                current_state="Online",
                address=f"10.0.0.{n}:4327",
            )
        )
    rows = [
        {
            "bucket_id_start": start,
            "bucket_id_end": end,
            "current_replicaset_uuid": rs(n),
            "target_replicaset_uuid": rs(n),
            "state": "active",
            "tier_name": "default",
        }
        for n, start, end in [(1, 1, 1500), (2, 1501, 3000)]
    ]
    # A poll as `SELECT _pico_bucket('default')` returns it: one JSON text.
    assert topology.apply_bucket_snapshot("default", json.dumps(rows))
    assert topology.owner("default", 1500) == rs(1)
    assert topology.owner("default", 1501) == rs(2)
    # The key of bucket 1273 of 3000 (a vector above), in replicaset 1's range.
    routed = topology.route("default", MIXED_SCRIPT_KEY)
    assert routed is not None, "no route"
    assert (routed.uuid, routed.address) == (inst(1), "10.0.0.1:4327"), routed
    keys = list(range(-500, 500))
    many = topology.route_many("default", keys)
    assert many == [topology.route("default", key) for key in keys]
    # An integer array is read through the buffer protocol, a list item by item: same answers.
    assert topology.route_many("default", array.array("q", keys)) == many
    topology.apply(BucketEvent("default", 1, 1500, rs(2)))
    assert topology.owner("default", 1273) == rs(2)


class Connection:
    """An in-process connection: answers with its worker's address, fails transiently on demand."""

    def __init__(self, metadata: WorkerMetadata) -> None:
        self.address = metadata.address
        self.transient = metadata.address.endswith(":3")

    async def dispatch(self, task: Any, *, timeout: float | None = None) -> str:
        if self.transient:
            raise TransientRpcError(f"{self.address} is busy")
        return f"{self.address} {task}"


async def dispatching() -> None:
    workers = [
        WorkerMetadata(uid=uuid.UUID(int=n), address=f"127.0.0.1:{n}", pid=n, version="1")
        for n in (1, 2, 3)
    ]
    closed = asyncio.Event()

    async def events() -> AsyncIterator[DiscoveryEvent]:
        for worker in workers:
            yield DiscoveryEvent("worker-added", worker)
        await closed.wait()

    async with WorkerProxy(discovery=events(), connect=Connection, quorum=3) as proxy:
        answers = [await proxy.dispatch(f"task-{i}") for i in range(6)]
        closed.set()
    # Round robin over three workers, the third of which fails transiently: every task is
    # answered, by the first two only.
    assert (
        sorted(answer.split()[0] for answer in answers) == ["127.0.0.1:1"] * 3 + ["127.0.0.1:2"] * 3
    ), answers
    assert [answer.split()[1] for answer in answers] == [f"task-{i}" for i in range(6)]


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    check_install()
    check_bucket_id()
    check_route()
    asyncio.run(dispatching())
    log.info("wheel smoke passed on Python %s", sys.version.split()[0])


if __name__ == "__main__":
    main()
