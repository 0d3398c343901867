"""The uid-keyed worker pool: the seed's cases 1-15 (`TestLoadBalancerContext`)."""

from __future__ import annotations

import dataclasses
import gc
import uuid
import weakref
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import shardline
from shardline import (
    AffinityLoadBalancer,
    LoadBalancerContext,
    LoadBalancerContextView,
    RoundRobinLoadBalancer,
    WeightedRoundRobinLoadBalancer,
    WorkerMetadata,
    WorkerPool,
)
from support.balancer_driving import all_failing
from support.workers import worker

MUTABLE_FIELDS = ("address", "pid", "version", "tags", "extra")


def mutated(record: WorkerMetadata, fields: frozenset[str]) -> WorkerMetadata:
    """The record with every field in `fields` changed (never the uid)."""
    changes: dict[str, Any] = {
        "address": record.address + "0",
        "pid": record.pid + 1,
        "version": record.version + ".1",
        "tags": record.tags | {"changed"},
        "extra": MappingProxyType({**record.extra, "changed": True}),
    }
    return dataclasses.replace(record, **{name: changes[name] for name in fields})


field_subsets = st.sets(st.sampled_from(MUTABLE_FIELDS), min_size=1).map(frozenset)


def test_case01_workers_is_read_only() -> None:
    context = LoadBalancerContext()
    context.add_worker(worker(1), "conn-1")
    with pytest.raises(TypeError):
        context.workers[worker(1).uid] = (worker(1), "other")  # type: ignore[index]
    with pytest.raises(TypeError):
        del context.workers[worker(1).uid]  # type: ignore[attr-defined]
    assert isinstance(context.workers, Mapping)
    assert isinstance(context, LoadBalancerContextView)


def test_case02_a_captured_view_reflects_later_mutations() -> None:
    context = LoadBalancerContext()
    context.add_worker(worker(2), "conn-2")
    context.add_worker(worker(3), "conn-3")
    view = context.workers
    context.add_worker(worker(1), "conn-1")
    context.update_worker(worker(2, address="moved"), "conn-2b")
    context.remove_worker(worker(3))
    assert list(view) == [worker(2).uid, worker(1).uid]
    assert view[worker(2).uid] == (worker(2, address="moved"), "conn-2b")
    assert worker(3).uid not in view
    assert len(view) == 2


def test_case03_admit_holds_exactly_one_entry() -> None:
    context = LoadBalancerContext()
    context.add_worker(worker(1), "conn")
    assert dict(context.workers) == {worker(1).uid: (worker(1), "conn")}


def test_case04_readmission_replaces_rather_than_duplicates() -> None:
    context = LoadBalancerContext()
    context.add_worker(worker(1), "old")
    context.add_worker(worker(1, version="2.0"), "new")
    assert dict(context.workers) == {worker(1).uid: (worker(1, version="2.0"), "new")}


def test_case05_readmission_after_eviction() -> None:
    context = LoadBalancerContext()
    context.add_worker(worker(1), "old")
    context.remove_worker(worker(1))
    context.add_worker(worker(1, pid=7), "new")
    assert dict(context.workers) == {worker(1).uid: (worker(1, pid=7), "new")}


@given(fields=field_subsets)
def test_case06_refresh_across_the_field_space(fields: frozenset[str]) -> None:
    context = LoadBalancerContext()
    context.add_worker(worker(1), "old")
    fresh = mutated(worker(1), fields)
    assert context.update_worker(fresh, "new")
    assert context.workers[worker(1).uid] == (fresh, "new")
    assert len(context.workers) == 1


def test_case07_repeated_refresh_keeps_one_entry_with_the_last() -> None:
    context = LoadBalancerContext()
    context.add_worker(worker(1), "c0")
    for i in range(1, 6):
        context.update_worker(worker(1, pid=i), f"c{i}")
    assert dict(context.workers) == {worker(1).uid: (worker(1, pid=5), "c5")}


def test_case08_a_stale_record_written_again_wins() -> None:
    context = LoadBalancerContext()
    context.add_worker(worker(1), "c0")
    context.update_worker(worker(1, pid=9), "c9")
    context.update_worker(worker(1), "c0")
    assert context.workers[worker(1).uid] == (worker(1), "c0")


def test_case09_refresh_keeps_iteration_order() -> None:
    context = LoadBalancerContext()
    for n in (1, 2, 3):
        context.add_worker(worker(n), f"c{n}")
    context.update_worker(worker(2, address="moved"), "c2b")
    context.add_worker(worker(2, address="again"), "c2c")
    assert list(context.workers) == [worker(1).uid, worker(2).uid, worker(3).uid]


def test_case10_identity_is_the_uid_never_field_equality() -> None:
    context = LoadBalancerContext()
    context.add_worker(worker(1), "c1")
    clone = dataclasses.replace(worker(1), uid=uuid.UUID(int=99))
    assert not context.update_worker(clone, "clone")
    assert dict(context.workers) == {worker(1).uid: (worker(1), "c1")}


def test_case11_a_refresh_does_not_resurrect_an_evicted_worker() -> None:
    context = LoadBalancerContext()
    context.add_worker(worker(1), "c1")
    context.remove_worker(worker(1))
    assert not context.update_worker(worker(1, pid=2), "c2")
    assert dict(context.workers) == {}


@given(fields=field_subsets)
def test_case12_eviction_matches_by_uid(fields: frozenset[str]) -> None:
    context = LoadBalancerContext()
    context.add_worker(worker(1), "c1")
    context.add_worker(worker(2), "c2")
    context.remove_worker(mutated(worker(1), fields))
    assert list(context.workers) == [worker(2).uid]


def test_case13_evicting_an_absent_uid_changes_nothing() -> None:
    context = LoadBalancerContext()
    context.add_worker(worker(1), "c1")
    context.remove_worker(worker(2))
    assert dict(context.workers) == {worker(1).uid: (worker(1), "c1")}


def test_case14_evicting_from_an_empty_pool_changes_nothing() -> None:
    context = LoadBalancerContext()
    context.remove_worker(worker(1))
    assert dict(context.workers) == {}
    assert len(context.workers) == 0


operations = st.lists(
    st.tuples(
        st.sampled_from(["add", "update", "remove"]),
        st.integers(0, 5),  # few uids, so operations collide on them
        st.integers(0, 3),  # record variant
    ),
    max_size=80,
)


@given(ops=operations)
def test_case15_the_pool_equals_a_uid_keyed_reference_model(
    ops: list[tuple[str, int, int]],
) -> None:
    context = LoadBalancerContext()
    model: dict[uuid.UUID, tuple[WorkerMetadata, str]] = {}
    for op, n, variant in ops:
        record, connection = worker(n, pid=variant), f"conn-{n}-{variant}"
        if op == "add":
            context.add_worker(record, connection)
            model[record.uid] = (record, connection)
        elif op == "update":
            assert context.update_worker(record, connection) == (record.uid in model)
            if record.uid in model:
                model[record.uid] = (record, connection)
        else:
            context.remove_worker(record)
            model.pop(record.uid, None)
        assert list(context.workers.items()) == list(model.items())
        assert len(context.workers) == len(model)
        for m in range(6):
            assert (uuid.UUID(int=m) in context.workers) == (uuid.UUID(int=m) in model)


def test_a_missing_uid_raises_key_error() -> None:
    context = LoadBalancerContext()
    with pytest.raises(KeyError):
        context.workers[uuid.UUID(int=1)]
    assert context.workers.get(uuid.UUID(int=1)) is None
    assert "not a uuid" not in context.workers


def test_many_removals_keep_order_and_lookups() -> None:
    context = LoadBalancerContext()
    for n in range(1000):
        context.add_worker(worker(n), n)
    for n in range(1000):
        if n % 7:
            context.remove_worker(worker(n))
    kept = [n for n in range(1000) if n % 7 == 0]
    assert list(context.workers) == [worker(n).uid for n in kept]
    assert all(context.workers[worker(n).uid][1] == n for n in kept)


def test_entries_are_visible_to_the_garbage_collector() -> None:
    class Connection:
        pass

    context = LoadBalancerContext()
    connection = Connection()
    connection.context = context  # type: ignore[attr-defined]  # a reference cycle
    context.add_worker(worker(1), connection)
    probe = weakref.ref(connection)
    del context, connection
    gc.collect()
    assert probe() is None


def test_the_pool_class_is_public_where_it_says_it_lives() -> None:
    assert (WorkerPool.__module__, WorkerPool.__qualname__) == ("shardline", "WorkerPool")
    assert shardline.WorkerPool is shardline._core.WorkerPool
    assert "WorkerPool" in shardline.__all__
    assert issubclass(LoadBalancerContext, WorkerPool)


@pytest.mark.parametrize(
    "balancer", [RoundRobinLoadBalancer, WeightedRoundRobinLoadBalancer, AffinityLoadBalancer]
)
async def test_a_bare_pool_is_a_balancers_context_held_weakly(balancer: Any) -> None:
    pool = WorkerPool()
    for n in (1, 2, 3):
        pool.add_worker(worker(n), f"conn-{n}")
    serving = balancer()
    assert sorted(await all_failing(serving, pool)) == [worker(n).uid for n in (1, 2, 3)]
    probe = weakref.ref(pool)
    del pool
    gc.collect()
    assert probe() is None
