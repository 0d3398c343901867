"""The exceptions shardline raises.

Every error is a :class:`ShardlineError`, and each also subclasses the builtin it resembles, so a
caller that already catches ``ValueError`` or ``LookupError`` keeps working.
"""

from __future__ import annotations

__all__ = [
    "InvalidEvent",
    "InvalidRecord",
    "NoWorkersAvailable",
    "RpcError",
    "ShardlineError",
    "TransientRpcError",
    "UnhashableKey",
    "UnknownTier",
]


class ShardlineError(Exception):
    """Root of every error raised by shardline."""


class InvalidEvent(ShardlineError, ValueError):
    """A topology event or catalog row is malformed; nothing of it was applied.

    The message names the offending field and its value.
    """


class InvalidRecord(ShardlineError, ValueError):
    """A worker record read from discovery is oversized, malformed or of an unknown schema
    version. Subscribers skip such a record with a logged warning and count it by ``reason``
    (``"oversized"``, ``"malformed"`` or ``"unknown-schema"``); it never stops a stream."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class UnknownTier(ShardlineError, LookupError):
    """A lookup named a tier that was never registered with the topology."""


class UnhashableKey(ShardlineError, TypeError):
    """A sharding-key value that the hashing scheme cannot encode (type or range)."""


class RpcError(ShardlineError):
    """A dispatch to a worker failed; the proxy evicts the worker before trying another."""


class TransientRpcError(RpcError):
    """A dispatch failed in a way worth retrying elsewhere (unavailable, deadline, overload);
    the worker stays in the pool."""


class NoWorkersAvailable(ShardlineError, LookupError):
    """The balancer ran out of candidates: no pooled worker could take the task."""
