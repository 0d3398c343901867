"""`RpcError`'s ``reason`` and ``address``: what a plugin raising it with a message alone gets,
and the one vocabulary the transports use (their raise sites are checked in
test_transport.py and test_msgpack_transport.py)."""

from __future__ import annotations

import pickle
from typing import get_args

import pytest

from shardline import RpcError, TransientRpcError
from shardline.errors import RpcReason
from shardline.transport.msgpack import stream as msgpack_stream
from shardline.transport.msgpack import wire


@pytest.mark.parametrize("kind", [RpcError, TransientRpcError])
def test_a_message_alone_still_makes_one_of_unspecified_reason(kind: type[RpcError]) -> None:
    error = kind("the worker broke")
    assert (str(error), error.reason, error.address) == ("the worker broke", "unspecified", None)


@pytest.mark.parametrize("kind", [RpcError, TransientRpcError])
def test_reason_and_address_are_kept_and_survive_pickling(kind: type[RpcError]) -> None:
    error = kind("late", reason="deadline", address="msgpack+tcp://127.0.0.1:7001")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is kind
    assert (str(copy), copy.reason, copy.address) == (
        "late",
        "deadline",
        "msgpack+tcp://127.0.0.1:7001",
    )


def test_a_reason_outside_the_vocabulary_is_a_value_error_naming_it() -> None:
    with pytest.raises(ValueError, match="'UNAVAILABLE' is not an RpcReason"):
        RpcError("x", reason="UNAVAILABLE")  # type: ignore[arg-type]


def test_every_transient_msgpack_kind_has_its_reason() -> None:
    reasons = msgpack_stream._TRANSIENT_REASONS
    assert set(reasons) == wire.TRANSIENT_KINDS
    assert set(reasons.values()) <= set(get_args(RpcReason))
