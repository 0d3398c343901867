"""The gRPC transport: real workers on loopback, `GrpcConnection`, and both behind a proxy."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import shutil
import subprocess
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from shardline import OutcomeUnknown, RpcError, TransientRpcError, WorkerProxy
from shardline.discovery import InProcessDiscovery
from shardline.errors import InvalidRecord, WorkerError
from shardline.transport import GrpcConnection, Handler, RetryElsewhere, Task, serve_grpc
from shardline.transport.demo_handlers import DEMO_HANDLERS
from shardline.transport.grpc.wire import ReplyError, decode_reply, encode_error, encode_request
from shardline.transport.task import BAD_RESULT, MAX_MESSAGE_BYTES, UNKNOWN_HANDLER
from shardline.workers import WorkerMetadata
from support.discovery_contract import kinds, take
from support.held import Held, HeldThread
from support.transport_servers import WAIT, at, new_namespace, raw_server, worker
from support.waiting import until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.async_timeout(WAIT),
]  # each async test, start to finish


def named(name: str, **more: Handler) -> dict[str, Handler]:
    """The demo handlers, plus ``whoami`` answering ``name``."""

    async def whoami(payload: Any) -> str:
        return name

    return {**DEMO_HANDLERS, "whoami": whoami, **more}


# --- round trips ---------------------------------------------------------------------------

PAYLOADS = [None, 0, -1.5, "naïve ✓", [1, [2, {"k": None}]], {"nested": {"list": [True, False]}}]


async def test_echo_returns_every_json_value_it_is_sent() -> None:
    async def scenario() -> list[Any]:
        async with worker() as server:
            connection = GrpcConnection(server.metadata)
            try:
                return [await connection.dispatch(Task("echo", payload)) for payload in PAYLOADS]
            finally:
                connection.close()

    assert await scenario() == PAYLOADS


async def test_the_record_published_carries_the_port_bound_and_the_given_fields() -> None:

    namespace, uid = new_namespace(), uuid.uuid4()
    watcher = InProcessDiscovery(namespace).subscribe()
    options = {"uid": uid, "version": "2.1", "tags": {"gpu"}, "extra": {"weight": 3}}
    async with worker(namespace, **options) as server:
        (event,) = await take(watcher, 1)
        assert event.type == "worker-added"
        assert event.metadata == server.metadata
        host, _, port = server.address.rpartition(":")
        assert (host, port != "0") == ("grpc://127.0.0.1", True)
        assert (server.metadata.uid, server.metadata.version) == (uid, "2.1")
        assert (server.metadata.tags, dict(server.metadata.extra)) == ({"gpu"}, {"weight": 3})


async def test_a_proxy_over_in_process_discovery_spreads_tasks_over_grpc_workers() -> None:
    async def scenario() -> tuple[Counter[str], Any]:
        namespace = new_namespace()
        async with worker(namespace, named("a")), worker(namespace, named("b")):
            discovery = InProcessDiscovery(namespace).subscribe()
            async with WorkerProxy(discovery=discovery, connect=GrpcConnection, quorum=2) as proxy:
                served = Counter([await proxy.dispatch(Task("whoami")) for _ in range(6)])
                return served, await proxy.dispatch(Task("echo", {"x": [1, 2]}))

    assert await scenario() == (Counter({"a": 3, "b": 3}), {"x": [1, 2]})


async def test_a_sync_handler_runs_in_a_thread_and_does_not_block_other_calls() -> None:
    held = HeldThread()  # blocks its thread on purpose, until the other call is answered

    async def scenario() -> list[str]:
        async with worker(handlers=named("a", blocking=held.handler)) as server:
            connection = GrpcConnection(server.metadata)
            finished: list[str] = []

            async def call(handler: str) -> None:
                finished.append(await connection.dispatch(Task(handler)))

            slow = asyncio.create_task(call("blocking"))
            await held.begun()
            await call("whoami")
            held.release()
            await slow
            connection.close()
            return finished

    assert await scenario() == ["a", "blocking"]


# --- how failures reach the caller ---------------------------------------------------------


@pytest.mark.parametrize(
    ("task", "timeout", "status", "reason"),
    [
        (Task("fail-transiently"), None, "UNAVAILABLE", "unavailable"),
        (Task("fail-transiently", "resource-exhausted"), None, "RESOURCE_EXHAUSTED", "busy"),
        (Task("sleep", 5), 0.05, "DEADLINE_EXCEEDED", "deadline"),
    ],
)
async def test_unavailable_overloaded_and_late_workers_fail_transiently(
    task: Task, timeout: float | None, status: str, reason: str
) -> None:

    async with worker() as server:
        connection = GrpcConnection(server.metadata)
        with pytest.raises(TransientRpcError, match=status) as caught:
            await connection.dispatch(task, timeout=timeout)
        assert (caught.value.reason, caught.value.address) == (reason, server.metadata.address)
        assert await connection.dispatch(Task("echo", 1)) == 1
        connection.close()


async def test_calls_beyond_the_concurrency_limit_are_refused_as_overload() -> None:

    held = Held()
    async with worker(handlers=named("a", hold=held.handler), max_concurrent_calls=1) as server:
        connection = GrpcConnection(server.metadata)
        busy = asyncio.create_task(connection.dispatch(Task("hold", 0.2)))
        await held.begun()
        with pytest.raises(TransientRpcError, match="RESOURCE_EXHAUSTED") as caught:
            await connection.dispatch(Task("echo", 1))
        assert (caught.value.reason, caught.value.address) == ("busy", server.metadata.address)
        held.release()
        assert await busy == 0.2
        assert await connection.dispatch(Task("echo", 1)) == 1
        connection.close()


async def _abort_internal(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    await context.abort(grpc.StatusCode.INTERNAL, "broken inside")
    raise AssertionError("abort() returned")


async def _not_json(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return b"\x80 not json"


async def _neither(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return b'{"something": "else"}'


@pytest.mark.parametrize(
    ("behaviour", "message", "reason"),
    [
        (_abort_internal, "INTERNAL: broken inside", "grpc-status"),
        (None, "UNIMPLEMENTED", "grpc-status"),
        (_not_json, "the reply is not JSON", "protocol"),
        (_neither, "neither a result nor a well-formed error", "protocol"),
    ],
)
async def test_other_statuses_and_unreadable_replies_are_rpc_errors(
    behaviour: Callable[[bytes, grpc.aio.ServicerContext], Any] | None, message: str, reason: str
) -> None:

    async with raw_server(behaviour) as address:
        connection = GrpcConnection(at(address))
        with pytest.raises(RpcError, match=message) as caught:
            await connection.dispatch(Task("echo", 1))
        assert not isinstance(caught.value, TransientRpcError)
        assert (caught.value.reason, caught.value.address) == (reason, address)
        connection.close()


async def _cancel(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    await context.abort(grpc.StatusCode.CANCELLED, "reset while stopping")
    raise AssertionError("abort() returned")


async def test_a_call_the_worker_cancels_is_transient() -> None:
    """A worker that is stopping resets some calls instead of answering them (CANCELLED, about
    1 call in 300 with callers racing a stop); like UNAVAILABLE, that says nothing against the
    worker's current address, which must stay pooled."""

    async with raw_server(_cancel) as address:
        connection = GrpcConnection(at(address))
        with pytest.raises(TransientRpcError, match="CANCELLED") as caught:
            await connection.dispatch(Task("echo", 1))
        assert (caught.value.reason, caught.value.address) == ("cancelled", address)
        connection.close()


class Boom(Exception):
    pass


async def test_a_handler_that_raises_is_a_worker_error_naming_the_exception() -> None:
    async def boom(payload: Any) -> None:
        raise Boom(f"bad payload {payload}")

    async def scenario() -> list[WorkerError]:
        async with worker(handlers=named("a", boom=boom)) as server:
            connection = GrpcConnection(server.metadata)
            errors = []
            for task in (Task("fail", 7), Task("boom", 8), Task("nope")):
                with pytest.raises(WorkerError) as caught:
                    await connection.dispatch(task)
                errors.append(caught.value)
            assert await connection.dispatch(Task("echo", 1)) == 1
            connection.close()
            return errors

    fail, boom_error, unknown = await scenario()
    assert (fail.remote_type, fail.remote_message) == ("RuntimeError", "asked to fail (payload 7)")
    assert fail.handler == "fail"
    assert ":" in fail.address
    assert "handler 'fail'" in str(fail)
    assert not isinstance(fail, RpcError)
    assert boom_error.remote_type == f"{__name__}.Boom"
    assert boom_error.remote_message == "bad payload 8"
    assert unknown.remote_type == UNKNOWN_HANDLER
    assert "no handler named 'nope'" in unknown.remote_message
    assert "echo, fail, fail-transiently" in unknown.remote_message


async def test_an_error_whose_type_or_message_utf8_cannot_carry_still_reaches_the_caller() -> None:
    class Odd(Exception):
        pass

    Odd.__qualname__ = "Odd\udc80"  # a class's own name cannot hold one, its qualname can

    async def surrogate(payload: Any) -> None:
        raise Boom(f"bad {payload} \ud800!")

    async def odd_type(payload: Any) -> None:
        raise Odd("odd")

    async def scenario() -> list[WorkerError]:
        handlers = named("a", surrogate=surrogate, odd_type=odd_type)
        async with worker(handlers=handlers) as server:
            connection = GrpcConnection(server.metadata)
            errors = []
            for task in (Task("surrogate", 1), Task("odd_type")):
                with pytest.raises(WorkerError) as caught:
                    await connection.dispatch(task)
                errors.append(caught.value)
            connection.close()
            return errors

    message, kind = await scenario()
    assert (message.remote_type, message.remote_message) == (f"{__name__}.Boom", "bad 1 ?!")
    assert kind.remote_type.endswith(".Odd?")
    assert kind.remote_message == "odd"


def test_encode_error_replaces_what_utf8_cannot_carry_and_never_fails() -> None:
    reply = encode_error("Bad\ud800Type", "lone \udfff, split pair \ud83d\ude00, whole \U0001f600")
    assert decode_reply(reply) == (
        None,
        ReplyError("Bad?Type", "lone ?, split pair ??, whole \U0001f600"),
    )


def test_an_error_reply_holding_an_escaped_surrogate_reads_as_it_would_be_sent() -> None:
    reply = b'{"error":{"type":"Bad\\ud800Type","message":"lone \\udfff, pair \\ud83d\\ude00"}}'
    assert decode_reply(reply) == (None, ReplyError("Bad?Type", "lone ?, pair \U0001f600"))


def test_a_handler_or_payload_holding_a_surrogate_is_a_value_error_naming_it() -> None:
    with pytest.raises(ValueError, match=r"handler must be Unicode text, not 'ec\\ud800ho'"):
        encode_request(Task("ec\ud800ho", 1), MAX_MESSAGE_BYTES)
    with pytest.raises(ValueError, match=r"payload for handler 'echo' is not JSON.*surrogate"):
        encode_request(Task("echo", {"k": "\udc00"}), MAX_MESSAGE_BYTES)
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(ValueError, match="payload for handler 'echo' is not JSON"):
        encode_request(Task("echo", deep), MAX_MESSAGE_BYTES)


async def test_through_a_proxy_a_handler_error_keeps_the_worker_and_a_transient_one_moves_on():
    async def overloaded(payload: Any) -> None:
        raise RetryElsewhere("busy", overloaded=True)

    namespace = new_namespace()
    async with (
        worker(namespace, named("a", flaky=overloaded)),
        worker(namespace, named("b", flaky=DEMO_HANDLERS["echo"])),
    ):
        discovery = InProcessDiscovery(namespace).subscribe()
        async with WorkerProxy(discovery=discovery, connect=GrpcConnection, quorum=2) as proxy:
            pooled = {metadata.uid for metadata in proxy.workers}
            for _ in range(4):
                assert await proxy.dispatch(Task("flaky", "ok")) == "ok"
            for task in (Task("fail"), Task("nope")):
                with pytest.raises(WorkerError):
                    await proxy.dispatch(task)
            assert {metadata.uid for metadata in proxy.workers} == pooled


@asynccontextmanager
async def good_and_internal() -> AsyncIterator[tuple[WorkerProxy, WorkerMetadata]]:
    """A proxy (quorum 2) over a worker answering "good" and a raw server answering INTERNAL
    to every call; yields the proxy and the raw server's record."""
    namespace = new_namespace()
    async with worker(namespace, named("good")), raw_server(_abort_internal) as address:
        broken = at(address)
        await InProcessDiscovery(namespace).publisher.publish("worker-added", broken)
        discovery = InProcessDiscovery(namespace).subscribe()
        async with WorkerProxy(discovery=discovery, connect=GrpcConnection, quorum=2) as proxy:
            yield proxy, broken


async def test_through_a_proxy_a_worker_answering_internal_is_evicted() -> None:

    async with good_and_internal() as (proxy, broken):
        results = []
        for _ in range(3):
            try:
                results.append(await proxy.dispatch(Task("whoami")))
            except OutcomeUnknown as error:  # the call reached it: not sent again
                results.append(error.address)
        assert sorted(results) == sorted(["good", "good", broken.address])
        assert broken.uid not in {metadata.uid for metadata in proxy.workers}
        assert len(proxy.workers) == 1


async def test_through_a_proxy_an_idempotent_task_goes_on_past_a_worker_answering_internal() -> (
    None
):
    async with good_and_internal() as (proxy, broken):
        for _ in range(3):
            assert await proxy.dispatch(Task("whoami", idempotent=True)) == "good"
        assert broken.uid not in {metadata.uid for metadata in proxy.workers}


async def test_a_worker_that_went_away_fails_transiently() -> None:

    async with worker() as server:
        connection = GrpcConnection(server.metadata)
        assert await connection.dispatch(Task("echo", 1)) == 1
    with pytest.raises(TransientRpcError, match="UNAVAILABLE") as caught:
        await connection.dispatch(Task("echo", 1))
    assert (caught.value.reason, caught.value.address) == ("unavailable", server.metadata.address)
    fresh = GrpcConnection(server.metadata)
    with pytest.raises(TransientRpcError, match="UNAVAILABLE") as caught:
        await fresh.dispatch(Task("echo", 1))
    assert (caught.value.reason, caught.value.address) == ("unavailable", server.metadata.address)
    connection.close()
    fresh.close()


async def test_a_closed_connection_fails_transiently_and_misuse_is_a_type_error() -> None:

    async with worker() as server:
        connection = GrpcConnection(server.metadata)
        with pytest.raises(TypeError, match="Task objects, not dict"):
            await connection.dispatch({"handler": "echo"})  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="handler is a str, not int"):
            await connection.dispatch(Task(1))  # type: ignore[arg-type]
        connection.close()
        assert connection.closed
        with pytest.raises(TransientRpcError, match="is closed") as caught:
            await connection.dispatch(Task("echo", 1))
        assert (caught.value.reason, caught.value.address) == ("closed", server.metadata.address)


# --- sizes and payloads --------------------------------------------------------------------


async def test_payloads_that_are_not_json_or_too_large_are_refused_before_sending() -> None:

    async with worker() as server:
        connection = GrpcConnection(server.metadata, max_message_bytes=1000)
        with pytest.raises(TypeError, match="payload for handler 'echo' is not JSON"):
            await connection.dispatch(Task("echo", {1, 2}))
        with pytest.raises(ValueError, match="not JSON"):
            await connection.dispatch(Task("echo", float("nan")))
        with pytest.raises(ValueError, match=r"is 10\d\d bytes, over the limit of 1000"):
            await connection.dispatch(Task("echo", "x" * 1000))
        assert await connection.dispatch(Task("echo", "x" * 900)) == "x" * 900
        connection.close()


async def test_a_worker_refuses_oversize_requests_and_results() -> None:
    async def large(payload: Any) -> str:
        return "y" * 2000

    async with worker(handlers=named("a", large=large), max_message_bytes=1000) as server:
        connection = GrpcConnection(server.metadata)
        with pytest.raises(TransientRpcError, match="RESOURCE_EXHAUSTED") as overload:
            await connection.dispatch(Task("echo", "x" * 2000))
        assert (overload.value.reason, overload.value.address) == ("busy", server.metadata.address)
        with pytest.raises(WorkerError, match="over the limit of 1000") as caught:
            await connection.dispatch(Task("large"))
        assert caught.value.remote_type == BAD_RESULT
        connection.close()


# --- channels ------------------------------------------------------------------------------


async def test_connections_to_one_address_share_a_channel_closed_with_the_last_of_them() -> None:

    async with worker() as server, worker() as other:
        a, b = GrpcConnection(server.metadata), GrpcConnection(server.metadata)
        elsewhere = GrpcConnection(other.metadata)
        shared = a._shared
        assert b._shared is shared
        assert elsewhere._shared is not shared
        assert shared.references == 2
        a.close()
        a.close()
        assert (shared.references, shared.closed) == (1, False)
        assert await b.dispatch(Task("echo", 1)) == 1
        b.close()
        assert shared.closed
        await asyncio.sleep(0)
        with pytest.raises(grpc.aio.UsageError):
            await shared.call(b"{}")
        c = GrpcConnection(server.metadata)
        assert c._shared is not shared
        assert await c.dispatch(Task("echo", 2)) == 2
        assert await elsewhere.dispatch(Task("echo", 3)) == 3
        c.close()
        elsewhere.close()


async def test_a_call_in_flight_when_the_last_reference_goes_completes_then_the_channel_closes():

    held = Held()
    async with worker(handlers=named("a", hold=held.handler)) as server:
        connection = GrpcConnection(server.metadata)
        shared = connection._shared
        call = asyncio.create_task(connection.dispatch(Task("hold", 0.2)))
        await held.begun()
        connection.close()
        assert not shared.closed
        later = GrpcConnection(server.metadata)
        assert later._shared is not shared
        held.release()
        assert await call == 0.2
        assert shared.closed
        later.close()


async def test_a_connection_collected_unclosed_releases_its_channel() -> None:

    async with worker() as server:
        connection = GrpcConnection(server.metadata)
        shared = connection._shared
        del connection
        gc.collect()
        assert shared.closed


async def test_a_refresh_keeps_the_channel_of_an_unchanged_address_and_a_move_gets_a_new_one():

    namespace, uid = new_namespace(), uuid.uuid4()
    async with worker(namespace, named("old"), uid=uid) as old:
        discovery = InProcessDiscovery(namespace).subscribe()
        async with WorkerProxy(discovery=discovery, connect=GrpcConnection) as proxy:

            def pooled() -> GrpcConnection:
                ((_, connection),) = proxy._context.workers.values()
                return connection  # type: ignore[no-any-return]

            first = pooled()
            tagged = dataclasses.replace(old.metadata, tags=frozenset({"tagged"}))
            await InProcessDiscovery(namespace).publisher.publish("worker-updated", tagged)
            await until(lambda: pooled() is not first)
            second = pooled()
            assert first.closed
            assert second._shared is first._shared
            assert not second._shared.closed
            async with worker(namespace, named("new"), uid=uid) as new:
                await until(lambda: pooled().metadata.address == new.address)
                assert second.closed
                assert second._shared.closed
                assert pooled()._shared is not second._shared
                assert await proxy.dispatch(Task("whoami")) == "new"


TLS_COMMAND = [
    *("openssl", "req", "-x509", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"),
    *("-addext", "subjectAltName=IP:127.0.0.1"),
    *("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"),
]


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl to make a certificate")
async def test_credentials_are_passed_through_to_server_and_channel(tmp_path: Path) -> None:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [*TLS_COMMAND, "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    server_credentials = grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])

    async with worker(credentials=server_credentials) as server:
        channel_credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        secure = GrpcConnection(server.metadata, credentials=channel_credentials)
        plain = GrpcConnection(server.metadata)
        assert secure._shared is not plain._shared
        assert await secure.dispatch(Task("echo", "over TLS")) == "over TLS"
        with pytest.raises(TransientRpcError, match="UNAVAILABLE") as caught:
            await plain.dispatch(Task("echo", 1), timeout=5)
        assert (caught.value.reason, caught.value.address) == (
            "unavailable",
            server.metadata.address,
        )
        secure.close()
        plain.close()


# --- serving and shutting down -------------------------------------------------------------


async def test_stopping_withdraws_the_record_then_lets_a_call_in_flight_finish() -> None:

    namespace = new_namespace()
    watcher = InProcessDiscovery(namespace).subscribe()
    held = Held()
    server = await serve_grpc(
        named("a", hold=held.handler), "127.0.0.1:0", InProcessDiscovery(namespace)
    )
    await take(watcher, 1)
    connection = GrpcConnection(server.metadata)
    call = asyncio.create_task(connection.dispatch(Task("hold", 0.3)))
    await held.begun()
    stopping = asyncio.create_task(server.stop(grace=5))
    assert kinds(await take(watcher, 1)) == [
        ("worker-dropped", server.metadata.uid, server.address)
    ]
    assert not call.done()
    held.release()
    assert await call == 0.3
    await stopping
    await server.stop()
    with pytest.raises(TransientRpcError, match="UNAVAILABLE") as caught:
        await connection.dispatch(Task("echo", 1))
    assert (caught.value.reason, caught.value.address) == ("unavailable", server.metadata.address)
    connection.close()


async def test_stopping_leaves_a_record_another_publisher_took_over() -> None:

    namespace, uid = new_namespace(), uuid.uuid4()
    watcher = InProcessDiscovery(namespace).subscribe()
    first = await serve_grpc(DEMO_HANDLERS, "127.0.0.1:0", InProcessDiscovery(namespace), uid=uid)
    second = await serve_grpc(DEMO_HANDLERS, "127.0.0.1:0", InProcessDiscovery(namespace), uid=uid)
    assert kinds(await take(watcher, 2)) == [
        ("worker-added", uid, first.address),
        ("worker-updated", uid, second.address),
    ]
    await first.stop()
    later = InProcessDiscovery(namespace).subscribe()
    assert kinds(await take(later, 1)) == [("worker-added", uid, second.address)]
    await second.stop()
    assert kinds(await take(later, 1)) == [("worker-dropped", uid, second.address)]


async def test_serve_refuses_a_busy_publisher_a_taken_port_and_a_bad_address() -> None:

    discovery = InProcessDiscovery(new_namespace())
    async with await serve_grpc(DEMO_HANDLERS, "127.0.0.1:0", discovery) as server:
        with pytest.raises(ValueError, match="already announces a running server"):
            await serve_grpc(DEMO_HANDLERS, "127.0.0.1:0", discovery)
        with pytest.raises(OSError, match=f"cannot serve at {server.address}"):
            await serve_grpc(DEMO_HANDLERS, server.address, InProcessDiscovery(new_namespace()))
    for address in ("127.0.0.1", "127.0.0.1:http", ":80", "127.0.0.1:70000"):
        with pytest.raises(ValueError, match="address must be host:port"):
            await serve_grpc(DEMO_HANDLERS, address, InProcessDiscovery(new_namespace()))
    with pytest.raises(TypeError, match="handler 'x' is not callable"):
        await serve_grpc({"x": 1}, "127.0.0.1:0", InProcessDiscovery(new_namespace()))  # type: ignore[dict-item]


async def test_a_record_that_cannot_be_published_stops_the_server_and_frees_the_publisher() -> None:

    discovery = InProcessDiscovery(new_namespace())
    with pytest.raises(InvalidRecord, match="extra is not JSON-serialisable"):
        await serve_grpc(DEMO_HANDLERS, "127.0.0.1:0", discovery, extra={"x": object()})
    async with await serve_grpc(DEMO_HANDLERS, "127.0.0.1:0", discovery) as server:
        connection = GrpcConnection(server.metadata)
        assert await connection.dispatch(Task("echo", 1)) == 1
        connection.close()
