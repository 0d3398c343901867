"""Drawn catalog histories, polled by a PollingSource, against the reference model.

Each step changes the catalog (replicasets join, turn ``to-be-expelled`` while their buckets
move away, and are expelled; instances are expelled; weights change, buckets move, masters
switch, instances go offline, ``_pico_bucket`` fails or serves garbage for a tier, a tier's
buckets get bootstrapped), then polls once. Expelled members stay in the catalog's tables, as
in Picodata; the arbiter tier ``z`` (bucket_count 0) has members and no buckets.

The model (tests/support/topology_model.py) is fed what the catalog says, the way the
issue states it: membership changes as events (replicasets, then instances), then a snapshot
of every tier whose buckets could be read. A tier whose buckets could not be read keeps its
map, unless a membership event cleared it — the source never clears one on its own — and its
failure is counted for it alone (``SourceState.tier_failures``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardline import BucketEvent, InstanceEvent, ReplicasetEvent, TierWithoutBuckets, Topology
from shardline.topology.sources import PollingSource
from support.pg_server import PgServer
from support.picodata_catalog import Catalog, Expected, name_uuid, topology_state
from support.topology_model import Model

# "c" starts with its buckets not bootstrapped (_pico_bucket raises until then); "z" is an
# arbiter tier: members, no buckets, never asked for its buckets
TIERS = {"a": 30, "b": 20, "c": 10, "z": 0}
BUCKETED = sorted(tier for tier, count in TIERS.items() if count)
MEMBERS = {"r1": "a", "r2": "a", "r3": "a", "r4": "b", "r5": "b", "r6": "c", "q1": "z", "q2": "z"}

steps = st.one_of(
    st.tuples(st.just("add"), st.sampled_from(sorted(MEMBERS))),
    st.tuples(st.just("expel"), st.sampled_from(sorted(MEMBERS))),
    st.tuples(st.just("leave"), st.sampled_from(sorted(MEMBERS))),
    st.tuples(st.just("expel second"), st.sampled_from(sorted(MEMBERS))),
    st.tuples(st.just("bootstrap"), st.just("c")),
    st.tuples(st.just("weight"), st.sampled_from(sorted(MEMBERS)), st.sampled_from([1.0, 2.0])),
    st.tuples(st.just("rebalance"), st.sampled_from(BUCKETED)),
    st.tuples(st.just("offline"), st.sampled_from(sorted(MEMBERS)), st.booleans()),
    st.tuples(st.just("second master"), st.sampled_from(sorted(MEMBERS))),
    st.tuples(st.just("fail"), st.sampled_from(BUCKETED)),
    st.tuples(st.just("garble"), st.sampled_from(BUCKETED)),
    st.tuples(st.just("heal"), st.sampled_from(BUCKETED)),
)


@pytest.fixture(scope="module")
def catalog(pg: PgServer) -> Iterator[Catalog]:
    with Catalog(pg.create_schema()) as catalog:
        yield catalog


def change(catalog: Catalog, step: tuple[Any, ...], faults: set[str], waiting: set[str]) -> None:
    """Applies one drawn step; steps that do not apply (expel an absent replicaset) do
    nothing. ``faults`` tracks the tiers whose ``_pico_bucket`` is made to fail, ``waiting``
    the tiers whose buckets are not bootstrapped yet."""
    kind, target = step[0], step[1]
    expected = catalog.expected()
    present = set(expected.replicasets)
    with catalog.transaction():
        if kind == "add" and name_uuid(target) not in present:
            catalog.add_replicaset(target, MEMBERS[target])
        elif kind == "expel" and name_uuid(target) in present:
            catalog.expel_replicaset(target)
            catalog.rebalance(MEMBERS[target])
        elif kind == "leave" and name_uuid(target) in present:
            # to-be-expelled: still a member, its buckets being moved away
            catalog.start_expelling(target)
            catalog.set_weight(target, 0.0)
            catalog.rebalance(MEMBERS[target])
        elif kind == "expel second" and name_uuid(f"{target}_2") in expected.instances:
            if expected.replicasets[name_uuid(target)][1] == name_uuid(f"{target}_2"):
                catalog.switch_master(target, f"{target}_1")  # Picodata moves a master first
            catalog.expel_instance(f"{target}_2")
        elif kind == "bootstrap":
            catalog.bootstrap(target)
            waiting.discard(target)
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
            faults.add(target)
        elif kind == "garble":
            catalog.serve_raw_buckets(target, '[{"bucket_id_start": 1, "bucket_id_end": ')
            faults.add(target)
        elif kind == "heal":
            catalog.heal_buckets(target)
            faults.discard(target)


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
            catalog.add_tier(tier, count, bootstrapped=tier != "c")
        for name in sorted(initial):
            catalog.add_replicaset(name, MEMBERS[name])
        for tier in BUCKETED:
            catalog.rebalance(tier)

    async def main() -> None:
        topology, model = Topology(), Model()
        async with PollingSource(catalog.dsn, interval=60) as source:
            task = asyncio.create_task(source.run(topology))
            faults: set[str] = set()
            waiting = {"c"}
            failed = dict.fromkeys(BUCKETED, 0)
            before = Expected({}, {}, {}, {})
            model.apply_tiers(TIERS)
            for step in [None, *history]:
                if step is not None:
                    change(catalog, step, faults, waiting)
                after = catalog.expected()
                broken = faults | waiting
                assert await source.refresh() == (not broken)
                feed(model, before, after, broken)
                assert topology_state(topology) == model_state(model), step
                if not broken:
                    assert topology_state(topology) == after
                for tier in broken:
                    failed[tier] += 1
                assert dict(source.state.tier_failures) == {
                    tier: n for tier, n in failed.items() if n
                }, step
                with pytest.raises(TierWithoutBuckets):
                    topology.route("z", 7)
                before = after
        await asyncio.wait_for(task, 10)

    asyncio.run(main())
