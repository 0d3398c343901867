"""What a caller learns of a handler's exception, on either transport: the worker's formatted
traceback, bounded (:func:`remote_traceback`), and, for the built-in exception types of
:data:`BUILTIN_TYPES`, a :class:`~shardline.errors.WorkerError` that is also an instance of
that type (:func:`worker_error`), so ``except ValueError`` around a dispatch catches a
handler's ``ValueError``.

The worker names the most derived of :data:`BUILTIN_TYPES` its exception's class derives from
(:func:`builtin_base`): a handler's ``json.JSONDecodeError``, or a class of its own deriving
from ``ValueError``, reaches the caller as a ``ValueError`` too; a class deriving from none of
them (``class Failed(Exception)``) as a plain ``WorkerError``. The caller makes only the types
it has in this fixed list: a name it does not know makes a plain ``WorkerError``; nothing read
from the network names a class to import or construct otherwise.
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping
from types import MappingProxyType, TracebackType
from typing import cast

from shardline.errors import WorkerError

__all__ = [
    "BUILTIN_TYPES",
    "MAX_TRACEBACK_CHARS",
    "REMOTE_TYPES",
    "builtin_base",
    "remote_traceback",
    "worker_error",
]

BUILTIN_TYPES: tuple[type[Exception], ...] = (
    ArithmeticError,
    AssertionError,
    AttributeError,
    IndexError,
    KeyError,
    LookupError,
    NotImplementedError,
    OverflowError,
    RuntimeError,
    TypeError,
    ValueError,
    ZeroDivisionError,
)
"""The built-in exception types a handler's exception is raised as on the caller (besides
``WorkerError``): those that say what went wrong with the data or the code, whose constructor
takes a message. Left out, on purpose: ``OSError`` and its subclasses (``TimeoutError``,
``ConnectionError``...: on the caller they would read as its own I/O failing, or its deadline
passing), ``ImportError``, ``MemoryError``, ``StopIteration`` and ``StopAsyncIteration``
(they change what a generator or a loop does), and the ``BaseException`` that are no
``Exception`` (``SystemExit``, ``KeyboardInterrupt``, ``CancelledError``: they would end or
cancel the caller)."""

MAX_TRACEBACK_CHARS = 16 * 1024
"""The longest traceback a worker sends, in characters (so at most four times as many bytes
of UTF-8). A longer one keeps its first lines (the outermost frames) and its last ones (the
innermost frames and the exception), with a line saying how much was cut between them."""

_BUILTINS = frozenset(BUILTIN_TYPES)

_HEAD_CHARS = 4 * 1024
_MARKER_CHARS = 80  # room for the line saying what was cut
_ALIGN_CHARS = 256  # how far a cut may move to fall between two lines

# The modules of the worker's own machinery a handler's exception passes through on its way
# out: their frames come before the handler's, and say nothing about it.
_PLUMBING = frozenset(
    {
        "shardline.transport.msgpack.server",
        "shardline.transport.grpc.server",
        "shardline.transport.eager",
        "asyncio.futures",
        "asyncio.tasks",
        "concurrent.futures.thread",
    }
)


def _remote_type(builtin: type[Exception]) -> type[WorkerError]:
    # str() as WorkerError's message: KeyError's own __str__ would quote it.
    namespace = {
        "__module__": __name__,
        "__doc__": f"A handler's {builtin.__name__}: a WorkerError that is also one.",
        "__str__": BaseException.__str__,
    }
    return cast(
        "type[WorkerError]", type(f"Remote{builtin.__name__}", (WorkerError, builtin), namespace)
    )


REMOTE_TYPES: Mapping[str, type[WorkerError]] = MappingProxyType(
    {builtin.__name__: _remote_type(builtin) for builtin in BUILTIN_TYPES}
)
"""The class raised for each of :data:`BUILTIN_TYPES`, by name: ``RemoteValueError``,
subclass of ``WorkerError`` and ``ValueError``, and so on."""


def builtin_base(error: BaseException) -> str | None:
    """The name of the first class in the MRO of ``error``'s class that is one of
    :data:`BUILTIN_TYPES` (so the most derived of them it derives from), or None."""
    for kind in type(error).__mro__:
        if kind in _BUILTINS:
            return kind.__name__
    return None


def remote_traceback(error: BaseException) -> str:
    """``error``'s traceback as Python prints it (its causes and contexts included), from the
    handler's first frame (the server's own frames before it left out), cut to
    :data:`MAX_TRACEBACK_CHARS`."""
    text = "".join(
        traceback.format_exception(type(error), error, _handler_frames(error.__traceback__))
    )
    if len(text) <= MAX_TRACEBACK_CHARS:
        return text
    head = text[:_HEAD_CHARS]
    cut = head.rfind("\n")
    if cut >= _HEAD_CHARS - _ALIGN_CHARS:
        head = head[: cut + 1]
    tail = text[len(text) - (MAX_TRACEBACK_CHARS - len(head) - _MARKER_CHARS) :]
    cut = tail.find("\n")
    if 0 <= cut < _ALIGN_CHARS:
        tail = tail[cut + 1 :]
    marker = f"[... {len(text) - len(head) - len(tail)} characters of the traceback cut ...]\n"
    return head + marker + tail


def _handler_frames(frames: TracebackType | None) -> TracebackType | None:
    first = frames
    while first is not None and first.tb_frame.f_globals.get("__name__") in _PLUMBING:
        first = first.tb_next
    # (all plumbing: a failure of the server's own, shown whole)
    return frames if first is None else first


def worker_error(
    remote_type: str,
    remote_message: str,
    *,
    handler: str,
    address: str,
    builtin: str | None = None,
    traceback: str | None = None,
) -> WorkerError:
    """The ``WorkerError`` for a handler's error the worker reported: of the class
    :data:`REMOTE_TYPES` has for ``builtin``, the built-in type the worker named (or, when it
    named none, as a worker of an earlier release does, for ``remote_type``), else a plain
    one; ``traceback`` the worker's."""
    kind = REMOTE_TYPES.get(remote_type if builtin is None else builtin, WorkerError)
    return kind(
        remote_type, remote_message, handler=handler, address=address, remote_traceback=traceback
    )
