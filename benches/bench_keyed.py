"""The keyed dispatch decision (issue 6): ``BucketLoadBalancer``'s first candidate against
round-robin's, on the same pool.

Per pool size (8 and 1,024 workers, as ``round-robin decision`` in ``bench_pool.py``), one
group, ``keyed decision, {size} workers``, timing a ``delegate`` driven to its first candidate,
which succeeds (``asend``), exactly as ``bench_pool.py`` drives round-robin:

- ``bucket delegate``: ``BucketLoadBalancer`` — the task's key hashed to its bucket, the
  bucket's owner and its master looked up (one ``Topology.route`` call), the master's uid;
- ``round-robin delegate``: ``RoundRobinLoadBalancer`` on the same pool and the same tasks;
- ``route only``: ``Topology.route`` and the uid lookup without the generator, the floor of
  the keyed decision.

The pool holds every instance of a tier of ``size / 2`` replicasets (a master and a replica
each) whose 3,000 buckets are cut into one range per replicaset, as ``TopologyDiscovery``
would pool them. Keys are seeded random ``"user:N"`` strings, a new block per round. Before
timing, every key's first candidate must be the master the topology routes it to, and
round-robin must make one full rotation in admission order.

``keyed decision, interleaved`` times a block of bucket decisions and a block of round-robin
decisions back to back in every round (in alternating order), as ``bench_goals.py`` does, for
a ratio per round that a drift of the machine cannot skew: ``extra_info`` holds ``ours_ns``
(bucket), ``theirs_ns`` (round-robin), their minimums, and ``ratio`` (round-robin / bucket,
median over the rounds, with its quartiles).
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from shardline import (
    BucketEvent,
    InstanceEvent,
    LoadBalancerContext,
    ReplicasetEvent,
    RoundRobinLoadBalancer,
    Topology,
)
from shardline.balancers.bucket import BucketLoadBalancer
from shardline.discovery.topology import instance_record

from .benchkit import CALLS_PER_ROUND, PROBES, SEED, TIER, blocks, interleaved_summary
from .delegate_decisions import first_candidates

pytest.importorskip("pytest_benchmark")

BUCKETS = 3000
SIZES = [8, 1024]
IMPLS = ["bucket delegate", "round-robin delegate", "route only"]


@dataclass(frozen=True, slots=True)
class KeyedTask:
    key: str


def cluster(size: int) -> tuple[Topology, LoadBalancerContext]:
    """A tier of ``size // 2`` replicasets (master + replica), and the pool of its instances."""
    rng = random.Random(f"{SEED}/keyed/{size}")
    topology = Topology()
    topology.apply_tiers({TIER: BUCKETS})
    pool = LoadBalancerContext()
    n_replicasets = size // 2
    bounds = [BUCKETS * n // n_replicasets for n in range(n_replicasets + 1)]
    ranges = []
    for n in range(n_replicasets):
        replicaset = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        instances = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(2)]
        topology.apply(
            ReplicasetEvent("replace", replicaset, tier=TIER, current_master_uuid=instances[0])
        )
        for k, instance in enumerate(instances):
            topology.apply(
                InstanceEvent(
                    "replace",
                    instance,
                    replicaset_uuid=replicaset,
                    current_state="Online",
                    address=f"127.0.0.1:{10000 + 2 * n + k}",
                )
            )
        ranges.append(BucketEvent(TIER, bounds[n] + 1, bounds[n + 1], replicaset))
    # after every replicaset: a new replicaset clears its tier's map
    assert topology.apply_bucket_snapshot(TIER, ranges)
    replicasets = topology.replicasets
    for instance in topology.instances.values():
        record = instance_record(instance, replicasets[instance.replicaset_uuid or ""])
        assert record is not None
        pool.add_worker(record, f"conn-{instance.uuid}")
    assert len(pool) == size
    assert len(topology.ranges(TIER)) == n_replicasets
    return topology, pool


def tasks() -> list[KeyedTask]:
    rng = random.Random(f"{SEED}/keyed-keys")
    return [KeyedTask(f"user:{rng.getrandbits(40)}") for _ in range(PROBES)]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("size", SIZES)
def test_keyed_decision(benchmark: Any, per_call: Callable[..., Any], size: int, impl: str) -> None:
    topology, pool = cluster(size)
    probes = tasks()
    loop = asyncio.new_event_loop()
    bucket = BucketLoadBalancer(topology, TIER)
    expected = []
    for task in probes:
        master = topology.route(TIER, task.key)
        assert master is not None
        expected.append(uuid.UUID(master.uuid))
    # what is timed is checked first
    assert loop.run_until_complete(first_candidates(bucket, pool, probes)) == expected
    rotation = loop.run_until_complete(
        first_candidates(RoundRobinLoadBalancer(), pool, probes[:size])
    )
    assert rotation == list(pool.workers)
    next_block = blocks(probes).__next__

    if impl == "route only":
        uids = {str(uid): uid for uid in pool.uids()}
        route, get = topology.route, uids.get

        def round_fn() -> list[uuid.UUID | None]:
            return [get(route(TIER, task.key).uuid) for task in next_block()]  # type: ignore[union-attr]

        assert [uids[str(uid)] for uid in expected] == [
            get(route(TIER, task.key).uuid)  # type: ignore[union-attr]
            for task in probes
        ]
    else:
        balancer = bucket if impl == "bucket delegate" else RoundRobinLoadBalancer()

        def round_fn() -> list[uuid.UUID]:
            return loop.run_until_complete(first_candidates(balancer, pool, next_block()))

    benchmark.group = f"keyed decision, {size:,} workers"
    per_call(round_fn, CALLS_PER_ROUND, impl=f"shardline {impl}")
    loop.close()


INTERLEAVED_ROUNDS = 600
INTERLEAVED_WARMUP = 20


@pytest.mark.parametrize("size", SIZES)
def test_keyed_vs_round_robin_interleaved(
    benchmark: Any, per_call: Callable[..., Any], size: int
) -> None:
    topology, pool = cluster(size)
    probes = tasks()
    loop = asyncio.new_event_loop()
    bucket, round_robin = BucketLoadBalancer(topology, TIER), RoundRobinLoadBalancer()
    for task, chosen in zip(
        probes, loop.run_until_complete(first_candidates(bucket, pool, probes)), strict=True
    ):
        master = topology.route(TIER, task.key)
        assert master is not None
        assert chosen == uuid.UUID(master.uuid)
    ours_blocks, theirs_blocks = blocks(probes), blocks(probes)
    ours_ns: list[int] = []
    theirs_ns: list[int] = []
    flip = itertools.cycle([False, True])
    clock, run = time.perf_counter_ns, loop.run_until_complete

    def timed(balancer: Any, block: Any, into: list[int]) -> None:
        t0 = clock()
        run(first_candidates(balancer, pool, block))
        into.append(clock() - t0)

    def round_() -> None:
        if next(flip):
            timed(round_robin, next(theirs_blocks), theirs_ns)
            timed(bucket, next(ours_blocks), ours_ns)
        else:
            timed(bucket, next(ours_blocks), ours_ns)
            timed(round_robin, next(theirs_blocks), theirs_ns)

    benchmark.group = "keyed decision, interleaved"
    per_call(
        round_,
        2 * CALLS_PER_ROUND,
        rounds=INTERLEAVED_ROUNDS,
        warmup=INTERLEAVED_WARMUP,
        impl=f"shardline bucket vs round-robin delegate, {size:,} workers",
    )
    benchmark.extra_info.update(
        interleaved_summary(
            ours_ns[INTERLEAVED_WARMUP:], theirs_ns[INTERLEAVED_WARMUP:], CALLS_PER_ROUND
        )
    )
    loop.close()
