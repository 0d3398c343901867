"""The seed's cases 51-54 (`TestWorkerUpdatePropagation`): real worker processes, real
discovery (LocalDiscovery, and etcd), a WorkerProxy dispatching over gRPC.

Every case starts worker A (uid U) and a proxy with ``lease=1`` that admits it, then worker B
(uid V), which discovery registers but the proxy, at its lease, never admits. Workers answer
``whoami`` with their process id, so a test knows which process served.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest

from shardline import NoWorkersAvailable, WorkerMetadata, WorkerProxy
from shardline.discovery import Discovery, Subscription
from shardline.transport import Task, connect
from support import transport_servers
from support.discovery_contract import take
from support.transport_servers import new_namespace
from support.waiting import until
from support.worker_processes import Backend, WorkerProcess, worker_process

pytestmark = [
    pytest.mark.integration,
    pytest.mark.usefixtures("balancer_protocol"),  # each test through both protocols
    pytest.mark.async_timeout(transport_servers.WAIT),
]


async def served_by(proxy: WorkerProxy) -> int:
    answer = await proxy.dispatch(Task("whoami"))
    assert isinstance(answer, dict)
    return int(answer["pid"])


@dataclasses.dataclass
class Scene:
    """A admitted (the proxy's only worker), B registered but never admitted."""

    proxy: WorkerProxy
    discovery: Discovery
    watcher: Subscription
    a: WorkerProcess
    a_record: WorkerMetadata
    b: WorkerProcess
    b_record: WorkerMetadata

    async def publish(self, kind: str, metadata: WorkerMetadata) -> None:
        await self.discovery.publisher.publish(kind, metadata)  # type: ignore[arg-type]
        seen = await take(self.watcher, 1)
        assert [(event.type, event.metadata) for event in seen] == [(kind, metadata)]

    def pooled(self) -> list[tuple[uuid.UUID, str]]:
        return [(metadata.uid, metadata.address) for metadata in self.proxy.workers]

    async def move_a_to_b(self) -> WorkerMetadata:
        """Republishes A's uid at B's address (``worker-updated``); returns that record once
        the proxy pools it."""
        moved = dataclasses.replace(self.a_record, address=self.b_record.address)
        await self.publish("worker-updated", moved)
        await until(lambda: self.pooled() == [(moved.uid, moved.address)], "the refresh")
        return moved


async def scene(tmp_path: Path, backend: Backend, case: Callable[[Scene], Awaitable[None]]) -> None:
    arguments, open_discovery = backend
    namespace = new_namespace()

    def start() -> AbstractAsyncContextManager[WorkerProcess]:
        return worker_process(
            tmp_path, "--namespace", namespace, "--address", "127.0.0.1:0", *arguments
        )

    discovery = open_discovery(namespace)
    try:
        async with start() as a:
            a_record = await a.ready()
            watcher = discovery.subscribe()
            assert [event.metadata.uid for event in await take(watcher, 1)] == [a_record.uid]
            proxy = WorkerProxy(discovery=discovery.subscribe(), connect=connect, lease=1)
            async with proxy, start() as b:
                b_record = await b.ready()
                assert [event.metadata for event in await take(watcher, 1)] == [b_record]
                assert await served_by(proxy) == a.process.pid
                await case(Scene(proxy, discovery, watcher, a, a_record, b, b_record))
    finally:
        await discovery.aclose()


async def test_case51_an_update_republishing_the_uid_at_a_new_address_moves_dispatch_there(
    tmp_path: Path, backend: Backend
) -> None:
    async def case(s: Scene) -> None:
        await s.move_a_to_b()
        assert [await served_by(s.proxy) for _ in range(3)] == [s.b.process.pid] * 3

    await scene(tmp_path, backend, case)


async def test_case52_stopping_the_original_process_leaves_dispatch_on_the_second_worker(
    tmp_path: Path, backend: Backend
) -> None:
    async def case(s: Scene) -> None:
        moved = await s.move_a_to_b()
        s.a.process.terminate()
        assert await s.a.exit_status() == 0
        # A withdrew only what it still owned: the moved record is the test's now, and stays.
        # A later update of it is the barrier: A's withdrawal came before it, so had A dropped
        # the record, the pool would be empty by then and the update (of a worker the pool
        # does not hold) admit nothing
        await s.publish("worker-updated", dataclasses.replace(moved, version="2"))
        await until(lambda: [w.version for w in s.proxy.workers] == ["2"], "the update")
        assert s.pooled() == [(moved.uid, moved.address)]
        assert [await served_by(s.proxy) for _ in range(3)] == [s.b.process.pid] * 3

    await scene(tmp_path, backend, case)


async def test_case53_a_drop_of_the_moved_uid_leaves_no_ghost_worker(
    tmp_path: Path, backend: Backend
) -> None:
    async def case(s: Scene) -> None:
        moved = await s.move_a_to_b()
        await s.publish("worker-dropped", moved)
        await until(lambda: s.pooled() == [], "the drop")
        with pytest.raises(NoWorkersAvailable):
            await s.proxy.dispatch(Task("whoami"))

    await scene(tmp_path, backend, case)


async def test_case54_an_update_for_a_worker_never_admitted_neither_admits_it_nor_grows_the_pool(
    tmp_path: Path, backend: Backend
) -> None:
    async def case(s: Scene) -> None:
        # free the only slot, then update B: an upsert would admit B now
        await s.publish("worker-dropped", s.a_record)
        await until(lambda: s.pooled() == [], "the drop")
        await s.publish("worker-updated", dataclasses.replace(s.b_record, version="2"))
        # A worker announced after the update takes the free slot, which an update that had
        # admitted B would have filled (lease=1): the pool holds the newcomer, not B. (The
        # newcomer is the barrier: discovery hands the update to the proxy before it.)
        newcomer = dataclasses.replace(s.b_record, uid=uuid.uuid4(), version="3")
        await s.publish("worker-added", newcomer)
        await until(lambda: s.pooled() == [(newcomer.uid, newcomer.address)], "admission")
        assert await served_by(s.proxy) == s.b.process.pid

    await scene(tmp_path, backend, case)
