"""Remote errors: a handler's exception reaches the caller with the worker's traceback
(bounded), as an instance of its built-in type for those of ``BUILTIN_TYPES``; real worker
processes (``LocalPool``) serving ``support.remote_error_handlers`` over each transport, and
answers of an earlier release from a raw worker on loopback."""

from __future__ import annotations

import asyncio
import traceback
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import msgpack  # type: ignore[import-untyped]
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardline.errors import RpcError, TransientRpcError, WorkerError
from shardline.transport import GrpcConnection, LocalPool, MsgpackConnection, Task
from shardline.transport.grpc.wire import ReplyError, decode_reply
from shardline.transport.msgpack import wire
from shardline.transport.remote_errors import (
    BUILTIN_TYPES,
    MAX_TRACEBACK_CHARS,
    REMOTE_TYPES,
    builtin_base,
    remote_traceback,
)
from shardline.transport.task import MalformedMessage
from shardline.workers import WorkerMetadata
from support import remote_error_handlers
from support.remote_error_handlers import DEPTH_LIMIT, HANDLERS
from support.transport_servers import worker

SPEC = "support.remote_error_handlers:HANDLERS"
HANDLERS_FILE = remote_error_handlers.__file__
BOUND = 30.0

pytestmark = [pytest.mark.integration, pytest.mark.async_timeout(BOUND)]


@pytest.fixture(params=["msgpack", "grpc"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def failure(pool: LocalPool, handler: str, payload: object = None) -> WorkerError:
    """The error the handler's call raises through the pool's proxy."""
    with pytest.raises(WorkerError) as raised:
        await pool.dispatch(Task(handler, payload), timeout=10.0)
    return raised.value


async def test_a_handlers_value_error_is_caught_as_one_with_the_workers_traceback(
    transport: str,
) -> None:
    async with LocalPool(SPEC, workers=1, transport=transport) as pool:
        (worker,) = pool.workers
        try:
            await pool.dispatch(Task("parse", "x"), timeout=10.0)
        except ValueError as caught:
            error = caught
        else:
            raise AssertionError("the call succeeded")
    assert isinstance(error, WorkerError)
    assert (error.remote_type, error.remote_message) == (
        "ValueError",
        "invalid literal for int() with base 10: 'x'",
    )
    assert (error.handler, error.address) == ("parse", worker.address)
    assert str(error) == (
        f"handler 'parse' of the worker at {worker.address}: ValueError: invalid literal for"
        " int() with base 10: 'x'"
    )
    remote = error.remote_traceback
    assert remote is not None
    # from the handler's first frame (a sync one: run on the server's threads) to the raise
    assert remote.startswith(f'Traceback (most recent call last):\n  File "{HANDLERS_FILE}"')
    assert remote.index(", in parse\n") < remote.index(", in _parse_number\n")
    assert remote.endswith("ValueError: invalid literal for int() with base 10: 'x'\n")
    assert "shardline/transport" not in remote
    assert "concurrent/futures" not in remote
    # shown where Python prints the error, below its own traceback
    printed = "".join(traceback.format_exception(error))
    assert f"The traceback on the worker at {worker.address}:\n{remote}" in printed


async def test_each_kind_of_handler_error_reaches_the_caller_as_its_type_says(
    transport: str,
) -> None:
    async with LocalPool(SPEC, workers=1, transport=transport) as pool:
        (worker,) = pool.workers
        key = await failure(pool, "lookup", "missing")
        custom = await failure(pool, "refuse", 3)
        subclass = await failure(pool, "bad-input", 4)
        chained = await failure(pool, "wrapped", "k")
        unknown = await failure(pool, "no-such-handler")
        # the worker lives on, and served all of them
        assert await pool.dispatch(Task("echo", 1), timeout=10.0) == 1
        assert pool.pids == [worker.pid]

    # a KeyError: caught as one; str() is the WorkerError's line, not KeyError's quoted repr
    assert isinstance(key, KeyError)
    assert isinstance(key, LookupError)
    assert str(key) == f"handler 'lookup' of the worker at {worker.address}: KeyError: 'missing'"
    assert key.remote_traceback is not None
    assert key.remote_traceback.endswith("KeyError: 'missing'\n")
    # the handler's own class: a plain WorkerError, none of the built-in types
    assert type(custom) is WorkerError
    assert not isinstance(custom, BUILTIN_TYPES)
    assert custom.remote_type == "support.remote_error_handlers.Refused"
    assert custom.remote_traceback is not None
    assert custom.remote_traceback.endswith("support.remote_error_handlers.Refused: refused 3\n")
    # its own class deriving from ValueError: a ValueError, its remote_type the exact class
    assert isinstance(subclass, ValueError)
    assert not isinstance(subclass, KeyError)
    assert subclass.remote_type == "support.remote_error_handlers.BadInput"
    # the raised type counts, not its cause; the cause is in the traceback
    assert isinstance(chained, ValueError)
    assert not isinstance(chained, KeyError)
    assert chained.remote_traceback is not None
    assert "KeyError: 'k'" in chained.remote_traceback
    assert "direct cause of the following exception" in chained.remote_traceback
    # the transport's refusal: a plain WorkerError without a traceback
    assert type(unknown) is WorkerError
    assert unknown.remote_traceback is None
    assert unknown.remote_type == "shardline.UnknownHandler"
    assert not getattr(unknown, "__notes__", [])


async def test_a_huge_traceback_arrives_cut_to_the_bound_keeping_both_ends(transport: str) -> None:
    async with LocalPool(SPEC, workers=1, transport=transport) as pool:
        shallow = await failure(pool, "deep", 1)
        deep = await failure(pool, "deep", DEPTH_LIMIT)
    assert shallow.remote_traceback is not None
    assert "characters of the traceback cut" not in shallow.remote_traceback
    remote = deep.remote_traceback
    assert isinstance(deep, ValueError)
    assert remote is not None
    assert len(remote) <= MAX_TRACEBACK_CHARS
    head, marker, tail = remote.partition(" characters of the traceback cut ...]\n")
    assert marker
    assert head.startswith("Traceback (most recent call last):\n")
    assert ", in deep\n" in head  # the outermost frame, the handler's
    assert int(head.rpartition("[... ")[2]) > 2 * MAX_TRACEBACK_CHARS
    assert tail.endswith(
        ', in _down\n    raise ValueError("bottom of the recursion")\nValueError:'
        " bottom of the recursion\n"
    )


async def test_a_traceback_that_would_not_fit_the_callers_frame_limit_is_left_out() -> None:
    async with LocalPool(SPEC, workers=1) as pool:
        (worker,) = pool.workers
        # an error answer with the traceback would be over 16 KiB: over this limit
        small = MsgpackConnection(worker, max_frame_bytes=8 * 1024)
        try:
            with pytest.raises(ValueError, match="bottom of the recursion") as raised:
                await small.dispatch(Task("deep", DEPTH_LIMIT), timeout=10.0)
            assert isinstance(raised.value, WorkerError)
            assert raised.value.remote_traceback is None
            # the socket was not dropped for an oversized frame: the next call is answered
            with pytest.raises(ValueError, match="bottom of the recursion") as shallow:
                await small.dispatch(Task("deep", 1), timeout=10.0)
            assert isinstance(shallow.value, WorkerError)
            assert shallow.value.remote_traceback is not None
            assert await small.dispatch(Task("echo", 2), timeout=10.0) == 2
        finally:
            small.close()


async def test_a_grpc_reply_that_would_not_fit_the_workers_message_limit_leaves_it_out() -> None:
    # (serve_grpc in this process: the command serves with the default limit, 4 MiB)
    limit = 8 * 1024
    async with worker(handlers=HANDLERS, max_message_bytes=limit) as server:
        connection = GrpcConnection(server.metadata, max_message_bytes=limit)
        try:
            with pytest.raises(ValueError, match="bottom of the recursion") as raised:
                await connection.dispatch(Task("deep", DEPTH_LIMIT), timeout=10.0)
            with pytest.raises(ValueError, match="bottom of the recursion") as shallow:
                await connection.dispatch(Task("deep", 1), timeout=10.0)
        finally:
            connection.close()
    assert isinstance(raised.value, WorkerError)
    assert raised.value.remote_traceback is None
    assert isinstance(shallow.value, WorkerError)
    assert shallow.value.remote_traceback is not None


@asynccontextmanager
async def answering_worker(error: dict[str, object]) -> AsyncIterator[WorkerMetadata]:
    """A raw MessagePack-RPC worker on loopback that answers every dispatch with ``error``."""

    async def talk(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(wire.hello(1 << 20))
        unpacker = msgpack.Unpacker(raw=False)
        while data := await reader.read(65536):
            unpacker.feed(data)
            for message in unpacker:
                if message[0] == wire.REQUEST:
                    writer.write(msgpack.packb([wire.RESPONSE, message[1], error, None]))

    listener = await asyncio.start_server(talk, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        yield WorkerMetadata(uuid.uuid4(), f"msgpack+tcp://127.0.0.1:{port}", 1, "old")
    finally:
        listener.close()


@pytest.mark.parametrize(
    ("answer", "kind"),
    [
        # a worker of an earlier release: no builtin, no traceback; a builtin name is read
        ({"kind": "handler", "type": "KeyError", "message": "'k'"}, REMOTE_TYPES["KeyError"]),
        ({"kind": "handler", "type": "OSError", "message": "no"}, WorkerError),
        ({"kind": "handler", "type": "app.Failed", "message": "no"}, WorkerError),
        # a name this side does not know, or a type it never makes, is a plain WorkerError
        (
            {"kind": "handler", "type": "x.E", "message": "m", "builtin": "SystemExit"},
            WorkerError,
        ),
        ({"kind": "handler", "type": "x.E", "message": "m", "builtin": "Oops"}, WorkerError),
        (
            {"kind": "handler", "type": "x.E", "message": "m", "builtin": "TypeError", "x": 1},
            REMOTE_TYPES["TypeError"],
        ),
    ],
)
async def test_error_answers_of_other_releases_read_without_constructing_what_they_name(
    answer: dict[str, object], kind: type[WorkerError]
) -> None:
    async with answering_worker(answer) as metadata:
        connection = MsgpackConnection(metadata)
        try:
            with pytest.raises(WorkerError) as raised:
                await connection.dispatch(Task("h"), timeout=5.0)
        finally:
            connection.close()
    assert type(raised.value) is kind
    assert raised.value.remote_traceback is None
    assert raised.value.remote_type == answer["type"]


@pytest.mark.parametrize("field", ["builtin", "traceback"])
async def test_an_error_answer_whose_new_fields_are_not_text_is_a_protocol_error(
    field: str,
) -> None:
    answer = {"kind": "handler", "type": "ValueError", "message": "m", field: 7}
    async with answering_worker(answer) as metadata:
        connection = MsgpackConnection(metadata)
        try:
            with pytest.raises(RpcError, match="carries an error this side cannot read") as raised:
                await connection.dispatch(Task("h"), timeout=5.0)
        finally:
            connection.close()
    assert not isinstance(raised.value, TransientRpcError)
    assert raised.value.reason == "protocol"


def test_grpc_replies_of_an_earlier_release_read_and_bad_new_fields_are_refused() -> None:
    old = b'{"error":{"type":"ValueError","message":"m"}}'
    assert decode_reply(old) == (None, ReplyError("ValueError", "m", None, None))
    new = b'{"error":{"type":"a.B","message":"m","builtin":"ValueError","traceback":"T","x":1}}'
    assert decode_reply(new) == (None, ReplyError("a.B", "m", "ValueError", "T"))
    for bad in (b'"builtin":1', b'"traceback":[]'):
        with pytest.raises(MalformedMessage, match="well-formed error"):
            decode_reply(b'{"error":{"type":"a.B","message":"m",' + bad + b"}}")


def test_the_built_in_base_is_the_most_derived_listed_type_of_the_exception() -> None:
    class Mine(LookupError):
        pass

    assert builtin_base(ValueError()) == "ValueError"
    assert builtin_base(UnicodeDecodeError("utf-8", b"", 0, 1, "x")) == "ValueError"
    assert builtin_base(RecursionError()) == "RuntimeError"
    assert builtin_base(NotImplementedError()) == "NotImplementedError"
    assert builtin_base(Mine()) == "LookupError"
    assert builtin_base(KeyError()) == "KeyError"
    for outside in (OSError(), TimeoutError(), ImportError(), StopIteration(), SystemExit()):
        assert builtin_base(outside) is None
    assert builtin_base(asyncio.CancelledError()) is None
    # every class made is a WorkerError and its built-in type, none other of the list's
    for name, kind in REMOTE_TYPES.items():
        builtin = next(b for b in BUILTIN_TYPES if b.__name__ == name)
        assert issubclass(kind, WorkerError)
        assert issubclass(kind, builtin)


def _raise_at_depth(depth: int, message: str) -> None:
    if depth == 0:
        raise ValueError(message)
    _raise_at_depth(depth - 1, message)


@settings(max_examples=60, deadline=None)
@given(
    depth=st.integers(0, 300),
    message=st.text(st.characters(codec="utf-8"), max_size=40)
    | st.builds(lambda n: "m" * n, st.integers(0, 60_000)),
)
def test_a_traceback_is_never_over_the_bound_and_whole_when_under_it(
    depth: int, message: str
) -> None:
    try:
        _raise_at_depth(depth, message)
    except ValueError as error:
        whole = "".join(traceback.format_exception(error))
        sent = remote_traceback(error)
    assert len(sent) <= MAX_TRACEBACK_CHARS
    if len(whole) <= MAX_TRACEBACK_CHARS:
        assert sent == whole
    else:
        head, marker, tail = sent.partition(" characters of the traceback cut ...]\n")
        assert marker
        prefix, _, cut = head.rpartition("[... ")
        assert whole.startswith(prefix)
        assert whole.endswith(tail)
        assert len(prefix) + int(cut) + len(tail) == len(whole)
        assert len(prefix) >= 3 * 1024
        assert len(tail) >= 8 * 1024
