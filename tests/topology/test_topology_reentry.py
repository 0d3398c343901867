"""No Python code runs while the topology's lock is held: finalizers may re-enter it.

A finalizer can run inside any call into the topology: a garbage-collection pass starts on an
allocation, and a value the topology drops (a replaced owner string, a stored poll text) runs
its own ``__del__``. If either happened while the topology's lock is held, a finalizer that
applies an event or reads a map would wait for that lock forever, on the same thread or on
another one that the finalizer waits for. Each case runs in a child process under a timeout, so
a regression fails instead of freezing the test run.
"""

from __future__ import annotations

import pytest

from support.reentry import REENTRIES, child_code, run_child

pytestmark = pytest.mark.integration

# A finalizer run by a garbage-collection pass inside the call, for every method: (what to
# prepare before each call, the call).
GC_CASES: dict[str, tuple[str, str]] = {
    "apply_tiers": ("u = Topology(); args = ({'c': 10},)", "u.apply_tiers(*args)"),
    "apply_tiers_beyond_a_map": (
        "u = Topology(); u.apply(BucketEvent('c', 1, 20, RS)); args = ({'c': 10},)",
        "try:\n    u.apply_tiers(*args)\nexcept ShardlineError:\n    pass",
    ),
    "apply_instance": (
        "args = (InstanceEvent('replace', INST, address='h:1'),)",
        "t.apply_instance(*args)",
    ),
    "apply_replicaset": (
        "args = (ReplicasetEvent('replace', RS, current_master_uuid=RS2),)",
        "t.apply_replicaset(*args)",
    ),
    "apply_replicaset_new": (
        "args = (ReplicasetEvent('replace', '00000000-0000-0000-0000-00000000a003', tier='z'),)",
        "t.apply_replicaset(*args)",
    ),
    "apply_bucket": ("args = (BucketEvent('a', 51, 60, RS2),)", "t.apply_bucket(*args)"),
    "apply": ("args = (BucketEvent('a', 40, 60, RS2),)", "t.apply(*args)"),
    "apply_bucket_snapshot": (
        "args = ('a', [BucketEvent('a', 1, 30, RS2)])",
        "t.apply_bucket_snapshot(*args)",
    ),
    "apply_bucket_snapshot_text": (
        "args = ('a', text([(1, 30, RS2)]))",
        "t.apply_bucket_snapshot(*args)",
    ),
    "clear": (
        "t.apply(BucketEvent('a', 1, 50, RS))\n"
        "t.apply(ReplicasetEvent('replace', RS, tier='a', current_master_uuid=INST))\n"
        "t.apply(InstanceEvent('replace', INST, replicaset_uuid=RS))",
        "t.clear()",
    ),
    "instances": ("", "t.instances"),
    "replicasets": ("", "t.replicasets"),
    "bucket_maps": ("", "t.bucket_maps"),
    "tiers": ("", "t.tiers"),
    "ranges": ("", "t.ranges('a')"),
    "epoch": ("", "t.epoch('a')"),
    "owner": ("", "t.owner('a', 5)"),
    "owners": ("args = ('a', [1, 5, 70])", "t.owners(*args)"),
    "find_bucket_master": ("", "t.find_bucket_master('a', 5)"),
    "bucket_id": ("", "t.bucket_id('a', 5)"),
    "route": ("", "t.route('a', 5)"),
    "route_many": ("args = ('a', [1, 5, 70])", "t.route_many(*args)"),
    # An array is read without raising (and so without allocating) before the lock is taken.
    "owners_array": (
        "import numpy; args = ('a', numpy.array([1, 5, 70], dtype=numpy.int64))",
        "t.owners(*args)",
    ),
    "route_many_array": (
        "import numpy; args = ('a', numpy.array([1, 5, 70], dtype=numpy.int64))",
        "t.route_many(*args)",
    ),
    "repr": ("", "repr(t)"),
    # Errors are objects too: one must not be made while the lock is held.
    "owner_unknown_tier": (
        "tier = ''.join(['n', 'o'])",
        "try:\n    t.owner(tier, 5)\nexcept ShardlineError:\n    pass",
    ),
    "owner_surrogate_tier": (
        "tier = '\\ud800'",
        "try:\n    t.owner(tier, 5)\nexcept ShardlineError:\n    pass",
    ),
    "ranges_surrogate_tier": (
        "tier = '\\ud800'",
        "try:\n    t.ranges(tier)\nexcept ShardlineError:\n    pass",
    ),
}

# A value the topology stored is dropped by the call: its finalizer runs then.
OWNER = "t.apply(BucketEvent('a', 51, 60, Hook(RS2)))\n"
PAYLOAD = "t.apply_bucket_snapshot('a', Hook(text([(1, 50, RS)])))\n"
DISPLACED_CASES: dict[str, tuple[str, str]] = {
    "owner_by_overlapping_bucket_event": (OWNER, "t.apply_bucket(BucketEvent('a', 55, 70, RS))"),
    "owner_by_apply": (OWNER, "t.apply(BucketEvent('a', 55, 70, RS))"),
    "owner_by_bucket_delete": (
        OWNER,
        "t.apply_bucket(BucketEvent('a', 51, 60, RS2, op='delete'))",
    ),
    "owner_by_partial_bucket_delete": (
        OWNER,
        "t.apply_bucket(BucketEvent('a', 51, 55, RS2, op='delete'))",
    ),
    "owner_by_new_replicaset": (
        OWNER,
        "t.apply_replicaset(ReplicasetEvent("
        "'replace', '00000000-0000-0000-0000-00000000a003', tier='a'))",
    ),
    "owner_by_replicaset_delete": (
        OWNER,
        "t.apply_replicaset(ReplicasetEvent('delete', RS2))",
    ),
    "owner_by_replicaset_tier_change": (
        OWNER,
        "t.apply_replicaset(ReplicasetEvent('replace', RS2, tier='b'))",
    ),
    "owner_by_snapshot": (OWNER, "t.apply_bucket_snapshot('a', [BucketEvent('a', 1, 9, RS)])"),
    "owner_by_clear": (OWNER, "t.clear()"),
    "poll_text_by_clear": (PAYLOAD, "t.clear()"),
    "poll_text_by_next_poll": (PAYLOAD, "t.apply_bucket_snapshot('a', text([(1, 60, RS)]))"),
}


@pytest.mark.parametrize(("reentry", "where"), REENTRIES)
@pytest.mark.parametrize("case", sorted(GC_CASES))
def test_a_gc_pass_inside_a_call_may_re_enter(case: str, reentry: str, where: str) -> None:
    setup, call = GC_CASES[case]
    run_child(child_code(setup, call, reentry, where, gc_pass=True))


@pytest.mark.parametrize(("reentry", "where"), REENTRIES)
@pytest.mark.parametrize("case", sorted(DISPLACED_CASES))
def test_a_displaced_value_may_re_enter_when_dropped(case: str, reentry: str, where: str) -> None:
    setup, call = DISPLACED_CASES[case]
    run_child(child_code(setup, call, reentry, where, gc_pass=False))
