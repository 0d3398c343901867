"""No Python code runs while the pool's lock is held: finalizers may re-enter every method.

A finalizer can run inside any pool method: when the method drops the last reference to an
object (a displaced connection, metadata or uid), or when an allocation starts a garbage
collection. If it runs under the pool's lock and touches the pool — from the same thread, or
by waiting for another thread that does — the process hangs with the GIL held. Each case runs
in a child process under a timeout, so a regression fails instead of freezing the suite.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

# A hang is a deadlock; a healthy child finishes in well under a second.
TIMEOUT = 30

# The records every child script hands the pool (run_script puts them first): all the pool
# reads of one is its uid's int.
RECORDS = r"""
class Uid:
    def __init__(self, n):
        self.int = n


class Metadata:
    def __init__(self, n):
        self.uid = Uid(n)
"""

# argv: pool class, scenario, subject (the object whose finalizer re-enters), re-entry mode.
CHILD = r"""
import gc
import sys
import threading
import weakref

from shardline import LoadBalancerContext, WorkerPool

pool_class, scenario, subject, reentry = sys.argv[1:]
Pool = {"WorkerPool": WorkerPool, "LoadBalancerContext": LoadBalancerContext}[pool_class]


armed = True  # cleared at the end: finalizers at interpreter exit are not under test
completed = []  # one per re-entry that ran to its end
target = None  # () -> the pool a finalizer re-enters


def touch(pool):
    # what a finalizer might do with the pool: read it every way, then write to it
    len(pool)
    Uid(0) in pool
    pool.load(Uid(0))
    pool.uids()
    if isinstance(pool, LoadBalancerContext):
        dict(pool.workers)
    pool.add_worker(Metadata(1000), "extra")
    completed.append(True)


def reenter():
    if not armed:
        return
    pool = target()
    if reentry == "same thread":
        touch(pool)
    else:
        # waiting releases the GIL: the other thread runs while this one is stopped here
        other = threading.Thread(target=touch, args=(pool,))
        other.start()
        other.join()


class Reentering:
    def __del__(self):
        reenter()


class ReenteringMetadata(Metadata, Reentering):
    pass


class ReenteringUid(Uid, Reentering):
    pass


class FreshUidMetadata:
    # each read of `uid` makes a new object, so the pool holds the only reference to its own
    def __init__(self, n):
        self.n = n

    @property
    def uid(self):
        return ReenteringUid(self.n)


class ReenteringKey:
    # a uid whose `int`, read by the pool to key it, re-enters the pool
    def __init__(self, n):
        self.n = n

    @property
    def int(self):
        reenter()
        return self.n


def worker(n):
    # (metadata, connection) where `subject` re-enters when it is finalized
    if subject == "connection":
        return Metadata(n), Reentering()
    if subject == "metadata":
        return ReenteringMetadata(n), "conn"
    return FreshUidMetadata(n), "conn"


def displaced(mutate):
    pool = Pool()
    global target
    target = lambda: pool
    pool.add_worker(*worker(1))
    mutate(pool)


def cleared_by_the_collector():
    class ArmsOnFinalize(Metadata):
        # The collector finalizes it before clearing anything; it arms a callback for its
        # own deallocation, which happens when the pool's `__clear__` drops its entries.
        def __init__(self, n, pool):
            super().__init__(n)
            self.pool = pool

        def __del__(self):
            global target
            # made after the collector cleared the weak references it found
            target = weakref.ref(self.pool)
            callbacks.append(weakref.ref(self, lambda _: reenter()))

    callbacks = []
    pool = Pool()
    # the pool is its own connection: a cycle only the collector frees
    pool.add_worker(ArmsOnFinalize(1, pool), pool)
    del pool
    gc.collect()


def collected_inside(reader):
    pool = Pool()
    global target
    target = lambda: pool
    for n in range(5):
        pool.add_worker(Metadata(n), "conn")
    uid = Uid(1)
    # the bound method and its arguments made in advance: the call itself allocates nothing
    call, args = {
        "entry": lambda: (pool.entry, (uid,)),
        "begin_dispatch": lambda: (pool.begin_dispatch, (uid,)),
        "uids": lambda: (pool.uids, ()),
        "workers[uid]": lambda: (pool.workers.__getitem__, (uid,)),
        "iter(workers)": lambda: (pool.workers.__iter__, ()),
        "workers.items()": lambda: (pool.workers._items_snapshot, ()),
        "workers.values()": lambda: (pool.workers._values_snapshot, ()),
    }[reader]()
    inside = False

    class Garbage:
        __slots__ = ("me",)  # no instance dict: making the cycle allocates one object

        def __del__(self):
            if inside:
                reenter()

    kept = []

    def empty_free_lists(size):
        # New tuples and lists come from free lists first, which never start a collection;
        # hold what they had (a re-entry frees some, refilling them), and every result.
        for n in range(size):
            kept.append((n, -n))
            kept.append([])

    empty_free_lists(3000)
    # With a threshold of 1, the second allocation of a tracked object after a collection
    # starts the next one: the cycle below is the first, the reader's result the second.
    gc.set_threshold(1)
    for _ in range(20):
        empty_free_lists(200)
        gc.collect(0)
        cycle = Garbage()
        cycle.me = cycle
        del cycle
        inside = True
        kept.append(call(*args))
        inside = False


if scenario == "add_worker replaces":
    displaced(lambda pool: pool.add_worker(Metadata(1), "new"))
elif scenario == "update_worker replaces":
    displaced(lambda pool: pool.update_worker(Metadata(1), "new"))
elif scenario == "remove_worker":
    displaced(lambda pool: pool.remove_worker(Metadata(1)))
elif scenario == "update_worker of an absent worker":
    pool = Pool()
    target = lambda: pool
    assert not pool.update_worker(FreshUidMetadata(1), "conn")
elif scenario == "the collector clears the pool":
    cleared_by_the_collector()
elif scenario.startswith("collected inside "):
    collected_inside(scenario.removeprefix("collected inside "))
else:
    method = scenario.removeprefix("reading the uid in ")
    pool = Pool()
    target = lambda: pool
    pool.add_worker(Metadata(1), "conn")
    key = ReenteringKey(1)
    keyed = Metadata(1)
    keyed.uid = key
    {
        "add_worker": lambda: pool.add_worker(keyed, "conn"),
        "update_worker": lambda: pool.update_worker(keyed, "conn"),
        "remove_worker": lambda: pool.remove_worker(keyed),
        "entry": lambda: pool.entry(key),
        "begin_dispatch": lambda: pool.begin_dispatch(key),
        "end_dispatch": lambda: pool.end_dispatch(key, 0.5),
        "load": lambda: pool.load(key),
        "__contains__": lambda: key in pool,
    }[method]()

armed = False
assert completed, "no finalizer re-entered the pool"
print("ok")
"""

# A model check: each connection's finalizer applies one more operation, so operations nest
# inside the drops of others. The pool must end where a uid-keyed ordered dict does when each
# finalizer's operation is applied right after the operation that dropped its connection.
MODEL_CHILD = r"""
from hypothesis import given, settings
from hypothesis import strategies as st

from shardline import WorkerPool


pool = WorkerPool()
model = {}  # n -> connection label, in admission order
labels = iter(range(10**9))


def apply(operation):
    kind, n, then = operation
    label = next(labels)
    if kind == "add":
        model[n] = label  # a replace keeps the dict position, as the pool keeps its slot
        pool.add_worker(Metadata(n), Connection(label, then))
    elif kind == "update":
        if n in model:
            model[n] = label
        pool.update_worker(Metadata(n), Connection(label, then))
    else:
        model.pop(n, None)
        pool.remove_worker(Metadata(n))


class Connection:
    def __init__(self, label, then):
        self.label = label
        self.then = then

    def __del__(self):
        if self.then is not None:
            apply(self.then)


def operations(then):
    return st.tuples(
        st.sampled_from(["add", "update", "remove"]), st.integers(0, 5), then
    )


nested = st.recursive(st.none(), operations, max_leaves=4)


@settings(max_examples=300, deadline=None, database=None)
@given(st.lists(operations(nested), max_size=40))
def check(program):
    for operation in program:
        apply(operation)
        assert [uid.int for uid in pool.uids()] == list(model)
        assert [pool.entry(Uid(n))[1].label for n in model] == list(model.values())
        assert len(pool) == len(model)
    while model:  # a removal's finalizer may admit again; each finalizer runs once
        apply(("remove", next(iter(model)), None))
    assert len(pool) == 0


check()
print("ok")
"""

POOLS = ["WorkerPool", "LoadBalancerContext"]
REENTRIES = ["same thread", "other thread"]


def run_child(pool: str, scenario: str, subject: str, reentry: str) -> None:
    run_script(CHILD, pool, scenario, subject, reentry)


def run_script(script: str, *argv: str) -> None:
    """Runs ``script``, after :data:`RECORDS`, in a child interpreter with ``argv``; it must
    print ``ok`` and nothing on stderr."""
    try:
        result = subprocess.run(
            [sys.executable, "-c", RECORDS + script, *argv],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(argv) or 'the model check'} deadlocked (no answer in {TIMEOUT} s)")
    # a failure inside a finalizer is only printed ("Exception ignored in ..."): stderr counts
    assert (result.returncode, result.stdout, result.stderr) == (0, "ok\n", "")


@pytest.mark.parametrize("reentry", REENTRIES)
@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("subject", ["connection", "metadata", "uid"])
@pytest.mark.parametrize(
    "mutation", ["add_worker replaces", "update_worker replaces", "remove_worker"]
)
def test_a_displaced_entry_is_dropped_after_the_lock(
    mutation: str, subject: str, pool: str, reentry: str
) -> None:
    run_child(pool, mutation, subject, reentry)


@pytest.mark.parametrize("reentry", REENTRIES)
@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize(
    "scenario", ["update_worker of an absent worker", "the collector clears the pool"]
)
def test_a_refused_or_cleared_entry_is_dropped_after_the_lock(
    scenario: str, pool: str, reentry: str
) -> None:
    run_child(pool, scenario, "-", reentry)


@pytest.mark.skipif(
    sys.version_info >= (3, 12),
    reason="from 3.12 the collector runs between bytecodes, never inside an extension's call",
)
@pytest.mark.parametrize("reentry", REENTRIES)
@pytest.mark.parametrize(
    ("pool", "reader"),
    [
        *((pool, reader) for pool in POOLS for reader in ("entry", "begin_dispatch", "uids")),
        ("LoadBalancerContext", "workers[uid]"),
        ("LoadBalancerContext", "iter(workers)"),
        ("LoadBalancerContext", "workers.items()"),
        ("LoadBalancerContext", "workers.values()"),
    ],
)
def test_a_collection_inside_a_reading_method_may_write_to_the_pool(
    pool: str, reader: str, reentry: str
) -> None:
    run_child(pool, f"collected inside {reader}", "-", reentry)


@pytest.mark.parametrize("reentry", REENTRIES)
@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize(
    "method",
    [
        "add_worker",
        "update_worker",
        "remove_worker",
        "entry",
        "begin_dispatch",
        "end_dispatch",
        "load",
        "__contains__",
    ],
)
def test_the_uid_is_read_before_the_lock(method: str, pool: str, reentry: str) -> None:
    run_child(pool, f"reading the uid in {method}", "-", reentry)


def test_finalizers_that_write_leave_the_pool_equal_to_a_reference_model() -> None:
    run_script(MODEL_CHILD)
