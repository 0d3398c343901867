"""`EtcdConnection`: one gRPC channel to an etcd cluster, shared by the calls and streams of
one handle (an `EtcdDiscovery`, an `EtcdRecordStore`).

It speaks etcd's v3 API through the gRPC stubs that ship with ``aetcd``, on a channel it builds
itself, because aetcd 1.0's ``Client`` has no TLS option, never logs in again once its token is
lost (an etcd restart forgets every token), and flattens watch responses, which hides the
revision boundaries a resumable watch needs.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, TypeVar

from shardline._extras import requires_extra

with requires_extra("etcd", __name__):
    import grpc
    import grpc.aio
    from aetcd import rpc

from shardline.checks import refusal
from shardline.errors import InvalidAddress, InvalidArgumentType
from shardline.host_port import join_host_port, split_host_port

__all__ = [
    "EtcdConnection",
    "EtcdOptions",
    "Stubs",
    "backoff",
    "describe",
    "namespace_prefix",
    "parse_endpoints",
    "stream_end",
    "stream_step",
    "stream_write",
]

logger = logging.getLogger("shardline.discovery.etcd")

# Failures of the connection rather than of the request: worth the next endpoint or a retry.
# CANCELLED is what calls see when another task closed the channel under them.
_TRANSIENT = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.UNAUTHENTICATED,  # a token etcd forgot (restart) or expired: log in again
    }
)

# Failures seen outside a gRPC status: a channel another task has just closed (UsageError), a
# stream written to after it ended, a stream that ended or went mute.
_STREAM_FAILURES = (grpc.aio.UsageError, asyncio.InvalidStateError, ConnectionError, TimeoutError)

_CHANNEL_OPTIONS = (
    # a watch response carries up to 1,000 revisions, each record up to 64 KiB
    ("grpc.max_receive_message_length", -1),
    # notices a peer that vanished without closing the connection; etcd refuses pings more
    # often than every 5 s
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
)


_T = TypeVar("_T")


async def stream_step(step: Awaitable[_T]) -> _T:
    """Awaits ``step``, a call or a read or write of a stream (a watch, a keep-alive). When
    another task closes the channel under it (``recover`` after its own call failed, or
    ``aclose``), grpc cancels the call, which reaches the awaiting task as
    ``asyncio.CancelledError`` although that task was not cancelled: that raises
    ``ConnectionError`` instead, a failure to hand to ``recover``. A cancellation of the
    awaiting task itself propagates unchanged."""
    try:
        return await step
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
        raise ConnectionError("the channel was closed under the stream") from None


def stream_end(call: Any) -> asyncio.Future[None]:
    """A future that completes when ``call``, a stream, ends; to pass to ``stream_write``. Take
    one per call: grpc offers no way to remove the callback that completes it."""
    ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def end(_: Any) -> None:
        if not ended.done():
            ended.set_result(None)

    call.add_done_callback(end)
    return ended


async def stream_write(call: Any, request: Any, ended: asyncio.Future[None]) -> None:
    """Writes ``request`` to ``call``, a stream (a watch, a keep-alive) whose end ``ended``
    (from ``stream_end``) reports, and returns once it is sent. If the call ends first
    (cancelled, say by another task closing the channel under it), raises ``ConnectionError``,
    a failure to hand to ``recover``. A cancellation of the awaiting task itself propagates.

    Implementation notes:
        grpc's write first waits for the call's headers to be sent, and nothing wakes it if the
        call ends before they are: a channel closed in that window left the write, and the
        watch or keep-alive awaiting it, waiting forever. The write therefore runs in a task
        that the end of the call abandons.
    """
    write = asyncio.ensure_future(call.write(request))
    write.add_done_callback(_retrieve)
    try:
        await asyncio.wait((write, ended), return_when=asyncio.FIRST_COMPLETED)
    finally:
        write.cancel()
    if write.done() and not write.cancelled():
        write.result()  # the write's own failure, if it failed
        return
    raise ConnectionError("the stream ended before its request was sent")


def _retrieve(task: asyncio.Future[None]) -> None:
    """Marks an abandoned write's outcome as seen, so that asyncio does not report it."""
    if not task.cancelled():
        task.exception()


def backoff(failures: int) -> float:
    """Seconds to wait before retrying after ``failures`` failures in a row: doubling, at most 1."""
    return float(min(0.05 * 2**failures, 1.0))


def namespace_prefix(namespace: str, kind: str) -> bytes:
    """The key prefix ``/shardline/<namespace>/<kind>/``; ``ValueError`` unless ``namespace`` is
    a non-empty str without ``/``."""
    if not isinstance(namespace, str) or not namespace or "/" in namespace:
        # a "/" would let one namespace's prefix contain another's
        raise refusal(namespace, str)(
            f"namespace must be a non-empty str without '/', got {namespace!r}"
        )
    return f"/shardline/{namespace}/{kind}/".encode()


def describe(error: BaseException) -> str:
    """One line for a log: a gRPC failure's status and details, or the exception's text."""
    if isinstance(error, grpc.aio.AioRpcError):
        return f"{error.code().name}: {error.details()}"
    return str(error) or type(error).__name__


@dataclass(frozen=True)
class _Endpoint:
    target: str  # host:port, as gRPC takes it
    tls: bool
    text: str  # as the caller wrote it, for messages


def parse_endpoints(endpoints: str | Sequence[str], *, tls_configured: bool) -> list[_Endpoint]:
    """``host:port``, ``http://host:port`` or ``https://host:port`` (an IPv6 host in brackets),
    as a list or one string separated by commas; a ``ValueError`` names the first that is
    not."""
    items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    if not items:
        raise ValueError("endpoints must name at least one etcd endpoint, got none")
    parsed = []
    for item in items:
        if not isinstance(item, str):
            raise InvalidArgumentType(f"etcd endpoint {item!r} is not a str")
        text = item.strip()
        scheme, separator, rest = text.rpartition("://")
        if separator and scheme not in ("http", "https"):
            raise ValueError(f"etcd endpoint {item!r}: scheme must be http or https")
        try:
            host, port = split_host_port(rest)
        except InvalidAddress as error:
            why = f": {error.reason}" if error.reason else ""
            raise InvalidAddress(
                f"etcd endpoint {item!r} is not host:port{why}", reason=error.reason
            ) from None
        if scheme == "http" and tls_configured:
            raise ValueError(f"etcd endpoint {item!r} is plain http, but TLS files were given")
        tls = scheme == "https" or (not separator and tls_configured)
        parsed.append(_Endpoint(target=join_host_port(host, port), tls=tls, text=text))
    return parsed


@dataclass(frozen=True)
class Stubs:
    """The stubs of one channel; a failure is reported with the ``Stubs`` it happened on, so
    that many calls failing together reset the channel once."""

    channel: grpc.aio.Channel
    endpoint: str
    metadata: tuple[tuple[str, str], ...] | None
    kv: Any
    watch: Any
    lease: Any


def _read(path: str | os.PathLike[str] | None, name: str) -> bytes | None:
    if path is None:
        return None
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as error:
        raise ValueError(f"{name} {os.fspath(path)!r} cannot be read: {error}") from None


class EtcdOptions(TypedDict, total=False):
    """How to reach an etcd cluster besides its endpoints, the same for every etcd client here
    (``EtcdDiscovery``, ``EtcdRecordStore``): ``username`` and ``password`` log in (both or
    neither); ``ca_cert`` (the CA to trust), ``cert_key`` and ``cert_cert`` (a client
    certificate: both or neither) are PEM files, and any of them turns TLS on for endpoints
    without a scheme; ``timeout`` (seconds, default 5) is how long each request is retried
    across endpoints before ``ConnectionError``."""

    username: str | None
    password: str | None
    ca_cert: str | os.PathLike[str] | None
    cert_key: str | os.PathLike[str] | None
    cert_cert: str | os.PathLike[str] | None
    timeout: float


class EtcdConnection:
    """A channel to the first endpoint that answers, reopened on the next after a failure.

    ``call(service, method, request)`` retries transient failures, moving to the next endpoint
    after a connection failure, until ``timeout`` seconds have passed, then raises
    ``ConnectionError``. Every call that fails for good on credentials or permissions raises
    ``PermissionError``; other refusals raise the ``grpc.aio.AioRpcError`` as it came.
    Streams take ``stubs()`` and hand their failures to ``recover``.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        username: str | None = None,
        password: str | None = None,
        ca_cert: str | os.PathLike[str] | None = None,
        cert_key: str | os.PathLike[str] | None = None,
        cert_cert: str | os.PathLike[str] | None = None,
        timeout: float = 5.0,
    ) -> None:
        if (username is None) != (password is None):
            raise ValueError("username and password must be given together")
        if (cert_key is None) != (cert_cert is None):
            raise ValueError("cert_key and cert_cert must be given together")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise refusal(timeout, (int, float))(
                f"timeout must be a positive number of seconds, got {timeout!r}"
            )
        tls_files = (ca_cert, cert_key, cert_cert)
        self._endpoints = parse_endpoints(
            endpoints, tls_configured=any(path is not None for path in tls_files)
        )
        self._root_certificates = _read(ca_cert, "ca_cert")
        self._private_key = _read(cert_key, "cert_key")
        self._certificate_chain = _read(cert_cert, "cert_cert")
        self._username = username
        self._password = password
        self.timeout = float(timeout)
        self._index = 0
        self._current: Stubs | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    @property
    def endpoints(self) -> list[str]:
        return [endpoint.text for endpoint in self._endpoints]

    @property
    def closed(self) -> bool:
        return self._closed

    async def stubs(self) -> Stubs:
        """The current channel's stubs, opening (and logging in on) a channel if needed."""
        async with self._lock:
            if self._closed:
                raise RuntimeError("the etcd connection is closed")
            if self._current is None:
                self._current = await self._open(self._endpoints[self._index])
            return self._current

    async def _open(self, endpoint: _Endpoint) -> Stubs:
        if endpoint.tls:
            credentials = grpc.ssl_channel_credentials(
                self._root_certificates, self._private_key, self._certificate_chain
            )
            channel = grpc.aio.secure_channel(endpoint.target, credentials, _CHANNEL_OPTIONS)
        else:
            channel = grpc.aio.insecure_channel(endpoint.target, _CHANNEL_OPTIONS)
        metadata = None
        if self._username is not None:
            request = rpc.AuthenticateRequest(name=self._username, password=self._password)
            try:
                reply = await rpc.AuthStub(channel).Authenticate(request, timeout=self.timeout)
            except grpc.aio.AioRpcError as error:
                await channel.close()
                if error.code() in _TRANSIENT:
                    self._index = (self._index + 1) % len(self._endpoints)
                    raise
                raise PermissionError(
                    f"etcd at {endpoint.text} refused user {self._username!r}: {error.details()}"
                ) from None
            metadata = (("token", reply.token),)
        return Stubs(
            channel=channel,
            endpoint=endpoint.text,
            metadata=metadata,
            kv=rpc.KVStub(channel),
            watch=rpc.WatchStub(channel),
            lease=rpc.LeaseStub(channel),
        )

    async def recover(self, stubs: Stubs | None, error: Exception) -> None:
        """After ``error`` on ``stubs`` (``None``: the channel did not open): raises it as a
        ``PermissionError`` or unchanged when retrying cannot help, otherwise drops the channel
        so that the next ``stubs()`` opens one on the next endpoint (or, after a lost token,
        logs in again on the same one)."""
        if isinstance(error, grpc.aio.AioRpcError):
            code = error.code()
            if code == grpc.StatusCode.PERMISSION_DENIED or (
                code == grpc.StatusCode.INVALID_ARGUMENT
                and "user name is empty" in (error.details() or "")
            ):
                where = stubs.endpoint if stubs else "etcd"
                raise PermissionError(f"etcd at {where} refused: {error.details()}") from None
            if code not in _TRANSIENT:
                raise error
            move_on = code != grpc.StatusCode.UNAUTHENTICATED
        elif isinstance(error, _STREAM_FAILURES):
            move_on = True
        else:
            raise error
        if stubs is None:
            return
        async with self._lock:
            if self._current is not stubs:
                return
            self._current = None
            if move_on:
                self._index = (self._index + 1) % len(self._endpoints)
        await stubs.channel.close()

    async def call(self, service: str, method: str, request: Any) -> Any:
        """``request`` through ``service`` (``"kv"`` or ``"lease"``), retried within ``timeout``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        attempts = 0
        while True:
            stubs = None
            try:
                stubs = await self.stubs()
                rpc_method = getattr(getattr(stubs, service), method)
                remaining = max(deadline - loop.time(), 0.001)
                # a channel another call's failover closed cancels this call: retry it too
                return await stream_step(
                    rpc_method(request, timeout=remaining, metadata=stubs.metadata)
                )
            except (grpc.aio.AioRpcError, grpc.aio.UsageError, ConnectionError) as error:
                await self.recover(stubs, error)
                failure = error
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise ConnectionError(
                    f"no etcd endpoint of {self.endpoints} answered {method} within "
                    f"{self.timeout} s: {describe(failure)}"
                ) from failure
            attempts += 1
            if attempts % len(self._endpoints) == 0:  # each endpoint failed once more
                await asyncio.sleep(min(backoff(attempts // len(self._endpoints)), remaining))

    async def aclose(self) -> None:
        """Closes the channel; calls in flight fail, later ones raise ``RuntimeError``."""
        async with self._lock:
            self._closed = True
            current, self._current = self._current, None
        if current is not None:
            await current.channel.close()
