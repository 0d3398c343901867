"""``WorkerPool.workers.items()`` and ``.values()`` iterate one snapshot of the pool taken when the
iteration starts: a worker evicted (or refreshed, or admitted) mid-iteration changes nothing the
iteration yields, while the views themselves stay live for ``len`` and ``in``."""

from __future__ import annotations

import threading
import uuid
from collections.abc import ItemsView, Iterator, ValuesView
from dataclasses import dataclass
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from shardline import LoadBalancerContext, WorkerMetadata


def record(n: int, version: int = 0) -> WorkerMetadata:
    return WorkerMetadata(
        uid=uuid.UUID(int=n + 1), address=f"127.0.0.1:{1000 + n}", pid=n, version=str(version)
    )


def pool_of(*numbers: int) -> tuple[LoadBalancerContext, dict[int, WorkerMetadata]]:
    pool = LoadBalancerContext()
    records = {n: record(n) for n in numbers}
    for n, rec in records.items():
        pool.add_worker(rec, f"conn-{n}")
    return pool, records


def test_an_eviction_between_two_steps_of_items_changes_nothing_the_iteration_yields() -> None:
    pool, records = pool_of(0, 1, 2)
    expected = [(rec.uid, (rec, f"conn-{n}")) for n, rec in records.items()]
    items = iter(pool.workers.items())
    first = next(items)
    pool.remove_worker(records[1])
    pool.remove_worker(records[2])
    assert [first, *items] == expected


def test_an_eviction_between_two_steps_of_values_changes_nothing_the_iteration_yields() -> None:
    pool, records = pool_of(0, 1, 2)
    values = iter(pool.workers.values())
    first = next(values)
    pool.remove_worker(records[2])
    pool.add_worker(record(1, version=1), "replaced")
    assert [first, *values] == [(records[n], f"conn-{n}") for n in (0, 1, 2)]


def test_an_eviction_from_another_thread_mid_iteration_changes_nothing_it_yields() -> None:
    pool, records = pool_of(*range(5))

    def consume() -> Iterator[tuple[Any, tuple[Any, Any]]]:
        for item in pool.workers.items():
            yield item
            evictor = threading.Thread(target=pool.remove_worker, args=(records[4],))
            evictor.start()
            evictor.join()

    assert [uid for uid, _ in consume()] == [records[n].uid for n in range(5)]
    assert records[4].uid not in pool.workers


@dataclass(frozen=True)
class Hashable:
    """A record the pool accepts (it reads only ``uid``) that can be hashed, so the set
    operations an ``ItemsView`` offers can be tried."""

    uid: uuid.UUID


def test_the_views_stay_live_and_are_items_and_values_views() -> None:
    pool = LoadBalancerContext()
    records = [Hashable(uuid.UUID(int=n + 1)) for n in range(2)]
    for n, rec in enumerate(records):
        pool.add_worker(rec, f"conn-{n}")
    items, values = pool.workers.items(), pool.workers.values()
    assert isinstance(items, ItemsView)
    assert isinstance(values, ValuesView)
    pool.remove_worker(records[0])
    assert len(items) == len(values) == 1
    assert (records[0].uid, (records[0], "conn-0")) not in items
    assert (records[1].uid, (records[1], "conn-1")) in items
    assert (records[1], "conn-1") in values
    assert items == {(records[1].uid, (records[1], "conn-1"))}
    assert items & {(records[1].uid, (records[1], "conn-1")), ("other", None)} == {
        (records[1].uid, (records[1], "conn-1"))
    }
    assert items.isdisjoint({(records[0].uid, (records[0], "conn-0"))})


operations = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 5)),
        st.tuples(st.just("remove"), st.integers(0, 5)),
        st.tuples(st.just("open"), st.sampled_from(["items", "values"])),
        st.tuples(st.just("step"), st.integers(0, 3)),
    ),
    max_size=40,
)


@given(operations)
def test_iterations_interleaved_with_changes_match_a_dict_model(ops: list[tuple[str, Any]]) -> None:
    """Each iteration yields exactly what the model held when it started, however the pool
    changes between its steps; ``len`` and ``in`` of the views follow the pool at once."""
    pool = LoadBalancerContext()
    model: dict[uuid.UUID, tuple[WorkerMetadata, str]] = {}
    version = 0
    # (iterator, what it must yield, what it has yielded so far)
    open_iterations: list[tuple[Iterator[Any], list[Any], list[Any]]] = []
    items, values = pool.workers.items(), pool.workers.values()
    for op, arg in ops:
        if op == "add":
            version += 1
            rec = record(arg, version)
            pool.add_worker(rec, f"conn-{version}")
            model[rec.uid] = (rec, f"conn-{version}")
        elif op == "remove":
            pool.remove_worker(record(arg))
            model.pop(record(arg).uid, None)
        elif op == "open" and arg == "items":
            open_iterations.append((iter(pool.workers.items()), list(model.items()), []))
        elif op == "open":
            open_iterations.append((iter(pool.workers.values()), list(model.values()), []))
        elif open_iterations:
            iterator, _, yielded = open_iterations[arg % len(open_iterations)]
            yielded.extend(item for _, item in zip(range(1), iterator, strict=False))
        assert len(items) == len(values) == len(model)
        assert all(item in items for item in model.items())
        assert all(value in values for value in model.values())
    for iterator, expected, yielded in open_iterations:
        assert yielded + list(iterator) == expected
