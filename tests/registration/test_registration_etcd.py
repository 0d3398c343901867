"""EtcdRecordStore against a real etcd: the record rules, the owner guard under two racing
processes (checked against a reference model), the watch across restarts and compaction,
unreadable values, credentials and TLS.

etcd is started by the tests themselves (see ``etcd_server.py``); if it cannot start, they fail
with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aetcd import rpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardline import NoWorkersAvailable, WorkerProxy
from shardline.discovery import DiscoveryEvent
from shardline.errors import InvalidRecord
from shardline.registration import Record, RecordStore, RegistrationDiscovery
from shardline.registration.etcd_store import MAX_VALUE_BYTES, EtcdRecordStore, _decode, _encode
from support.etcd_helpers import (
    BAD_CONNECTION_ARGUMENTS,
    Instant,
    fail_over,
    namespace,
    relay_to,
    with_store,
)
from support.etcd_server import EtcdServer, make_certificates
from support.parked import parked
from support.registration_contract import KeeperContract, RecordStoreContract, take

WAIT = 20.0


async def quiet(watch: AsyncIterator[tuple[str, Record | None]], seconds: float = 0.3) -> bool:
    try:
        item = await asyncio.wait_for(anext(watch), seconds)
    except TimeoutError:
        return True
    raise AssertionError(f"unexpected change {item}")


class EtcdStores:
    """Each test's store: a new EtcdRecordStore on the module's etcd, on a namespace of its
    own."""

    @pytest.fixture(autouse=True)
    def _server(self, etcd: EtcdServer) -> None:
        self.endpoint = etcd.endpoint

    async def make_store(self) -> RecordStore:
        return EtcdRecordStore([self.endpoint], namespace())


class TestEtcdRecordStore(EtcdStores, RecordStoreContract):
    """The record rules of issue 5 and the watch, on a real etcd."""


class TestKeeperOnEtcdRecordStore(EtcdStores, KeeperContract):
    """Scenario 8: the keeper and reader scenarios 1-7 with EtcdRecordStore on a real etcd."""


# -- what is particular to etcd ---------------------------------------------------------------

OLD, NEW = "old", "new"


async def test_records_are_per_service_and_per_namespace(etcd: EtcdServer) -> None:

    ns = namespace()
    async with (
        EtcdRecordStore([etcd.endpoint], ns) as one,
        EtcdRecordStore([etcd.endpoint], ns) as same,
        EtcdRecordStore([etcd.endpoint], ns + "x") as other,
    ):
        await one.report("app", True, OLD, "10.0.0.1:80")
        assert await same.get("app") == Record(OLD, True, "10.0.0.1:80")
        assert await same.get("app2") is None
        assert await other.get("app") is None
        assert one.key("app") == f"/shardline/{ns}/registration/app".encode()


async def test_values_are_small_versioned_json(etcd: EtcdServer) -> None:
    ns = namespace()

    async with EtcdRecordStore([etcd.endpoint], ns) as store:
        await store.report("app", True, OLD, "10.0.0.1:80")
    key = f"/shardline/{ns}/registration/app".encode()
    reply = etcd._call("KVStub", "Range", rpc.RangeRequest(key=key))
    assert json.loads(reply.kvs[0].value) == {
        "schema": 1,
        "service": "app",
        "owner": OLD,
        "registered": True,
        "address": "10.0.0.1:80",
    }


# -- values that cannot be read ---------------------------------------------------------------

UNREADABLE = [
    (b"{not json", "malformed"),
    (b"[1, 2]", "malformed"),
    (b'{"schema": 2, "service": "app", "owner": null, "registered": true}', "unknown-schema"),
    (b'{"schema": true, "service": "app", "owner": null, "registered": false}', "unknown-schema"),
    (b'{"schema": 1.0, "service": "app", "owner": null, "registered": false}', "unknown-schema"),
    (b"[" * 2000 + b"]" * 2000, "malformed"),
    (b'{"schema": 1, "service": "other", "owner": null, "registered": false}', "malformed"),
    (b'{"schema": 1, "service": "app", "owner": 7, "registered": false}', "malformed"),
    (b'{"schema": 1, "service": "app", "owner": null, "registered": "yes"}', "malformed"),
    (b'{"schema": 1, "service": "app", "registered": false, "address": "a:1"}', "malformed"),
    (b'{"schema": 1, "service": "app", "owner": "o\\ud800", "registered": false}', "malformed"),
    (b" " * (MAX_VALUE_BYTES + 1), "oversized"),
]


@pytest.mark.parametrize(("value", "reason"), UNREADABLE)
async def test_an_unreadable_value_makes_get_raise_invalid_record(
    etcd: EtcdServer, value: bytes, reason: str
) -> None:
    async def scenario(store: EtcdRecordStore) -> None:
        etcd.put(store.key("app"), value)
        with pytest.raises(InvalidRecord, match=r"'app'.*cannot be read") as raised:
            await store.get("app")
        assert raised.value.reason == reason
        assert isinstance(raised.value, ValueError)

    await with_store(etcd, scenario)


@given(st.binary(max_size=100) | st.binary(max_size=20).map(lambda b: b"[" * 2000 + b))
def test_reading_any_value_raises_nothing_but_invalid_record(data: bytes) -> None:
    with contextlib.suppress(InvalidRecord):
        _decode("app", data)


# a lone half, a pair as two code points (its escapes read back as one), the pair as one
halves = st.sampled_from(["\ud800", "\udfff", "\ud83d\ude00", "\U0001f600"])
texts = st.lists(st.characters() | halves, max_size=10).map("".join)


def has_surrogate(text: str | None) -> bool:
    return text is not None and any("\ud800" <= char <= "\udfff" for char in text)


@given(st.none() | texts, st.booleans(), st.none() | texts, st.just("app") | texts.filter(bool))
def test_every_value_a_store_writes_it_reads_back(
    owner: str | None, registered: bool, address: str | None, service: str
) -> None:
    record = Record(owner, registered, address if registered else None)
    if any(map(has_surrogate, (service, record.owner, record.address))):
        with pytest.raises(ValueError, match="must be Unicode text"):
            _encode(service, record)
    else:
        assert _decode(service, _encode(service, record)) == record


async def test_unknown_fields_are_ignored(etcd: EtcdServer) -> None:
    async def scenario(store: EtcdRecordStore) -> None:
        etcd.put(
            store.key("app"),
            b'{"schema": 1, "service": "app", "owner": "o", "registered": true,'
            b' "address": "a:1", "since": 12}',
        )
        assert await store.get("app") == Record("o", True, "a:1")

    await with_store(etcd, scenario)


async def test_an_unreadable_value_is_absent_to_a_watch_drops_a_retraction_and_yields_to_writes(
    etcd: EtcdServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "shardline.registration.etcd")

    async def scenario(store: EtcdRecordStore) -> None:
        etcd.put(store.key("app"), b"{not json")
        watch = store.watch(["app"])
        assert await take(watch, 1) == [("app", None)]
        assert await store.report("app", False, OLD) is False
        assert "dropped the retraction of 'app'" in caplog.text
        await store.report("app", True, OLD, "a:1")
        assert await take(watch, 1) == [("app", Record(OLD, True, "a:1"))]
        etcd.put(store.key("app"), b'{"schema": 3}')
        assert await take(watch, 1) == [("app", None)]
        await store.claim("app", NEW)
        assert await take(watch, 1) == [("app", Record(NEW, False))]
        etcd.put(store.key("app"), b"junk")
        assert await take(watch, 1) == [("app", None)]
        await store.clear("app")  # absent, as it already was to the watch: nothing new
        assert await quiet(watch)
        assert await store.get("app") is None

    await with_store(etcd, scenario)
    assert "cannot be read" in caplog.text


# -- arguments --------------------------------------------------------------------------------


@pytest.mark.parametrize(("arguments", "named"), BAD_CONNECTION_ARGUMENTS)
def test_bad_store_arguments_are_refused_by_name(arguments: dict[str, Any], named: str) -> None:
    given_: dict[str, Any] = {"endpoints": ["127.0.0.1:2379"], "namespace": "ns", **arguments}
    with pytest.raises(ValueError, match=re.escape(named)):
        EtcdRecordStore(**given_)


@pytest.mark.parametrize(
    ("call", "named"),
    [
        (lambda s: s.get(""), "service must be a non-empty str, got ''"),
        (lambda s: s.get(7), "got 7"),
        (lambda s: s.clear(None), "got None"),
        (lambda s: s.claim("app", 5), "owner must be a str or None, got 5"),
        (lambda s: s.report("app", 1, "o", "a:1"), "registered must be a bool, got 1"),
        (lambda s: s.report("app", True, "o", 80), "address must be a str or None, got 80"),
        (lambda s: s.report("app", False, "o", "a:1"), "no address, got 'a:1'"),
        (lambda s: s.report("app", True, "o", "a" * MAX_VALUE_BYTES), "too long"),
        (lambda s: s.claim("app", "o" * MAX_VALUE_BYTES), "too long"),
        # a surrogate code point, alone or as half of a pair: not Unicode text
        (lambda s: s.claim("\ud83d\ude00", "o"), "service must be Unicode text, got '\\ud83d"),
        (lambda s: s.get("a\ud800"), "service must be Unicode text, got 'a\\ud800'"),
        (lambda s: s.claim("app", "o\udfff"), "owner must be Unicode text, got 'o\\udfff'"),
        (lambda s: s.report("app", False, "\ud800"), "owner must be Unicode text"),
        (lambda s: s.report("app", True, "o", "h\ud800:1"), "address must be Unicode text"),
    ],
)
async def test_bad_call_arguments_are_refused_by_name_before_anything_is_sent(
    etcd: EtcdServer, call: Callable[[EtcdRecordStore], Awaitable[Any]], named: str
) -> None:
    async def scenario(store: EtcdRecordStore) -> None:
        with pytest.raises(ValueError, match=re.escape(named)):
            await call(store)
        assert await store.get("app") is None

    await with_store(etcd, scenario)


@pytest.mark.parametrize(
    ("services", "named"),
    [
        ("app", "'app'"),
        ([], "at least one"),
        (["app", ""], "''"),
        (None, "None"),
        (["app", "\ud83d\ude00"], "must be Unicode text"),
    ],
)
def test_bad_watch_arguments_are_refused_at_the_call(
    etcd: EtcdServer, services: Any, named: str
) -> None:
    store = EtcdRecordStore([etcd.endpoint], namespace())
    with pytest.raises(ValueError, match=re.escape(named)):
        store.watch(services)


async def test_a_closed_store_refuses_calls(etcd: EtcdServer) -> None:

    store = EtcdRecordStore([etcd.endpoint], namespace())
    await store.get("app")
    await store.aclose()
    with pytest.raises(RuntimeError, match="closed"):
        await store.get("app")


# -- the watch --------------------------------------------------------------------------------


async def test_a_watch_yields_each_services_state_then_each_change_once(etcd: EtcdServer) -> None:
    async def scenario(store: EtcdRecordStore) -> None:
        await store.report("b", True, OLD, "10.0.0.1:80")
        watch = store.watch(["b", "d", "b"])
        assert await take(watch, 2) == [("b", Record(OLD, True, "10.0.0.1:80")), ("d", None)]
        await store.report("c", True, OLD, "10.0.0.3:80")  # between the two: not watched
        await store.report("b", True, OLD, "10.0.0.1:80")  # the same again: not a change
        await store.claim("d", NEW)
        await store.claim("b", NEW)
        await store.report("d", False, OLD)  # dropped: no change
        await store.clear("d")
        await store.clear("d")
        await store.report("bb", True, OLD, "x:1")  # not watched
        await store.report("d", True, NEW, "10.0.0.4:80")
        assert await take(watch, 4) == [
            ("d", Record(NEW, False)),
            ("b", Record(NEW, False)),
            ("d", None),
            ("d", Record(NEW, True, "10.0.0.4:80")),
        ]
        assert await quiet(watch)

    await with_store(etcd, scenario)


async def test_a_watch_ends_when_its_store_closes(etcd: EtcdServer) -> None:

    store = EtcdRecordStore([etcd.endpoint], namespace())
    watch = store.watch(["app"])
    assert await take(watch, 1) == [("app", None)]
    waiting = asyncio.ensure_future(anext(watch))
    await parked(watch, "stream_step")  # it waits on its watch stream
    await store.aclose()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(waiting, WAIT)


async def test_a_watch_outlives_its_channel_closed_by_another_calls_failover(
    etcd: EtcdServer,
) -> None:
    async def scenario(store: EtcdRecordStore) -> None:
        watch = store.watch(["app"])
        assert await take(watch, 1) == [("app", None)]
        waiting = asyncio.ensure_future(anext(watch))
        await parked(watch, "stream_step")  # it waits on its watch stream
        await fail_over(store._connection)
        await store.report("app", True, OLD, "a:1")
        assert await asyncio.wait_for(waiting, WAIT) == ("app", Record(OLD, True, "a:1"))

    await with_store(etcd, scenario)


async def test_scenario9_a_proxy_fed_by_registration_discovery_follows_the_record_on_etcd(
    etcd: EtcdServer,
) -> None:
    """The proxy follows records another process's store writes: it stops dispatching to a
    service on the first event after its record turns False, and resumes once it is True."""

    ns = namespace()
    async with (
        EtcdRecordStore([etcd.endpoint], ns) as replicas,
        EtcdRecordStore([etcd.endpoint], ns) as followed,
    ):
        await replicas.report("app", True, OLD, "10.0.0.1:80")
        discovery = RegistrationDiscovery(followed, ["app", "other"])
        events: list[DiscoveryEvent] = []

        async def recorded() -> AsyncIterator[DiscoveryEvent]:
            async for event in discovery.subscribe():
                events.append(event)
                yield event

        async def after_event(proxy: WorkerProxy, count: int, addresses: set[str]) -> None:
            """Until the ``count``th event has come and the pool reflects it."""
            async with asyncio.timeout(WAIT):
                while len(events) < count or {w.address for w in proxy.workers} != addresses:
                    await asyncio.sleep(0.005)
            assert len(events) == count

        try:
            async with WorkerProxy(discovery=recorded(), connect=Instant) as proxy:
                assert await proxy.dispatch("task") == "10.0.0.1:80"
                await replicas.claim("app", NEW)  # a successor's claim: False
                await after_event(proxy, 2, set())
                assert events[1].type == "worker-dropped"
                with pytest.raises(NoWorkersAvailable):
                    await proxy.dispatch("task")
                await replicas.report("app", True, OLD, "10.0.0.1:80")  # the probe heals
                await after_event(proxy, 3, {"10.0.0.1:80"})
                assert events[2].type == "worker-added"
                assert await proxy.dispatch("task") == "10.0.0.1:80"
                await replicas.report("app", True, NEW, "10.0.0.2:80")
                await after_event(proxy, 4, {"10.0.0.2:80"})
                assert events[3].type == "worker-updated"
                assert await proxy.dispatch("task") == "10.0.0.2:80"
                await replicas.clear("app")
                await after_event(proxy, 5, set())
                assert events[4].type == "worker-dropped"
                with pytest.raises(NoWorkersAvailable):
                    await proxy.dispatch("task")
        finally:
            await discovery.aclose()


@pytest.mark.integration  # a server of its own
async def test_a_watch_resumes_across_etcd_restarts_missing_no_change_and_logging_in_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "shardline.registration.etcd")
    with EtcdServer() as server:
        server.enable_auth(root_password="root-secret")
        server.add_user("replica", "right", readwrite_prefix=b"/shardline/")
        server.add_user("stranger", "pw", readwrite_prefix=None)
        ns = namespace()

        def store(**credentials: str) -> EtcdRecordStore:
            return EtcdRecordStore([server.endpoint], ns, timeout=15, **credentials)

        async def scenario() -> None:
            async with store(username="stranger", password="pw") as stranger:
                with pytest.raises(PermissionError, match="permission denied"):
                    await stranger.get("app")
                with pytest.raises(PermissionError, match="permission denied"):
                    await anext(stranger.watch(["app"]))
            async with (
                store(username="replica", password="right") as writer,
                store(username="replica", password="right") as reader,
            ):
                watch = reader.watch(["app"])
                assert await take(watch, 1) == [("app", None)]
                seen: list[Record | None] = []

                async def follow() -> None:
                    async for _, record in watch:
                        seen.append(record)

                follower = asyncio.create_task(follow())
                expected: list[Record | None] = []
                restarts = []
                for n in range(40):
                    if n in (10, 25):
                        restarts.append(asyncio.create_task(asyncio.to_thread(server.restart)))
                    if n % 3 == 2:
                        await writer.claim("app", f"r{n}")
                        expected.append(Record(f"r{n}", False))
                    else:
                        await writer.report("app", True, f"r{n}", f"10.0.0.{n}:80")
                        expected.append(Record(f"r{n}", True, f"10.0.0.{n}:80"))
                    if n in (10, 25):
                        await restarts[-1]  # the next write lands while the watch is away
                await writer.clear("app")
                expected.append(None)
                # one more write, once the watch is back for good: the watch hands out changes
                # in revision order, so anything lost or repeated shows before this one
                await writer.claim("app", "last")
                expected.append(Record("last", False))
                async with asyncio.timeout(WAIT):
                    while Record("last", False) not in seen:
                        await asyncio.sleep(0.02)
                follower.cancel()
                assert seen == expected

        await scenario()
    assert "resuming after revision" in caplog.text
    assert "resumed after revision" in caplog.text


async def test_compaction_past_the_watch_lists_again_and_yields_only_the_differences(
    etcd: EtcdServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "shardline.registration.etcd")

    async def scenario() -> list[Any]:
        ns = namespace()
        async with (
            relay_to(etcd) as relay,
            EtcdRecordStore([relay.endpoint], ns, timeout=2) as reader,
            EtcdRecordStore([etcd.endpoint], ns) as writer,
        ):
            for service in ("a", "b", "c"):
                await writer.report(service, True, OLD, f"{service}:1")
            watch = reader.watch(["a", "b", "c", "d"])
            await take(watch, 4)
            relay.cut()
            await writer.claim("a", NEW)
            await writer.clear("b")
            await writer.claim("c", NEW)
            await writer.report("c", True, OLD, "c:1")  # back to what the watch has
            await writer.report("d", True, NEW, "d:1")
            etcd.compact()
            relay.restore()
            changes = await take(watch, 3)
            assert await quiet(watch, 0.5)
            return changes

    assert sorted(await scenario(), key=lambda change: change[0]) == [
        ("a", Record(NEW, False)),
        ("b", None),
        ("d", Record(NEW, True, "d:1")),
    ]
    assert "compacted" in caplog.text


@pytest.mark.integration  # a server of its own
async def test_tls_settings_pass_through(tmp_path: Path) -> None:
    certificates = make_certificates(tmp_path)
    with EtcdServer(certificates=certificates) as server:

        async def scenario() -> None:
            async with (
                EtcdRecordStore([server.endpoint], "tls", **certificates.client_options()) as store,
                EtcdRecordStore(
                    [server.endpoint], "tls", ca_cert=certificates.ca, timeout=1
                ) as without_client_certificate,
            ):
                await store.report("app", True, OLD, "a:1")
                assert await store.get("app") == Record(OLD, True, "a:1")
                with pytest.raises(ConnectionError):
                    await without_client_certificate.get("app")

        await scenario()


# -- two processes racing, against the reference rules ----------------------------------------

RACER = Path(__file__).with_name("registration_etcd_racer.py")
RACE_NAMESPACE = f"race-{uuid.uuid4().hex[:8]}"

Op = list[Any]  # ["claim", owner] | ["report", registered, owner, address] | ["get"]
State = Record | None


def model(state: State, op: Op) -> tuple[State, Any]:
    """The reference rules: the state after ``op`` and what ``op`` returns."""
    if op[0] == "claim":
        return Record(op[1], False), None
    if op[0] == "get":
        return state, None if state is None else [state.owner, state.registered, state.address]
    _, registered, owner, address = op
    if registered:
        return Record(owner, True, address), True
    if state is not None and state.owner != owner:
        return state, False
    return Record(owner, False), True


def interleavings(a: list[int], b: list[int]) -> Iterator[list[int]]:
    if not a or not b:
        yield a + b
        return
    for rest in interleavings(a[1:], b):
        yield [a[0], *rest]
    for rest in interleavings(a, b[1:]):
        yield [b[0], *rest]


def dedup(states: list[State]) -> list[State]:
    return [state for i, state in enumerate(states) if i == 0 or states[i - 1] != state]


def explained(
    initial: State,
    programs: tuple[list[Op], list[Op]],
    outcomes: tuple[list[Any], list[Any]],
    observed: list[State],
    final: State,
) -> bool:
    """Whether some serial order of the two programs (each in its own order) yields exactly
    these outcomes, this final record, and this sequence of records as a watch shows it."""
    ops = [*programs[0], *programs[1]]
    wanted = [*outcomes[0], *outcomes[1]]
    n = len(programs[0])
    for order in interleavings(list(range(n)), list(range(n, len(ops)))):
        state, states = initial, [initial]
        for index in order:
            state, outcome = model(state, ops[index])
            if outcome != wanted[index]:
                break
            states.append(state)
        else:
            if state == final and dedup(states) == observed:
                return True
    return False


OWNERS = st.sampled_from([OLD, NEW, None])


@st.composite
def program(draw: st.DrawFn, name: str) -> list[Op]:
    """A replica's drawn operations, each after a drawn pause of 0-3 ms."""
    ops: list[Op] = []
    for index in range(draw(st.integers(1, 5))):
        pause = draw(st.sampled_from([0, 0, 1, 3]))
        if pause:
            ops.append(["sleep", pause])
        kind = draw(st.sampled_from(["claim", "true", "false", "false", "get"]))
        if kind == "claim":
            ops.append(["claim", draw(OWNERS)])
        elif kind == "true":
            ops.append(["report", True, draw(OWNERS), f"{name}{index}:80"])
        elif kind == "false":
            ops.append(["report", False, draw(OWNERS), None])
        else:
            ops.append(["get"])
    return ops


initial_records = st.one_of(
    st.none(),
    st.builds(Record, OWNERS, st.just(False)),
    st.builds(Record, OWNERS, st.just(True), st.just("initial:80")),
)


class Racer:
    """One racer process (see ``registration_etcd_racer.py``)."""

    def __init__(self, endpoint: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(RACER), endpoint, RACE_NAMESPACE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    async def receive(self) -> str:
        assert self.process.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(self.process.stdout.readline), WAIT)
        if not line:
            raise AssertionError(f"racer {self.process.pid} exited: {self.process.poll()}")
        return line.strip()

    def stop(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def racers(etcd: EtcdServer) -> Iterator[tuple[Racer, Racer]]:
    pair = (Racer(etcd.endpoint), Racer(etcd.endpoint))
    try:
        yield pair
    finally:
        for racer in pair:
            racer.stop()


async def set_initial(store: EtcdRecordStore, service: str, initial: State) -> None:
    if initial is None:
        return
    if initial.registered:
        await store.report(service, True, initial.owner, initial.address)
    else:
        await store.claim(service, initial.owner)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(initial=initial_records, first=program("a"), second=program("b"))
def test_two_processes_racing_claim_report_retract_follow_some_serial_order(
    etcd: EtcdServer,
    racers: tuple[Racer, Racer],
    initial: State,
    first: list[Op],
    second: list[Op],
) -> None:
    service = f"app-{uuid.uuid4().hex[:12]}"
    marker = service + "~"  # in the watched range after the service's key

    async def scenario() -> tuple[list[list[Any]], list[State], State]:
        async with EtcdRecordStore([etcd.endpoint], RACE_NAMESPACE) as store:
            await set_initial(store, service, initial)
            watch = store.watch([service, marker])
            observed: list[State] = []
            listed, marked = asyncio.Event(), asyncio.Event()

            async def follow() -> None:
                async for name, record in watch:
                    if name == service:
                        observed.append(record)
                        listed.set()
                    elif record is not None:
                        marked.set()

            follower = asyncio.create_task(follow())
            try:
                await asyncio.wait_for(listed.wait(), WAIT)
                for racer, ops in zip(racers, (first, second), strict=True):
                    racer.send(json.dumps({"service": service, "ops": ops}))
                for racer in racers:
                    assert await racer.receive() == "ready"
                for racer in racers:
                    racer.send("go")
                outcomes = [json.loads(await racer.receive()) for racer in racers]
                final = await store.get(service)
                # every change to the service comes before the marker's in the watch
                await store.claim(marker, "done")
                await asyncio.wait_for(marked.wait(), WAIT)
                return outcomes, observed, final
            finally:
                follower.cancel()

    outcomes, observed, final = asyncio.run(scenario())

    def without_sleeps(ops: list[Op], results: list[Any]) -> tuple[list[Op], list[Any]]:
        kept = [(op, result) for op, result in zip(ops, results, strict=True) if op[0] != "sleep"]
        return [op for op, _ in kept], [result for _, result in kept]

    ops_a, outcomes_a = without_sleeps(first, outcomes[0])
    ops_b, outcomes_b = without_sleeps(second, outcomes[1])
    assert explained(initial, (ops_a, ops_b), (outcomes_a, outcomes_b), observed, final), (
        f"no serial order explains it: initial {initial}, a {ops_a} -> {outcomes_a}, "
        f"b {ops_b} -> {outcomes_b}, watched {observed}, final {final}"
    )


def test_the_reference_check_rejects_what_no_serial_order_explains() -> None:
    """The check above is not vacuous: a retraction that slipped past a successor's claim."""
    a = [["report", True, OLD, "a0:80"], ["report", False, OLD, None]]
    b = [["claim", NEW]]
    assert explained(
        None, (a, b), ([True, False], [None]),
        [None, Record(OLD, True, "a0:80"), Record(NEW, False)],
        Record(NEW, False),
    )  # fmt: skip
    assert not explained(
        None, (a, b), ([True, True], [None]),
        [None, Record(OLD, True, "a0:80"), Record(NEW, False), Record(OLD, False)],
        Record(OLD, False),
    )  # fmt: skip
    assert not explained(
        None, (a, b), ([True, True], [None]),
        [None, Record(OLD, True, "a0:80"), Record(OLD, False)],
        Record(OLD, False),
    )  # fmt: skip
