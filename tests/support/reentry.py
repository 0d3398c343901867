"""Finalizers that re-enter the topology, run in a child process: :data:`PRELUDE` sets up a
topology and the finalizers (a garbage cycle's, a kept string's) that apply an event to it or
read a map, on the same thread or on another one; :func:`child_code` wraps a case (what to
prepare, the call) around it, with a garbage-collection pass armed at each of the first
:data:`SKIPS` allocations of the call or with the dropped value's finalizer; :func:`run_child`
runs it under a timeout, so that a deadlock fails the test instead of freezing the run.
:data:`REENTRIES` are the four ways a finalizer re-enters. The re-entry tests of
``Topology`` and of its explain paths share them.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

TIMEOUT = 60

PRELUDE = """
import gc, json, sys, threading
from shardline import (
    BucketEvent, InstanceEvent, ReplicasetEvent, ShardlineError, Topology,
)

RS = "00000000-0000-0000-0000-00000000a001"
RS2 = "00000000-0000-0000-0000-00000000a002"
INST = "00000000-0000-0000-0000-00000000b001"
t = Topology()
t.apply_tiers({"a": 100, "b": 100})
t.apply(ReplicasetEvent("replace", RS, tier="a", current_master_uuid=INST))
t.apply(ReplicasetEvent("replace", RS2, tier="a"))
t.apply(InstanceEvent("replace", INST, replicaset_uuid=RS, current_state="Online"))
t.apply(BucketEvent("a", 1, 50, RS))
ran = []


def reenter():
    if REENTRY == "apply":
        t.apply(BucketEvent("b", 1, 10, RS))
    else:
        t.ranges("a")
        t.bucket_maps


def finalizer():
    if WHERE == "thread":
        worker = threading.Thread(target=reenter)
        worker.start()
        worker.join()
    else:
        reenter()
    ran.append(True)


class Cycle:
    def __init__(self):
        self.me = self

    def __del__(self):
        finalizer()


class Hook(str):
    \"\"\"A str the topology keeps (an owner uuid, a poll text) whose finalizer re-enters.\"\"\"

    def __del__(self):
        finalizer()


def text(ranges):
    return json.dumps([
        {"bucket_id_start": s, "bucket_id_end": e, "current_replicaset_uuid": o,
         "state": "active", "tier_name": "a"}
        for s, e, o in ranges
    ])


def arm_gc(skip):
    # Garbage cycles with finalizers, collected when the call under test (prepared before
    # arming, so that nothing else allocates) makes its tracked object number skip + 1.
    gc.disable()
    gc.collect()
    for _ in range(3):
        Cycle()
    gc.set_threshold(gc.get_count()[0] + skip)
    gc.enable()


def disarm_gc():
    gc.set_threshold(700)
    gc.collect()
"""

# A collection is started by the first, second, ... allocation inside the call under test.
SKIPS = 8


def child_code(setup: str, call: str, reentry: str, where: str, *, gc_pass: bool) -> str:
    if gc_pass:
        body = "\n".join(
            [
                f"for skip in range({SKIPS}):",
                *(
                    textwrap.indent(part, "    ")
                    for part in (setup, "arm_gc(skip)", call, "disarm_gc()")
                ),
            ]
        )
    else:
        body = "\n".join([setup, call, "gc.collect()"])
    return "\n".join(
        [
            f"REENTRY = {reentry!r}",
            f"WHERE = {where!r}",
            PRELUDE,
            body,
            "assert ran, 'the finalizer never ran: the case tests nothing'",
            "t.apply(BucketEvent('b', 20, 30, RS))",
            "assert t.ranges('b')[-1] == (20, 30, RS)",
            "print('ok')",
        ]
    )


def run_child(code: str) -> None:
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"deadlock: the child did not finish within {TIMEOUT} s")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok", done.stdout + done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr


REENTRIES = [
    pytest.param("apply", "same", id="apply-same-thread"),
    pytest.param("read", "same", id="read-same-thread"),
    pytest.param("apply", "thread", id="apply-other-thread"),
    pytest.param("read", "thread", id="read-other-thread"),
]
