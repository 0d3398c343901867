"""``WorkerProxy.explain(task)`` (issue 15, part 2): the candidates the balancer would offer
now and why, without dispatching and without moving any balancer state: each built-in's
reasons, plugins driven on a copy, the pool's ``rotation_order``. The check that an explanation
lists, in order, the workers the next dispatch tries, for every built-in through both
protocols, is in test_proxy_explain_model.py."""

from __future__ import annotations

import doctest
import random
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardline import (
    AffinityLoadBalancer,
    BucketEvent,
    BucketLoadBalancer,
    InstanceEvent,
    LeastLoadedLoadBalancer,
    LoadBalancerContext,
    ReplicasetEvent,
    RoundRobinLoadBalancer,
    SelectLoadBalancer,
    Topology,
    TransientRpcError,
    WeightedRoundRobinLoadBalancer,
    WorkerMetadata,
    WorkerProxy,
)
from shardline.balancers.explanation import explain_dispatch
from shardline.balancers.per_context import PerContext
from shardline.balancers.protocol import Tried
from support.explain_fakes import Feed, Workers, offered, record, uid
from support.paths import ROOT


async def test_explaining_round_robin_does_not_move_the_rotation() -> None:
    workers, feed = Workers(), Feed()
    async with WorkerProxy(discovery=feed.events(), connect=workers.connect, quorum=0) as proxy:
        for n in (1, 2, 3):
            await feed.send("worker-added", record(n))
        await proxy.dispatch("x")  # the rotation now stands at 2
        for _ in range(5):
            explanation = proxy.explain("x")
        assert explanation.protocol == "pool-rotation"
        assert [c.uid for c in explanation.candidates] == [uid(2), uid(3), uid(1)]
        assert [c.why for c in explanation.candidates] == [
            "next in the pool's rotation",
            "2nd in the pool's rotation",
            "3rd in the pool's rotation",
        ]
        assert explanation.candidates[0].address == "10.0.0.2:5000"
        assert [await proxy.dispatch("x") for _ in range(3)] == [uid(2), uid(3), uid(1)]


def test_round_robin_on_a_context_of_its_own_explains_its_own_rotation() -> None:
    class Context:
        def __init__(self) -> None:
            self.workers = {uid(n): (record(n), None) for n in (1, 2, 3)}

    context, balancer = Context(), RoundRobinLoadBalancer()
    assert balancer.select(None, context=context, tried={}) == uid(1)
    order = balancer.explain_candidates(None, context=context)
    assert [c.uid for c in order.candidates] == [uid(2), uid(3), uid(1)]
    assert order.candidates[0].why == "next in this balancer's rotation"
    assert balancer.select(None, context=context, tried={}) == uid(2)  # it did not move


def test_weighted_explains_weights_scores_and_exclusions() -> None:
    pool = LoadBalancerContext()
    for n, weight in ((1, 5), (2, 1), (3, 0)):
        pool.add_worker(record(n, weight), None)
    balancer = WeightedRoundRobinLoadBalancer()
    order = balancer.explain_candidates(None, context=pool)
    assert [c.uid for c in order.candidates] == [uid(1), uid(2)]
    assert order.candidates[0].why == (
        "next in smooth weighted round robin: weight 5, score 5 (highest of 2 untried)"
    )
    assert order.candidates[1].why == (
        "2nd in smooth weighted round robin: weight 1, score 2 (the only one left)"
    )
    assert [(e.uid, e.why) for e in order.excluded] == [
        (uid(3), "weight 0 is not a positive number")
    ]
    # over calls (5:1, interleaved): explaining between calls foretells each and moves nothing
    picks = []
    for _ in range(6):
        first = balancer.explain_candidates(None, context=pool).candidates[0].uid
        assert balancer.select(None, context=pool, tried={}) == first
        picks.append(first.int)
    assert picks == [1, 1, 1, 2, 1, 1]


def test_weighted_with_no_usable_weight_says_so() -> None:
    pool = LoadBalancerContext()
    pool.add_worker(record(1, 0), None)
    order = WeightedRoundRobinLoadBalancer().explain_candidates(None, context=pool)
    assert order.candidates == ()
    assert order.why_none == "no pooled worker has a usable weight"


def test_least_loaded_shows_the_pair_and_the_load_that_decided() -> None:
    pool = LoadBalancerContext()
    for n in (1, 2):
        pool.add_worker(record(n), None)
    pool.begin_dispatch(uid(1))  # 1 in flight on worker 1
    balancer = LeastLoadedLoadBalancer(random.Random(3))
    order = balancer.explain_candidates(None, context=pool)
    assert [c.uid for c in order.candidates] == [uid(2), uid(1)]
    assert order.candidates[0].why.startswith(f"next: drawn with {uid(1)}, as cheap or cheaper: 0")
    assert "against 1 in flight" in order.candidates[0].why
    assert order.candidates[1].why.startswith("2nd: the only one left (1 in flight")


def test_least_loaded_with_an_unpredictable_generator_lists_by_load() -> None:
    pool = LoadBalancerContext()
    for n in (1, 2):
        pool.add_worker(record(n), None)
    pool.begin_dispatch(uid(1))
    order = LeastLoadedLoadBalancer(random.SystemRandom()).explain_candidates(None, context=pool)
    assert [c.uid for c in order.candidates] == [uid(2), uid(1)]
    assert order.candidates[0].why.startswith("by load: 0 in flight")
    assert order.notes[0].startswith("the draws cannot be predicted")


def test_affinity_explains_the_key_and_its_scores() -> None:
    pool = LoadBalancerContext()
    for n in (1, 2, 3):
        pool.add_worker(record(n), None)
    balancer = AffinityLoadBalancer()
    order = balancer.explain_candidates("user-7", context=pool)
    assert [c.uid for c in order.candidates] == balancer.order("user-7", list(pool.workers))
    assert "highest score 0x" in order.candidates[0].why
    assert "for key 'user-7' (the key stays here while it is pooled)" in order.candidates[0].why
    assert order.candidates[1].why.startswith("affinity: 2nd highest score 0x")


# The keyed balancer: a topology with one replicaset of three instances on tier "default".
RS = "6f1a0c4e-0000-4000-8000-000000000001"
INSTANCES = [f"9c2b7d10-0000-4000-8000-00000000000{n}" for n in (1, 2, 3)]


class Task:
    def __init__(self, key: str, read_only: bool = False) -> None:
        self.key, self.read_only = key, read_only


def keyed() -> tuple[Topology, LoadBalancerContext]:
    topology = Topology()
    topology.apply_tiers({"default": 3000})
    topology.apply(ReplicasetEvent("replace", RS, tier="default", current_master_uuid=INSTANCES[0]))
    pool = LoadBalancerContext()
    for n, text in enumerate(INSTANCES, 1):
        topology.apply(
            InstanceEvent(
                "replace",
                text,
                replicaset_uuid=RS,
                current_state="Online",
                address=f"10.0.1.{n}:3301",
                name=f"storage-{n}",
            )
        )
        pool.add_worker(WorkerMetadata(uuid.UUID(text), f"10.0.1.{n}:3301", n, "1"), None)
    topology.apply(BucketEvent("default", 1, 3000, RS))
    return topology, pool


def test_bucket_explains_the_owner_and_for_a_read_its_replicas() -> None:
    topology, pool = keyed()
    balancer = BucketLoadBalancer(topology, "default")
    write = balancer.explain_candidates(Task("user-42"), context=pool)
    assert [c.uid for c in write.candidates] == [uuid.UUID(INSTANCES[0])]
    why = write.candidates[0].why
    assert why.startswith(
        "master (Online) of the owner of bucket 2050: bucket 2050 is in [1, 3000]"
    )
    assert why.endswith("is at '10.0.1.1:3301' [tier epoch 1]")
    assert write.notes == ("a write: offered the master only",)
    read = balancer.explain_candidates(Task("user-42", read_only=True), context=pool)
    assert [c.uid for c in read.candidates] == [uuid.UUID(text) for text in INSTANCES]
    assert read.candidates[1].why == (
        f"1st replica of replicaset {RS}: a read-only task, offered after its master"
    )
    # the same order select follows, each candidate failing
    tried: dict[uuid.UUID, Exception | None] = {}
    while (picked := balancer.select(Task("user-42", True), context=pool, tried=tried)) is not None:
        tried[picked] = TransientRpcError("busy")
        if len(tried) == 3:
            break
    assert list(tried) == [c.uid for c in read.candidates]


def test_bucket_explains_a_miss_without_asking_for_a_refresh() -> None:
    topology, pool = keyed()
    asked: list[int] = []
    balancer = BucketLoadBalancer(topology, "default", on_miss=lambda: asked.append(1))
    topology.apply(ReplicasetEvent("replace", RS.replace("01", "02"), tier="default"))
    order = balancer.explain_candidates(Task("user-42"), context=pool)
    assert order.candidates == ()
    assert order.why_none is not None
    assert order.why_none.startswith("no route for bucket 2050 of tier 'default': no range")
    assert "joined tier 'default'" in order.why_none
    assert order.notes[0].startswith("a dispatch would call on_miss")
    assert asked == []


async def test_bucket_through_the_proxy_first_is_what_dispatch_serves() -> None:
    topology, _ = keyed()
    workers, feed = Workers(), Feed()
    balancer = BucketLoadBalancer(topology, "default")
    async with WorkerProxy(
        discovery=feed.events(), loadbalancer=balancer, connect=workers.connect, quorum=0
    ) as proxy:
        for n, text in enumerate(INSTANCES, 1):
            await feed.send("worker-added", WorkerMetadata(uuid.UUID(text), f"a{n}", n, "1"))
        explanation = proxy.explain(Task("k", read_only=True))
        workers.failing = {uuid.UUID(INSTANCES[0])}
        await proxy.dispatch(Task("k", read_only=True))
        assert workers.log == offered(explanation, workers.failing)
        assert explanation.candidates[0].address == "a1"
        # a master not pooled is listed, and the proxy would skip it
        await feed.send("worker-dropped", WorkerMetadata(uuid.UUID(INSTANCES[0]), "a1", 1, "1"))
        dropped = proxy.explain(Task("k"))
        assert not dropped.candidates[0].pooled
        assert dropped.first is None
        assert "not pooled: skipped" in str(dropped)


class RotationPlugin(SelectLoadBalancer):
    """A plugin with no explain_candidates that uses the pool's rotation, offers at most two
    workers per call and keeps a count."""

    needs_load = False

    def __init__(self) -> None:
        self.calls = 0

    def select(self, task: Any, *, context: Any, tried: Tried) -> uuid.UUID | None:
        self.calls += 1
        if len(tried) >= 2:
            return None
        return context.next_in_rotation(tried)  # type: ignore[no-any-return]


class GeneratorPlugin:
    """A plugin written against delegate alone: the pool in admission order."""

    def __init__(self) -> None:
        self.calls = 0

    async def delegate(self, task: Any, *, context: Any) -> AsyncIterator[uuid.UUID]:
        self.calls += 1
        for worker in list(context.workers):
            try:
                served = yield worker
            except Exception:
                continue
            if served is not None:
                return


@pytest.mark.parametrize("plugin", [RotationPlugin, GeneratorPlugin])
async def test_a_plugin_is_driven_on_a_copy_over_a_read_only_pool(
    plugin: Callable[[], Any],
) -> None:
    workers, feed = Workers(), Feed()
    balancer = plugin()
    async with WorkerProxy(
        discovery=feed.events(), loadbalancer=balancer, connect=workers.connect, quorum=0
    ) as proxy:
        for n in (1, 2, 3):
            await feed.send("worker-added", record(n))
        await proxy.dispatch("x")
        calls = balancer.calls
        explanation = proxy.explain("x")
        assert balancer.calls == calls  # the copy was driven, not the balancer
        assert explanation.method == "copy"
        assert explanation.notes[0].startswith(f"plugin {plugin.__name__} has no")
        assert explanation.candidates[0].why == "1st offer"
        # the plugin on the pool's rotation continues it (the rotation stands at 2)
        order = [2, 3] if plugin is RotationPlugin else [1, 2, 3]
        assert [c.uid for c in explanation.candidates] == [uid(n) for n in order]
        assert "candidates as a copy of it offers them" in str(explanation)
        workers.failing, workers.log = {uid(2)}, []
        await proxy.dispatch("x")
        assert workers.log == offered(explanation, workers.failing)


async def test_a_plugin_that_cannot_be_copied_is_not_driven() -> None:
    class Locked(RotationPlugin):
        def __init__(self) -> None:
            super().__init__()
            self.lock = threading.Lock()  # no copy of a lock can be made

    balancer, feed = Locked(), Feed()
    async with WorkerProxy(
        discovery=feed.events(), loadbalancer=balancer, connect=Workers().connect, quorum=0
    ) as proxy:
        await feed.send("worker-added", record(1))
        explanation = proxy.explain("x")
    assert balancer.calls == 0
    assert explanation.method == "unexplained"
    assert explanation.candidates == ()
    assert explanation.why_none == "not explainable"
    assert "cannot be copied" in explanation.notes[0]


async def test_the_text_reads_for_an_operator() -> None:
    workers, feed = Workers(), Feed()
    async with WorkerProxy(
        discovery=feed.events(), loadbalancer="weighted", connect=workers.connect, quorum=0
    ) as proxy:
        assert str(proxy.explain("x")).splitlines()[1] == "  no candidates: no worker is pooled"
        await feed.send("worker-added", record(1, 3))
        await feed.send("worker-added", record(2, 0))
        text = str(proxy.explain("x"))
    assert text.splitlines() == [
        "balancer shardline.balancers.weighted.WeightedRoundRobinLoadBalancer via select; 2 pooled",
        f"  1. {uid(1)} (10.0.0.1:5000): next in smooth weighted round robin: weight 3, score 3"
        " (the only one left)",
        f"  excluded {uid(2)} (10.0.0.2:5000): weight 0 is not a positive number",
    ]


def test_the_operations_page_example_runs_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    # each print is followed by comment lines saying, line for line, what it prints
    doc = ROOT / "docs" / "operations.md"
    section = doc.read_text(encoding="utf-8").split("## Where would this task go?\n", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    expected = [
        line.strip()[2:]
        for line in code.splitlines()
        if line.strip().startswith("# ") and "discovery goes on" not in line
    ]
    exec(compile(code, str(doc), "exec"), {"__name__": "operations"})
    assert capsys.readouterr().out.splitlines() == expected


def test_the_module_examples_run() -> None:
    from shardline.balancers import explanation

    assert doctest.testmod(explanation).failed == 0
    assert doctest.testmod(explanation).attempted >= 4


class CountingPlugin(SelectLoadBalancer):
    """A plugin keeping a count per pool (a PerContext): each call starts at the worker whose
    index is the number of calls so far."""

    needs_load = False

    def __init__(self) -> None:
        self.counts = PerContext(lambda: [0])

    def select(self, task: Any, *, context: Any, tried: Tried) -> uuid.UUID | None:
        count = self.counts.of(context)
        uids = list(context.workers)
        if not tried:
            count[0] += 1
        left = [u for u in uids[(count[0] - 1) % len(uids) :] + uids if u not in tried]
        return left[0] if left else None


def test_a_plugins_per_pool_state_is_copied_onto_the_view() -> None:
    pool = LoadBalancerContext()
    for n in (1, 2, 3):
        pool.add_worker(record(n), None)
    plugin = CountingPlugin()
    for _ in range(2):
        plugin.select(None, context=pool, tried={})  # its count for the pool is now 2
    explanation = explain_dispatch(plugin, None, pool, protocol="select", select=plugin.select)
    assert [c.uid for c in explanation.candidates] == [uid(3), uid(1), uid(2)]
    assert plugin.counts.of(pool) == [2]  # the copy counted, not the plugin
    assert plugin.select(None, context=pool, tried={}) == explanation.first


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["add", "remove", "next"]), st.integers(1, 12)), max_size=60
    )
)
def test_rotation_order_is_what_the_rotation_hands_out_next(steps: list[tuple[str, int]]) -> None:
    pool = LoadBalancerContext()
    for op, n in steps:
        if op == "add":
            pool.add_worker(record(n), None)
        elif op == "remove":
            pool.remove_worker(record(n))  # enough removals compact the pool's slots
        else:
            pool.next_in_rotation()
        order = pool.rotation_order()
        assert pool.rotation_order() == order  # reading it moved nothing
        assert sorted(order) == sorted(pool.workers)
        handed: dict[uuid.UUID, None] = {}
        while (picked := pool.next_in_rotation(handed)) is not None:
            handed[picked] = None
        assert list(handed) == order
