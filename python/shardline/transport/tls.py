"""`TlsSettings`: the certificates a worker serves TLS with and a caller verifies it by, one
type for both transports and both sides; and the rule that refuses plaintext off loopback."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import ssl
import stat
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shardline.checks import refusal
from shardline.errors import InvalidArgumentType

if TYPE_CHECKING:
    import grpc

__all__ = ["TlsSettings", "check_plaintext"]

logger = logging.getLogger("shardline.transport.tls")

# Bytes of one SSL read buffer (uvloop's and asyncio's SSL_READ_MAX_SIZE), rounded up.
_READ_BUFFER = 320 * 1024
_allocator_settled = False


def _settle_allocator() -> None:
    """Frees one block the size of an SSL read buffer, once per process.

    Why: uvloop reads a TLS record with ``SSLObject.read(256 KiB)``, which allocates that
    much and shrinks it. glibc serves a block over its mmap threshold (128 KiB at start) with
    ``mmap`` and unmaps it again: page faults and a TLB flush on every read, 2.5x the CPU of a
    whole call on both sides (73 against 28 us measured). glibc raises the threshold to the
    size of the first such block freed, which a connection's reads never do (they shrink,
    then free a small block) until one closes; freeing one here makes every connection cheap
    from its start. Elsewhere than glibc this costs one allocation.
    """
    global _allocator_settled
    if not _allocator_settled:
        _allocator_settled = True
        block = bytearray(_READ_BUFFER)
        del block


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """Where the PEM files of a TLS (or mutual TLS) connection are, for a worker and for its
    callers alike. Frozen and hashable: connections given equal settings share a socket.

    - ``cert`` and ``key``: this side's certificate chain and its private key. A worker must
      have them; a caller gives them to present a client certificate (mutual TLS).
    - ``ca``: the certificates of the authorities to trust. On a worker, giving it turns on
      mutual TLS: every client must present a certificate that one of them signed (and that
      has not expired), or its handshake is refused. On a caller, the worker's certificate
      must chain to one of them; without it, to the system's trust store.
    - ``server_hostname``: the name a caller checks the worker's certificate against, instead
      of the host of the worker's address (say the certificate names ``worker.internal`` and
      the record an IP address). The worker's name is always checked: there is no option to
      turn that off.

    Paths may be str or ``os.PathLike`` (kept as str). A file that cannot be read, ``key``
    without ``cert`` or the other way round, or an empty ``server_hostname`` is a
    ``ValueError`` naming it, raised here. A file whose content TLS cannot use (not PEM, a key
    that does not match the certificate) is a ``ValueError`` naming the files when the first
    context is made (:meth:`server_context`, :meth:`client_context`, which ``serve`` and the
    connections call before they bind or dial). The files are read then, once per settings
    object: make a new one to pick up renewed files.

    A worker whose ``key`` file can be read by other users than its owner logs a WARNING.
    """

    cert: str | None = None
    key: str | None = None
    ca: str | None = None
    server_hostname: str | None = None
    _made: dict[str, Any] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )

    def __post_init__(self) -> None:
        for name in ("cert", "key", "ca"):
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, str | os.PathLike):
                raise InvalidArgumentType(f"TlsSettings {name} must be a path, got {value!r}")
            path = os.fspath(value)
            if not isinstance(path, str) or not path:
                raise ValueError(f"TlsSettings {name} must be a non-empty path, got {value!r}")
            try:
                with open(path, "rb") as file:
                    file.read(1)
            except OSError as error:
                raise ValueError(
                    f"TlsSettings {name} {path!r} cannot be read: {error.strerror or error}"
                ) from None
            object.__setattr__(self, name, path)
        if (self.cert is None) != (self.key is None):
            given, missing = ("cert", "key") if self.key is None else ("key", "cert")
            raise ValueError(
                f"TlsSettings {given} {getattr(self, given)!r} is given without {missing}: a"
                " certificate and its private key go together"
            )
        server = self.server_hostname
        if server is not None and (
            not isinstance(server, str) or not server or server != server.strip()
        ):
            raise refusal(server, str)(
                f"TlsSettings server_hostname must be a host name, got {server!r}"
            )

    @property
    def mutual(self) -> bool:
        """Whether a worker served with these settings requires client certificates."""
        return self.ca is not None

    def server_context(self) -> ssl.SSLContext:
        """The context a worker serves with: its certificate, and with ``ca`` the client
        certificates required and verified. ``ValueError`` without ``cert`` and ``key``."""
        made = self._made.get("server")
        if made is None:
            if self.cert is None or self.key is None:
                raise ValueError(
                    "TlsSettings without cert and key cannot serve: a worker presents its own"
                    " certificate"
                )
            self._warn_if_key_is_shared()
            _settle_allocator()
            # (no default certificates: with ca, those alone may sign a client's)
            made = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._load_chain(made)
            if self.ca is not None:
                self._load_ca(made)
                made.verify_mode = ssl.CERT_REQUIRED
            self._made["server"] = made
        return made

    def client_context(self) -> ssl.SSLContext:
        """The context a caller dials with: the worker's certificate verified against ``ca``
        (or the system's trust store) and its name checked; ``cert`` presented if given."""
        made = self._made.get("client")
        if made is None:
            _settle_allocator()
            # (this protocol verifies the certificate and checks the name)
            made = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            if self.ca is None:
                made.load_default_certs(ssl.Purpose.SERVER_AUTH)
            else:
                self._load_ca(made)  # these alone, not the system's store as well
            if self.cert is not None:
                self._load_chain(made)
            self._made["client"] = made
        return made

    def grpc_server_credentials(self) -> grpc.ServerCredentials:
        """:meth:`server_context` as gRPC server credentials (the same files, checked the
        same way first)."""
        made = self._made.get("grpc-server")
        if made is None:
            import grpc

            self.server_context()
            assert self.cert is not None
            assert self.key is not None
            made = grpc.ssl_server_credentials(
                [(_read(self.key), _read(self.cert))],
                root_certificates=None if self.ca is None else _read(self.ca),
                require_client_auth=self.mutual,
            )
            self._made["grpc-server"] = made
        return made

    def grpc_channel_credentials(self) -> grpc.ChannelCredentials:
        """:meth:`client_context` as gRPC channel credentials. The same object each time, so
        connections with these settings share a channel."""
        made = self._made.get("grpc-channel")
        if made is None:
            import grpc

            self.client_context()
            made = grpc.ssl_channel_credentials(
                root_certificates=None if self.ca is None else _read(self.ca),
                private_key=None if self.key is None else _read(self.key),
                certificate_chain=None if self.cert is None else _read(self.cert),
            )
            self._made["grpc-channel"] = made
        return made

    def _load_chain(self, context: ssl.SSLContext) -> None:
        assert self.cert is not None
        assert self.key is not None
        try:
            context.load_cert_chain(self.cert, self.key)
        except (ssl.SSLError, OSError) as error:
            raise ValueError(
                f"TlsSettings cert {self.cert!r} and key {self.key!r} cannot be used: {error}"
                " (PEM files, the key that of the certificate's first entry)"
            ) from None

    def _load_ca(self, context: ssl.SSLContext) -> None:
        try:
            context.load_verify_locations(cafile=self.ca)
        except (ssl.SSLError, OSError) as error:
            raise ValueError(
                f"TlsSettings ca {self.ca!r} cannot be used: {error} (PEM certificates)"
            ) from None

    def _warn_if_key_is_shared(self) -> None:
        assert self.key is not None
        mode = os.stat(self.key).st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            logger.warning(
                "the private key %s is readable by other users than its owner (mode %o): make"
                " it 0600",
                self.key,
                stat.S_IMODE(mode),
            )


def _read(path: str) -> bytes:
    with open(path, "rb") as file:
        return file.read()


async def check_plaintext(host: str, port: int, insecure: bool) -> None:
    """``ValueError`` when serving plaintext at ``host`` would be reachable from another
    machine (``host`` is not loopback: an address of another interface, or a name resolving to
    one) and ``insecure`` is false. Called before binding.

    Implementation notes: a name is resolved as the bind will resolve it, every address it
    gives must be loopback; one that does not resolve is left to the bind to refuse.
    """
    if insecure:
        return
    try:
        hosts = [ipaddress.ip_address(host.partition("%")[0])]
    except ValueError:
        try:
            found = await asyncio.get_running_loop().getaddrinfo(host, port)
        except OSError:
            return
        hosts = [ipaddress.ip_address(str(entry[4][0]).partition("%")[0]) for entry in found]
    if hosts and all(address.is_loopback for address in hosts):
        return
    raise ValueError(
        f"refusing to serve plaintext at {host} (port {port}), which is not a loopback address:"
        " anyone who can reach it could run every handler. Serve with TLS"
        " (tls=TlsSettings(cert=..., key=...), shardline worker --tls-cert/--tls-key), or say"
        " insecure=True (--insecure) on a network where that is acceptable"
    )
