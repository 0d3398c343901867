"""What both transports carry and share: the :class:`Task` a worker is asked to run, the
default bound on a message, the error types a worker's transport answers with when it refuses
a task itself, and :class:`MalformedMessage` for what the network sent that no format reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "BAD_REQUEST",
    "BAD_RESULT",
    "MAX_MESSAGE_BYTES",
    "UNKNOWN_HANDLER",
    "MalformedMessage",
    "Task",
]

MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""The default bound on a request or reply, in bytes (gRPC's own default for receiving)."""

UNKNOWN_HANDLER = "shardline.UnknownHandler"
"""The error type of a reply to a task naming a handler the worker does not serve."""
BAD_REQUEST = "shardline.BadRequest"
"""The error type of a reply to a request the worker cannot read or run as asked."""
BAD_RESULT = "shardline.BadResult"
"""The error type of a reply whose handler's result the transport cannot carry."""


@dataclass(frozen=True, slots=True)
class Task:
    """What a worker is asked to do: run its handler named ``handler`` on ``payload``, which
    must be JSON-serialisable (``None`` by default).

    ``idempotent`` (False by default) says that running the task twice does no harm: only
    then does a proxy send it again after it reached a worker whose answer never came (a
    deadline, a lost connection), or hedge it on a second worker. It never travels to the
    worker."""

    handler: str
    payload: Any = None
    idempotent: bool = False


class MalformedMessage(ValueError):
    """A message read from the network does not follow its transport's format."""
