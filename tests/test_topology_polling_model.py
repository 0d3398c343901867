"""Drawn catalog histories, polled by a PollingSource, against the reference model.

Each step changes the catalog (replicasets join and leave, weights change, buckets move,
masters switch, instances go offline, ``_pico_bucket`` fails or serves garbage for a tier),
then polls once. The model (tests/topology_model.py) is fed what the catalog says, the way the
issue states it: membership changes as events (replicasets, then instances), then a snapshot
of every tier whose buckets could be read. A tier whose buckets could not be read keeps its
map, unless a membership event cleared it — the source never clears one on its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pg_server import PgServer
from picodata_catalog import Catalog, Expected, name_uuid, topology_state
from topology_model import Model

from shardline import BucketEvent, InstanceEvent, ReplicasetEvent, Topology
from shardline.topology.sources import PollingSource

TIERS = {"a": 30, "b": 20}
MEMBERS = {"r1": "a", "r2": "a", "r3": "a", "r4": "b", "r5": "b"}

steps = st.one_of(
    st.tuples(st.just("add"), st.sampled_from(sorted(MEMBERS))),
    st.tuples(st.just("expel"), st.sampled_from(sorted(MEMBERS))),
    st.tuples(st.just("weight"), st.sampled_from(sorted(MEMBERS)), st.sampled_from([1.0, 2.0])),
    st.tuples(st.just("rebalance"), st.sampled_from(sorted(TIERS))),
    st.tuples(st.just("offline"), st.sampled_from(sorted(MEMBERS)), st.booleans()),
    st.tuples(st.just("second master"), st.sampled_from(sorted(MEMBERS))),
    st.tuples(st.just("fail"), st.sampled_from(sorted(TIERS))),
    st.tuples(st.just("garble"), st.sampled_from(sorted(TIERS))),
    st.tuples(st.just("heal"), st.sampled_from(sorted(TIERS))),
)


@pytest.fixture(scope="module")
def catalog(pg: PgServer) -> Iterator[Catalog]:
    with Catalog(pg.create_schema()) as catalog:
        yield catalog


def change(catalog: Catalog, step: tuple[Any, ...], broken: set[str]) -> None:
    """Applies one drawn step; steps that do not apply (expel an absent replicaset) do
    nothing. ``broken`` tracks the tiers whose ``_pico_bucket`` fails."""
    kind, target = step[0], step[1]
    present = set(catalog.expected().replicasets)
    with catalog.transaction():
        if kind == "add" and name_uuid(target) not in present:
            catalog.add_replicaset(target, MEMBERS[target])
        elif kind == "expel" and name_uuid(target) in present:
            catalog.expel_replicaset(target)
            catalog.rebalance(MEMBERS[target])
        elif kind == "weight" and name_uuid(target) in present:
            catalog.set_weight(target, step[2])
        elif kind == "rebalance":
            catalog.rebalance(target)
        elif kind == "offline" and name_uuid(target) in present:
            catalog.set_state(f"{target}_1", "Offline" if step[2] else "Online")
        elif kind == "second master" and name_uuid(target) in present:
            if name_uuid(f"{target}_2") not in catalog.expected().instances:
                catalog.add_instance(f"{target}_2", target)
            catalog.switch_master(target, f"{target}_2")
        elif kind == "fail":
            catalog.fail_buckets(target)
            broken.add(target)
        elif kind == "garble":
            catalog.serve_raw_buckets(target, '[{"bucket_id_start": 1, "bucket_id_end": ')
            broken.add(target)
        elif kind == "heal":
            catalog.heal_buckets(target)
            broken.discard(target)


def feed(model: Model, before: Expected, after: Expected, broken: set[str]) -> None:
    """What the catalog's change means for the model: replicasets, instances, bucket maps."""
    for rs, (tier, master) in after.replicasets.items():
        if before.replicasets.get(rs) != (tier, master):
            model.apply(ReplicasetEvent("replace", rs, tier=tier, current_master_uuid=master))
    for rs in before.replicasets.keys() - after.replicasets:
        model.apply(ReplicasetEvent("delete", rs))
    for i, fields in after.instances.items():
        old = before.instances.get(i)
        if old == fields:
            continue
        if old is not None and any(
            o is not None and n is None for o, n in zip(old, fields, strict=True)
        ):
            model.apply(InstanceEvent("delete", i))
        model.apply(InstanceEvent("replace", i, *fields))
    for i in before.instances.keys() - after.instances:
        model.apply(InstanceEvent("delete", i))
    for tier, ranges in after.maps.items():
        if tier not in broken:
            model.apply_snapshot(tier, [BucketEvent(tier, s, e, owner) for s, e, owner in ranges])


def model_state(model: Model) -> Expected:
    return Expected(
        tiers=dict(model.tiers),
        replicasets={rs: (tier, master) for rs, tier, master in model.replicasets.values()},
        instances={i: (rs, state, address) for i, rs, state, address in model.instances.values()},
        maps={tier: sorted(ranges) for tier, ranges in model.maps.items()},
    )


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    initial=st.sets(st.sampled_from(sorted(MEMBERS)), min_size=1),
    history=st.lists(steps, min_size=1, max_size=8),
)
def test_drawn_catalog_histories_against_the_model(
    catalog: Catalog, initial: set[str], history: list[tuple[Any, ...]]
) -> None:
    catalog.reset()
    with catalog.transaction():
        for tier, count in TIERS.items():
            catalog.add_tier(tier, count)
        for name in sorted(initial):
            catalog.add_replicaset(name, MEMBERS[name])
        for tier in TIERS:
            catalog.rebalance(tier)

    async def main() -> None:
        topology, model = Topology(), Model()
        async with PollingSource(catalog.dsn, interval=60) as source:
            task = asyncio.create_task(source.run(topology))
            broken: set[str] = set()
            before = Expected({}, {}, {}, {})
            model.apply_tiers(TIERS)
            for step in [None, *history]:
                if step is not None:
                    change(catalog, step, broken)
                after = catalog.expected()
                assert await source.refresh() == (not broken)
                feed(model, before, after, broken)
                assert topology_state(topology) == model_state(model), step
                if not broken:
                    assert topology_state(topology) == after
                before = after
        await asyncio.wait_for(task, 10)

    asyncio.run(main())
