"""EtcdDiscovery against a real etcd: the discovery contract, then etcd's faults.

etcd is started by the tests themselves (see ``etcd_server.py``); if it cannot start, they fail
with the reason.
"""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import socket
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shardline import NoWorkersAvailable, WorkerMetadata, WorkerProxy
from shardline.discovery import Discovery, DiscoveryEvent, Subscription
from shardline.discovery.etcd import EtcdDiscovery, _EtcdPublisher
from shardline.discovery.record import MAX_RECORD_BYTES, encode_record
from support.discovery_contract import DiscoveryContract, kinds, quiet, take
from support.etcd_helpers import BAD_CONNECTION_ARGUMENTS, Instant, fail_over, relay_to
from support.etcd_server import EtcdServer, make_certificates
from support.parked import parked
from support.waiting import until
from support.workers import worker

_namespaces = iter(range(1_000_000))


def namespace() -> str:
    return f"faults-{next(_namespaces)}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    # this module's own: its tests restart etcd
    with EtcdServer() as server:
        yield server


class TestEtcdDiscovery(DiscoveryContract):
    @pytest.fixture(autouse=True)
    def _server(self, etcd: EtcdServer) -> None:
        self.endpoint = etcd.endpoint

    async def make(self, namespace: str) -> Discovery:
        return EtcdDiscovery([self.endpoint], namespace, ttl=5)


async def recorded(subscription: Subscription, log: list[DiscoveryEvent]) -> AsyncIterator[Any]:
    async for event in subscription:
        log.append(event)
        yield event


async def test_a_restart_mid_stream_loses_no_change_and_repeats_none(
    etcd: EtcdServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "shardline.discovery.etcd")
    uids, versions, dropped = range(1, 6), 40, (1, 2)
    expected = {
        worker(n).uid: [("worker-added", 1)]
        + [("worker-updated", pid) for pid in range(2, versions + 1)]
        + ([("worker-dropped", versions)] if n in dropped else [])
        for n in uids
    }

    ns = namespace()
    subscriber = EtcdDiscovery([etcd.endpoint], ns, timeout=10)
    publisher = EtcdDiscovery([etcd.endpoint], ns, timeout=10)
    log: list[DiscoveryEvent] = []
    events = recorded(subscriber.subscribe(), log)
    try:
        async with WorkerProxy(discovery=events, connect=Instant, quorum=0) as proxy:
            restart = None
            for pid in range(1, versions + 1):
                if pid == versions // 4:
                    restart = asyncio.create_task(asyncio.to_thread(etcd.restart))
                for n in uids:
                    kind = "worker-added" if pid == 1 else "worker-updated"
                    await publisher.publisher.publish(kind, worker(n, pid=pid))
                # pacing, not a wait: spreads the versions over the restart, so that it lands
                # mid-stream
                await asyncio.sleep(0.01)
            assert restart is not None
            await restart
            for n in dropped:
                await publisher.publisher.publish("worker-dropped", worker(n))
            # one more record, with the server back for good: the watch hands out changes in
            # revision order, so anything lost or repeated shows before this one
            last = worker(9)
            await publisher.publisher.publish("worker-added", last)
            expected[last.uid] = [("worker-added", last.pid)]
            await until(lambda: any(event.metadata.uid == last.uid for event in log))
            seen: dict[uuid.UUID, list[tuple[str, int]]] = {}
            for event in log:
                seen.setdefault(event.metadata.uid, []).append((event.type, event.metadata.pid))
            assert seen == expected
            truth = EtcdDiscovery([etcd.endpoint], ns)
            try:
                listed = await take(truth.subscribe(), len(uids) - len(dropped) + 1)
            finally:
                await truth.aclose()
            assert {m.uid: m for m in proxy.workers} == {e.metadata.uid: e.metadata for e in listed}
    finally:
        await publisher.aclose()
        await subscriber.aclose()
    assert "watch of" in caplog.text  # the subscriber's stream did break, and resumed


async def test_compaction_past_the_subscribers_revision_relists_and_emits_exactly_the_differences(
    etcd: EtcdServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "shardline.discovery.etcd")

    async def scenario() -> list[DiscoveryEvent]:
        ns = namespace()
        async with relay_to(etcd) as relay:
            subscriber = EtcdDiscovery([relay.endpoint], ns, timeout=2)
            publisher = EtcdDiscovery([etcd.endpoint], ns)
            try:
                subscription = subscriber.subscribe()
                for n in range(1, 6):
                    await publisher.publisher.publish("worker-added", worker(n))
                await take(subscription, 5)
                relay.cut()
                publish = publisher.publisher.publish
                await publish("worker-dropped", worker(1))
                await publish("worker-updated", worker(2, address="10.0.0.2:2"))
                await publish("worker-added", worker(6))
                await publish("worker-updated", worker(3, pid=999))
                await publish("worker-updated", worker(3))  # back to what the subscriber has
                etcd.compact()
                relay.restore()
                events = await take(subscription, 3)
                assert await quiet(subscription, 0.5)
                return events
            finally:
                await publisher.aclose()
                await subscriber.aclose()

    events = await scenario()
    assert sorted(kinds(events)) == sorted(
        [
            ("worker-dropped", worker(1).uid, worker(1).address),
            ("worker-updated", worker(2).uid, "10.0.0.2:2"),
            ("worker-added", worker(6).uid, worker(6).address),
        ]
    )
    assert "compacted" in caplog.text


async def test_a_publisher_killed_by_sigkill_is_dropped_when_its_lease_expires(
    etcd: EtcdServer,
) -> None:
    ttl = 2
    child_script = Path(__file__).with_name("etcd_publisher.py")

    async def scenario() -> float:
        ns = namespace()
        discovery = EtcdDiscovery([etcd.endpoint], ns)
        loop = asyncio.get_running_loop()
        seen: list[tuple[float, DiscoveryEvent]] = []

        async def follow() -> None:
            async for event in discovery.subscribe():
                seen.append((loop.time(), event))

        follower = asyncio.create_task(follow())
        uid = uuid.uuid4()
        child = await asyncio.create_subprocess_exec(
            sys.executable, str(child_script), etcd.endpoint, ns, str(uid), str(ttl),
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            assert child.stdout is not None
            assert await asyncio.wait_for(child.stdout.readline(), 30) == b"published\n"
            await until(lambda: len(seen) == 1)
            await asyncio.sleep(1.5 * ttl)  # kept alive past its TTL: nothing more arrives
            child.send_signal(signal.SIGKILL)
            killed = loop.time()
            await until(lambda: len(seen) >= 2)
            [(_, added), (dropped_at, dropped)] = seen
            assert (added.type, added.metadata.uid, added.metadata.pid) == (
                "worker-added", uid, child.pid,
            )  # fmt: skip
            assert (dropped.type, dropped.metadata.uid) == ("worker-dropped", uid)
            return dropped_at - killed
        finally:
            if child.returncode is None:
                child.kill()
            await child.wait()
            follower.cancel()
            await discovery.aclose()

    elapsed = await scenario()
    # etcd checks expiry every 500 ms; the last keep-alive was at most ttl/3 before the kill
    assert ttl / 3 < elapsed < ttl + 1.5


@pytest.mark.integration  # a server of its own
async def test_credentials_pass_through_wrong_ones_fail_and_a_restart_logs_in_again() -> None:
    with EtcdServer() as server:
        server.enable_auth(root_password="root-secret")
        server.add_user("worker", "right", readwrite_prefix=b"/shardline/")
        server.add_user("stranger", "pw", readwrite_prefix=None)

        def handle(**credentials: str) -> EtcdDiscovery:
            return EtcdDiscovery([server.endpoint], "auth", timeout=2, **credentials)

        async def refused(credentials: dict[str, str], reason: str) -> None:
            discovery = handle(**credentials)
            try:
                with pytest.raises(PermissionError, match=reason):
                    await discovery.publisher.publish("worker-added", worker(1))
                with pytest.raises(PermissionError, match=reason):
                    await anext(discovery.subscribe())
            finally:
                await discovery.aclose()

        async def scenario() -> None:
            await refused({"username": "worker", "password": "wrong"}, "'worker'.*invalid")
            await refused({}, "user name is empty")
            await refused({"username": "stranger", "password": "pw"}, "permission denied")
            discovery = handle(username="worker", password="right")
            try:
                subscription = discovery.subscribe()
                await discovery.publisher.publish("worker-added", worker(1))
                assert kinds(await take(subscription, 1)) == [
                    ("worker-added", worker(1).uid, worker(1).address)
                ]
                await asyncio.to_thread(server.restart)  # etcd forgets every token
                await discovery.publisher.publish("worker-updated", worker(1, address="moved"))
                assert kinds(await take(subscription, 1)) == [
                    ("worker-updated", worker(1).uid, "moved")
                ]
            finally:
                await discovery.aclose()

        await scenario()


@pytest.mark.integration  # a server of its own
async def test_tls_settings_pass_through(tmp_path: Path) -> None:
    certificates = make_certificates(tmp_path)
    with EtcdServer(certificates=certificates) as server:

        async def scenario() -> None:
            discovery = EtcdDiscovery([server.endpoint], "tls", **certificates.client_options())
            without_client_certificate = EtcdDiscovery(
                [server.endpoint], "tls", ca_cert=certificates.ca, timeout=1
            )
            try:
                subscription = discovery.subscribe()
                await discovery.publisher.publish("worker-added", worker(1))
                assert kinds(await take(subscription, 1)) == [
                    ("worker-added", worker(1).uid, worker(1).address)
                ]
                with pytest.raises(ConnectionError):
                    await without_client_certificate.publisher.publish("worker-added", worker(2))
            finally:
                await without_client_certificate.aclose()
                await discovery.aclose()

        await scenario()


BURST_BOUND = 300.0  # seconds; the burst takes about 20 s alone on a loaded 2-core machine


async def test_a_burst_of_10000_changes_across_1000_workers_converges_while_dispatching(
    etcd: EtcdServer,
) -> None:
    workers, changes, publishers = 1_000, 10, 16

    def record(n: int, change: int) -> WorkerMetadata:
        return worker(n, address=f"10.{n // 250}.{n % 250}.1:{7000 + change}")

    # every fifth worker's last change drops it; the others end at their last address
    final = {worker(n).uid: record(n, changes - 1).address for n in range(workers) if n % 5}

    async def scenario() -> int:
        ns = namespace()
        handles = [EtcdDiscovery([etcd.endpoint], ns, timeout=30) for _ in range(publishers)]
        subscriber = EtcdDiscovery([etcd.endpoint], ns)
        dispatched = 0
        churning = True

        async def dispatch(proxy: WorkerProxy) -> None:
            nonlocal dispatched
            while churning:
                try:
                    await proxy.dispatch(dispatched)
                    dispatched += 1
                except NoWorkersAvailable:
                    pass
                await asyncio.sleep(0.001)

        async def churn(n: int) -> None:
            for change in range(changes):
                kind = "worker-added" if change == 0 else "worker-updated"
                if change == changes - 1 and n % 5 == 0:
                    kind = "worker-dropped"
                # ownership moves between publishers; one uid's changes stay in order
                publisher = handles[(n + change) % publishers].publisher
                await publisher.publish(kind, record(n, change))  # type: ignore[arg-type]

        # bounded, closing included: once, under a CPU hog, this waited forever with the loop
        # idle (a publisher's aclose() waiting for a keeper that had dropped its cancellation),
        # and an unbounded wait names neither the test nor the await it is stuck in
        async with asyncio.timeout(BURST_BOUND):
            try:
                subscription = subscriber.subscribe()
                async with WorkerProxy(discovery=subscription, connect=Instant, quorum=0) as proxy:
                    dispatcher = asyncio.create_task(dispatch(proxy))
                    await asyncio.gather(*(churn(n) for n in range(workers)))
                    await until(lambda: {m.uid: m.address for m in proxy.workers} == final)
                    churning = False
                    await dispatcher
                return dispatched
            finally:
                for handle in [*handles, subscriber]:
                    await handle.aclose()

    assert await scenario() > 100


async def test_a_publisher_whose_lease_lapsed_registers_again_but_never_over_a_newer_owner(
    etcd: EtcdServer,
) -> None:

    ns = namespace()
    async with relay_to(etcd) as relay:
        cut_off = EtcdDiscovery([relay.endpoint], ns, ttl=1, timeout=2)
        other = EtcdDiscovery([etcd.endpoint], ns)
        try:
            subscription = other.subscribe()
            await cut_off.publisher.publish("worker-added", worker(1))
            await cut_off.publisher.publish("worker-added", worker(2))
            await take(subscription, 2)
            relay.cut()
            assert sorted(kinds(await take(subscription, 2))) == sorted(
                ("worker-dropped", worker(n).uid, worker(n).address) for n in (1, 2)
            )
            taken_over = worker(2, address="10.0.0.2:2")
            await other.publisher.publish("worker-added", taken_over)
            assert kinds(await take(subscription, 1)) == [
                ("worker-added", taken_over.uid, taken_over.address)
            ]
            relay.restore()
            assert kinds(await take(subscription, 1)) == [
                ("worker-added", worker(1).uid, worker(1).address)
            ]
            await cut_off.publisher.aclose()  # withdraws worker 1, which it owns again, only
            assert kinds(await take(subscription, 1)) == [
                ("worker-dropped", worker(1).uid, worker(1).address)
            ]
        finally:
            await cut_off.aclose()
            await other.aclose()


async def test_unreadable_records_are_skipped_counted_and_never_stop_the_stream(
    etcd: EtcdServer, caplog: pytest.LogCaptureFixture
) -> None:
    ns = namespace()
    prefix = f"/shardline/{ns}/workers/".encode()

    def key(n: int) -> bytes:
        return prefix + str(worker(n).uid).encode()

    etcd.put(key(1), b"{not json")
    etcd.put(prefix + b"not-a-uid", b"{}")
    etcd.put(key(4), encode_record(worker(3)))  # a record stored under another worker's key
    etcd.put(key(5), b'{"schema": 2}')

    async def scenario() -> dict[str, int]:
        discovery = EtcdDiscovery([etcd.endpoint], ns)
        try:
            subscription = discovery.subscribe()
            await discovery.publisher.publish("worker-added", worker(2))
            assert kinds(await take(subscription, 1)) == [
                ("worker-added", worker(2).uid, worker(2).address)
            ]
            etcd.put(key(2), b"x" * (MAX_RECORD_BYTES + 1))  # unreadable now: gone
            assert kinds(await take(subscription, 1)) == [
                ("worker-dropped", worker(2).uid, worker(2).address)
            ]
            await discovery.publisher.publish("worker-added", worker(6))
            assert kinds(await take(subscription, 1)) == [
                ("worker-added", worker(6).uid, worker(6).address)
            ]
            return dict(subscription.skipped)
        finally:
            await discovery.aclose()

    assert await scenario() == {"malformed": 3, "unknown-schema": 1, "oversized": 1}
    assert "not-a-uid" in caplog.text


async def test_a_dead_endpoint_is_passed_over_for_the_next(etcd: EtcdServer) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{unused.getsockname()[1]}"  # nothing listens there

    discovery = EtcdDiscovery([dead, etcd.endpoint], namespace())
    try:
        subscription = discovery.subscribe()
        await discovery.publisher.publish("worker-added", worker(1))
        assert kinds(await take(subscription, 1)) == [
            ("worker-added", worker(1).uid, worker(1).address)
        ]
    finally:
        await discovery.aclose()


@pytest.mark.parametrize(
    ("arguments", "named"),
    [*BAD_CONNECTION_ARGUMENTS, ({"ttl": 0}, "0"), ({"ttl": 1.5}, "1.5")],
)
def test_bad_arguments_are_refused_by_name(arguments: dict[str, Any], named: str) -> None:
    given: dict[str, Any] = {"endpoints": ["127.0.0.1:2379"], "namespace": "ns", **arguments}
    with pytest.raises(ValueError, match=re.escape(named)):
        EtcdDiscovery(**given)


async def test_a_bad_event_type_is_refused_by_name(etcd: EtcdServer) -> None:

    discovery = EtcdDiscovery([etcd.endpoint], namespace())
    try:
        with pytest.raises(ValueError, match="'worker-moved'"):
            await discovery.publisher.publish("worker-moved", worker(1))  # type: ignore[arg-type]
    finally:
        await discovery.aclose()


async def test_a_subscription_outlives_its_channel_closed_by_another_calls_failover(
    etcd: EtcdServer,
) -> None:

    discovery = EtcdDiscovery([etcd.endpoint], namespace())
    try:
        subscription = discovery.subscribe()
        waiting = asyncio.ensure_future(anext(subscription))
        await parked(subscription._events, "stream_step")  # it waits on its watch stream
        await fail_over(discovery._connection)
        await discovery.publisher.publish("worker-added", worker(1))
        event = await asyncio.wait_for(waiting, 20)
        assert (event.type, event.metadata) == ("worker-added", worker(1))
    finally:
        await discovery.aclose()


async def test_a_watch_whose_channel_closes_before_its_request_is_sent_resumes(
    etcd: EtcdServer,
) -> None:
    # grpc's stream write first waits for the call's headers to go out; a call cancelled before
    # that (its channel closed by another call's failover) never wakes that write

    discovery = EtcdDiscovery([etcd.endpoint], namespace(), timeout=2)
    connection = discovery._connection
    try:
        await discovery.publisher.publish("worker-added", worker(1))
        stubs = await connection.stubs()
        open_watch = stubs.watch.Watch

        def watch_closed_after_its_write_starts(**kwargs: Any) -> Any:
            call = open_watch(**kwargs)
            real_write = call.write

            async def write(request: Any) -> None:
                writing = asyncio.ensure_future(real_write(request))
                # one turn of the loop: the write waits for the headers, which are not out
                # before the next poll of grpc's completions
                await asyncio.sleep(0)
                await connection.recover(stubs, ConnectionError("lost"))
                await writing

            call.write = write
            return call

        stubs.watch.Watch = watch_closed_after_its_write_starts
        subscription = discovery.subscribe()
        assert kinds(await take(subscription, 1)) == [
            ("worker-added", worker(1).uid, worker(1).address)
        ]
        await discovery.publisher.publish("worker-added", worker(2))
        assert kinds(await take(subscription, 1)) == [
            ("worker-added", worker(2).uid, worker(2).address)
        ]
    finally:
        await discovery.aclose()


class _KeepAliveStream:
    """A lease keep-alive stream whose replies the test hands over one at a time."""

    def __init__(self) -> None:
        self.reading = asyncio.Event()
        self.reply: asyncio.Future[Any] | None = None

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        return None  # the stream never ends on its own

    async def write(self, request: Any) -> None:
        return None

    def read(self) -> asyncio.Future[Any]:
        self.reply = asyncio.get_running_loop().create_future()
        self.reading.set()
        return self.reply

    def cancel(self) -> bool:
        return True


class _LeaseOnlyConnection:
    """Grants a lease, accepts puts and revocations, and keeps one keep-alive stream."""

    closed = False
    timeout = 5.0

    def __init__(self) -> None:
        self.stream = _KeepAliveStream()
        lease = type("Lease", (), {"LeaseKeepAlive": lambda _, **kwargs: self.stream})()
        self._stubs = type("Stubs", (), {"lease": lease, "metadata": None})()

    async def stubs(self) -> Any:
        return self._stubs

    async def call(self, service: str, method: str, request: Any) -> Any:
        return type("Reply", (), {"TTL": 10, "ID": 7})()

    async def recover(self, stubs: Any, error: Exception) -> None:
        return None


async def test_closing_a_publisher_as_a_keep_alive_reply_arrives_ends_its_keeper() -> None:
    # the keeper read under asyncio.wait_for, which on Python 3.11 drops a cancellation that
    # comes as the read completes: the keeper went on, and aclose() waited for it forever

    connection = _LeaseOnlyConnection()
    publisher = _EtcdPublisher(connection, b"/shardline/ns/workers/", 10)  # type: ignore[arg-type]
    await publisher.publish("worker-added", worker(1))
    await connection.stream.reading.wait()
    assert connection.stream.reply is not None
    keeper = publisher._keeper
    connection.stream.reply.set_result(type("Reply", (), {"TTL": 10})())
    # bounded; aclose() must neither wait for a keeper that goes on nor drop this bound's
    # cancellation
    async with asyncio.timeout(5) as bound:
        await publisher.aclose()
    assert not bound.expired()
    assert keeper is not None
    assert keeper.done()
