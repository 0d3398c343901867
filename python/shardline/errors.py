"""The exceptions shardline raises.

Each is a :class:`ShardlineError`, and most also subclass the builtin they resemble, so a
caller that already catches ``ValueError`` or ``LookupError`` keeps working. An invalid argument
to a constructor or a setting (a duration, a count, a name) is a ``ValueError`` naming the
argument; where the argument's *type* is wrong (a str for a count, a float for a bucket id) the
error is also a ``TypeError``. A wait that runs out (a proxy's quorum, a ``LocalPool``'s start)
is a ``TimeoutError``.

Like the builtins, every class here can be made with no arguments (``TransientRpcError()``), as a
test double raised by a fake connection or worker would be; its attributes then have the defaults
written in its docstring, and its message is empty.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

__all__ = [
    "DeadlineExceeded",
    "InstanceUnavailable",
    "InvalidAddress",
    "InvalidArgument",
    "InvalidArgumentType",
    "InvalidEvent",
    "InvalidRecord",
    "MissingExtra",
    "NoWorkersAvailable",
    "NotPicodata",
    "OutcomeUnknown",
    "PoolTimeout",
    "RpcError",
    "RpcReason",
    "ShardlineError",
    "TierWithoutBuckets",
    "TransientRpcError",
    "UnhashableKey",
    "UnknownTier",
    "WorkerError",
    "WorkerStartError",
]


def _given(message: str | None) -> tuple[str, ...]:
    """An exception's ``args`` for ``message``: none when there is none, as ``ValueError()``
    has."""
    return () if message is None else (message,)


def _rebuilt(cls: type[ShardlineError], args: tuple[object, ...]) -> ShardlineError:
    """An error of ``cls`` with ``args``, made without its ``__init__`` (for unpickling)."""
    error = cls.__new__(cls, *args)
    error.args = args  # an OSError's __new__ leaves them to an __init__ of the subclass's own
    return error


class ShardlineError(Exception):
    """Root of the errors shardline defines (see this module's docstring for the builtin
    errors it also raises).

    Every one survives ``pickle`` and ``copy``: its message and attributes come back as they
    were.

    Implementation notes:
        A builtin error is rebuilt as ``cls(*args)``, but ``args`` here is the message alone
        while the constructors take what the message is made of (``WorkerError``'s remote
        type, handler...): it is rebuilt from ``args`` without ``__init__``, then given its
        attributes back (an ``ImportError``'s ``name`` and ``path`` are not in ``__dict__``).
    """

    def __reduce__(self) -> tuple[Any, ...]:
        state = dict(self.__dict__)
        if isinstance(self, ImportError):
            state.update(name=self.name, path=self.path)
        return _rebuilt, (type(self), self.args), state


class InvalidEvent(ShardlineError, ValueError):
    """A topology event or catalog row is malformed; nothing of it was applied.

    The message names the offending field and its value.
    """


class InvalidArgument(ShardlineError, ValueError):
    """An argument outside what a lookup or ``bucket_id`` reads: a bucket id that is not an int
    from 0 to 2**32 - 1, a bucket count that is not an int from 1 to 2**32 - 1 (a bool is neither),
    an array (anything exposing the buffer protocol) that is not one-dimensional, or a
    ``memoryview`` of other items than integers.

    The same rule holds for a single value, a list, a tuple and an integer array of any dtype;
    the message names the value, and its position for a sequence or an array.

    Also a balancer name that cannot be resolved (:mod:`shardline.balancers.registry`): unknown
    (the message lists the known names), registered twice, or registered as something that
    makes no balancer.

    Where the argument's type is the problem, the error is an :class:`InvalidArgumentType`,
    which is also a ``TypeError``.
    """


class InvalidArgumentType(InvalidArgument, TypeError):
    """An argument of the wrong type: a bucket id or count that is not an int (a float, a str,
    a bool), an array of items that are not integers, an object with no buffer given as an
    ``out=`` array, a str given where a number of seconds or a count is read. Both a
    ``TypeError``, as Python's own argument checks raise, and an :class:`InvalidArgument` (so
    a ``ValueError``), as shardline raised for these before; the message names the argument
    and the value."""


class InvalidAddress(ShardlineError, ValueError):
    """A network address that is not ``host:port`` (an IPv6 host in brackets, ``[::1]:port``),
    or a host and port that cannot be written as one (:mod:`shardline.host_port`). The message
    names the address; ``reason`` says what is wrong with it in words (``"the port 'x' is not
    a number"``), or is ``None`` when the text has no ``host:port`` shape at all."""

    def __init__(self, message: str | None = None, *, reason: str | None = None) -> None:
        super().__init__(*_given(message))
        self.reason = reason


class InvalidRecord(ShardlineError, ValueError):
    """A worker record read from discovery is oversized, malformed or of an unknown schema
    version. Subscribers skip such a record with a logged warning and count it by ``reason``
    (``"oversized"``, ``"malformed"`` (the default) or ``"unknown-schema"``); it never stops a
    stream."""

    def __init__(self, reason: str = "malformed", message: str | None = None) -> None:
        super().__init__(*_given(message))
        self.reason = reason


class UnknownTier(ShardlineError, LookupError):
    """A lookup named a tier that was never registered with the topology."""


class TierWithoutBuckets(UnknownTier):
    """The tier has no buckets: its bucket count is 0, as in a Picodata "arbiter" tier (members
    that vote, no sharded data). Its replicasets and instances are in the topology, but no key
    or bucket routes to it, and no bucket range can be mapped in it. The message names the
    tier. A subclass of :class:`UnknownTier`, so a caller that handles a tier it cannot route
    in keeps working."""


class UnhashableKey(ShardlineError, TypeError):
    """A sharding-key value that the hashing scheme cannot encode (type or range)."""


RpcReason = Literal[
    "unspecified",
    "unavailable",
    "busy",
    "shutting-down",
    "cancelled",
    "deadline",
    "cannot-connect",
    "connection-lost",
    "unresponsive",
    "closed",
    "protocol",
    "protocol-version",
    "oversized",
    "grpc-status",
]
"""Why a dispatch failed: the ``reason`` of an :class:`RpcError` (see there for each word)."""

_RPC_REASONS: frozenset[str] = frozenset(get_args(RpcReason))


class RpcError(ShardlineError):
    """A dispatch to a worker failed; the proxy evicts the worker before trying another.

    ``RpcError(message)`` (or ``RpcError()``) is enough for a connection of one's own; the
    built-in transports also say why, in words a caller can compare (``reason``, one vocabulary
    for both), and name the worker (``address``, its record's address:
    ``msgpack+tcp://host:port``, ``grpc://host:port``...). ``reason`` is one of :data:`RpcReason`:

    - ``"unspecified"``: the default, when the raiser did not say;
    - ``"unavailable"``: the worker refused the call for now (its handler raised
      ``RetryElsewhere``); over gRPC, status ``UNAVAILABLE``, which also covers a worker that
      cannot be reached or is stopping;
    - ``"busy"``: the worker is overloaded (msgpack ``busy``, gRPC ``RESOURCE_EXHAUSTED``);
    - ``"shutting-down"``: the worker is stopping (msgpack ``shutting_down``);
    - ``"cancelled"``: the worker's side cancelled the call (gRPC ``CANCELLED``: a stopping
      worker resets calls so);
    - ``"deadline"``: the call's deadline passed, on either side (gRPC
      ``DEADLINE_EXCEEDED``);
    - ``"cannot-connect"``: no connection to the worker (refused, no socket file, or no
      connection and hello within the connection's ``connect_timeout``);
    - ``"connection-lost"``: the connection broke with the call in flight or being sent;
    - ``"unresponsive"``: the worker did not answer a ping in time;
    - ``"closed"``: the connection had been closed by its owner;
    - ``"protocol"``: the worker sent what the protocol does not allow (not the transport's
      format, a message that is not an answer, an error this side cannot read);
    - ``"protocol-version"``: the worker speaks another version of the protocol;
    - ``"oversized"``: the worker sent a frame over the connection's limit;
    - ``"grpc-status"``: a gRPC status not named above (``UNIMPLEMENTED``, ``INTERNAL``...);
      the message names it.

    From ``"unavailable"`` to ``"closed"`` a built-in transport raises
    :class:`TransientRpcError`, from ``"protocol"`` on a plain ``RpcError``. Another reason
    is a ``ValueError`` naming it.

    ``sent`` says whether the task may have started on the worker: False (the default) when
    the failure came before the request reached it (no connection, refused as ``busy``,
    ``shutting-down`` before it started, a handler's ``RetryElsewhere``), True when it was
    written to the worker and the outcome is unknown (the deadline passed, the connection
    was lost or the worker stopped answering with the call in flight). The proxy never sends
    a task again after a failure with ``sent`` true unless the task is idempotent.
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        reason: RpcReason = "unspecified",
        address: str | None = None,
        sent: bool = False,
    ) -> None:
        if reason not in _RPC_REASONS:
            raise ValueError(f"{reason!r} is not an RpcReason (one of {sorted(_RPC_REASONS)})")
        super().__init__(*_given(message))
        self.reason: RpcReason = reason
        self.address = address
        self.sent = sent


class TransientRpcError(RpcError):
    """A dispatch failed in a way worth retrying elsewhere (unavailable, deadline, overload, a
    call the worker reset while stopping); the worker stays in the pool. ``reason`` and
    ``address`` as for :class:`RpcError`."""


class OutcomeUnknown(RpcError):
    """The task reached a worker and its connection was lost (or the worker stopped
    answering) before the result came back: the task may have run, so the proxy did not send
    it again (it is not idempotent). ``reason``, ``address`` and ``sent`` (always true) as
    for :class:`RpcError`; ``uid`` is the worker's (None when not given); the transport's
    error is the ``__cause__``."""

    def __init__(
        self,
        message: str | None = None,
        *,
        reason: RpcReason = "unspecified",
        address: str | None = None,
        uid: object = None,
    ) -> None:
        super().__init__(message, reason=reason, address=address, sent=True)
        self.uid = uid


class DeadlineExceeded(ShardlineError, TimeoutError):
    """A call's deadline passed: ``timeout`` seconds (the caller's, or the proxy's default)
    bound the whole call, every attempt inside it.

    ``timeout`` is the deadline's length in seconds (0.0 when not given); ``tried`` the workers
    the call was sent to or refused by, in order, as ``(uid, address, reason)`` with ``reason``
    the :data:`RpcReason` of that attempt's failure (``"deadline"`` for the attempt the deadline
    cut short); ``may_have_run`` whether the task was sent to a worker that had not answered
    when the deadline passed (then it may have run there, or may still run: a worker drops a
    request whose deadline passed before it starts, and cancels an async handler at it);
    ``address`` that worker's address, or None. The message says all of this.
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        timeout: float = 0.0,
        tried: tuple[tuple[object, str | None, str], ...] = (),
        may_have_run: bool = False,
        address: str | None = None,
    ) -> None:
        super().__init__(*_given(message))
        self.timeout = timeout
        self.tried = tried
        self.may_have_run = may_have_run
        self.address = address


class NoWorkersAvailable(ShardlineError, LookupError):
    """The balancer ran out of candidates: no pooled worker could take the task; or, for the
    Picodata client with ``strict=True``, a key's bucket has no routable master (the message
    names the tier, the bucket and why)."""


class InstanceUnavailable(ShardlineError, ConnectionError):
    """The Picodata client could not reach an instance before sending the query (no connection
    could be opened, or the pooled one was found broken), even after one refresh and retry.
    Nothing was sent. The message names the instance (name or uuid) and its address, and the
    driver's error is chained as ``__cause__``. ``instance`` is the uuid (``None`` for the
    catalog's server), ``address`` the ``host:port`` dialled (each None when not given)."""

    def __init__(
        self, message: str | None = None, *, instance: str | None = None, address: str | None = None
    ) -> None:
        super().__init__(*_given(message))
        self.instance = instance
        self.address = address


class NotPicodata(ShardlineError, ValueError):
    """The Picodata client's DSN reaches a server that answers SQL but has no Picodata catalog
    (no ``_pico_tier`` table): a plain PostgreSQL, most likely. Retrying will not help; the
    message names the address and what the server said. ``address`` is the ``host:port``
    dialled (None when not given)."""

    def __init__(self, message: str | None = None, *, address: str | None = None) -> None:
        super().__init__(*_given(message))
        self.address = address


class PoolTimeout(ShardlineError, TimeoutError):
    """Every connection of an instance's pool stayed busy for the client's ``acquire_timeout``;
    the query was not sent (and never sent elsewhere instead). The message names the instance,
    its address, the pool size and the time waited."""


class WorkerError(ShardlineError):
    """A worker received the task and answered with an error: its handler raised, or it has no
    handler of that name. The worker is healthy, so the proxy keeps it pooled and does not
    offer the task to another worker (it would most likely fail the same way there); the error
    reaches the caller of ``dispatch``.

    ``remote_type`` names the exception the handler raised (module-qualified unless it is a
    builtin) or the transport's own refusal (``"shardline.UnknownHandler"``, ...);
    ``remote_message`` is its message, ``handler`` the handler asked for and ``address`` the
    worker's. ``str()`` says all four (the traceback below is not in it).

    ``remote_traceback`` is the worker's formatted traceback of the handler's exception (as
    Python prints it, from the handler's first frame, at most
    :data:`~shardline.transport.remote_errors.MAX_TRACEBACK_CHARS` characters: a longer one
    keeps its start and its end), or None when there is none: the transport refused the task,
    or the worker's release does not send it. It is also an exception note (PEP 678), so
    Python shows it below the error's own traceback when the error is printed or logged.

    The built-in transports raise, for a handler's exception deriving from one of the built-in
    types of :data:`~shardline.transport.remote_errors.BUILTIN_TYPES` (``ValueError``,
    ``KeyError``, ``TypeError``...), a ``WorkerError`` that is also an instance of the most
    derived of them (class ``RemoteValueError`` and so on), so ``except ValueError`` catches a
    handler's ``ValueError``; its ``args`` are the ``WorkerError``'s. Any other exception, a
    handler's own class among them, is a plain ``WorkerError``.

    ``WorkerError()`` (every str attribute ``""``) has an empty message.
    """

    def __init__(
        self,
        remote_type: str = "",
        remote_message: str = "",
        *,
        handler: str = "",
        address: str = "",
        remote_traceback: str | None = None,
    ) -> None:
        if remote_type or remote_message or handler or address:
            super().__init__(
                f"handler {handler!r} of the worker at {address}: {remote_type}: {remote_message}"
            )
        else:
            super().__init__()
        self.remote_type = remote_type
        self.remote_message = remote_message
        self.handler = handler
        self.address = address
        self.remote_traceback = remote_traceback
        if remote_traceback is not None:
            self.add_note(f"The traceback on the worker at {address}:\n{remote_traceback.rstrip()}")


class WorkerStartError(ShardlineError, RuntimeError):
    """A worker process that ``LocalPool`` started exited before it joined the pool. The message
    names the handlers spec, the process's pid and exit status, and ends with the tail of its
    output, where a handlers spec that cannot be loaded shows its import error."""


class MissingExtra(ShardlineError, ImportError):
    """A feature needs an optional dependency (one of shardline's extras) that is not installed.

    The message names what needs it, the missing module and the command that installs it, e.g.
    ``shardline.transport.grpc.connection needs grpc, which is not installed: pip install
    'shardline[grpc]'``. ``extra`` is the extra's name, ``name`` (as for any ``ImportError``) the
    missing module; the ``ModuleNotFoundError`` is chained as ``__cause__``. ``MissingExtra()``
    has an empty message, ``extra`` ``""`` and ``name`` None.
    """

    def __init__(self, extra: str = "", module: str | None = None, *, needed_by: str = "") -> None:
        if module is None:
            super().__init__()
        else:
            super().__init__(
                f"{needed_by} needs {module}, which is not installed:"
                f" pip install 'shardline[{extra}]'",
                name=module,
            )
        self.extra = extra
