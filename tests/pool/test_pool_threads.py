"""The worker pool used from several threads at once (issue 12, pool operations): on a GIL build
its lock is the GIL itself (``rust/py/gil_lock.rs``), so every operation must still be atomic and
leave the pool consistent, whatever the interleaving."""

from __future__ import annotations

import sys
import threading
import uuid

from shardline import LoadBalancerContext, WorkerMetadata

THREADS = 4
ROUNDS = 1000


def worker(n: int, pid: int = 1) -> WorkerMetadata:
    return WorkerMetadata(
        uid=uuid.UUID(int=n), address=f"10.0.0.{n % 250}:5000", pid=pid, version="1"
    )


def test_admits_evictions_and_reads_from_several_threads_leave_the_pool_consistent() -> None:
    pool = LoadBalancerContext()
    steady = [worker(n) for n in range(1, 9)]
    for record in steady:
        pool.add_worker(record, f"conn-{record.uid.int}")
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS + 1)

    def churn(thread: int) -> None:
        mine = [worker(1000 * (thread + 1) + n) for n in range(16)]
        try:
            start.wait()
            for round_ in range(ROUNDS):
                for record in mine:
                    pool.add_worker(record, "conn")
                    pool.update_worker(worker(record.uid.int, pid=round_), "conn-b")
                for uid in list(pool.workers):
                    pool.load(uid)
                    pool.workers.get(uid)  # it may have left meanwhile: None then
                pool.next_in_rotation()
                for record in mine:
                    pool.remove_worker(record)
        except BaseException as error:  # reported by the assertion below
            errors.append(error)

    def read(_: int) -> None:
        try:
            start.wait()
            for _ in range(ROUNDS):
                pool.dispatch_next(None, True)
                assert all(record.uid in pool for record in steady)
                assert len(pool) >= len(steady)
        except BaseException as error:
            errors.append(error)

    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # hand the GIL over as often as the interpreter will
    try:
        threads = [
            threading.Thread(target=churn if n % 2 == 0 else read, args=(n,))
            for n in range(THREADS)
        ]
        for thread in threads:
            thread.start()
        start.wait()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(previous)
    assert errors == []
    assert list(pool.workers) == [record.uid for record in steady]
    assert len(pool) == len(steady)
    assert all(pool.entry(record.uid) == (record, f"conn-{record.uid.int}") for record in steady)
