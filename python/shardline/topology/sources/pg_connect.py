"""What the sources that talk pgwire share about connecting with asyncpg: the DSN and
``connect_kwargs`` checks, the server a connection reached, and error messages.

It imports asyncpg (the ``pg`` extra); only the modules that connect import it.
"""

from __future__ import annotations

import inspect
import os
import urllib.parse
from collections.abc import Mapping
from typing import Any, Final

from shardline._extras import requires_extra

with requires_extra("pg", __name__):
    import asyncpg

from shardline.errors import InvalidAddress, InvalidArgumentType
from shardline.host_port import join_host_port

__all__ = ["CLOSE_TIMEOUT", "connect_kwargs", "message", "parse_dsn", "peer"]

CLOSE_TIMEOUT: Final = 1.0
"""How long closing a connection politely (asyncpg's Terminate message) may take."""

_SCHEMES = ("postgresql", "postgres")
_MANAGED = ("dsn", "timeout")  # the connect arguments the sources set themselves


def parse_dsn(dsn: object) -> tuple[str, dict[str, str]]:
    """Checks ``dsn`` the way asyncpg will read it; returns where it points (its hosts, for
    the source's name) and its query parameters. Raises ``ValueError`` naming the problem.

    Implementation notes:
        asyncpg parses a DSN only when it connects, and reads URIs only; this catches at
        construction what it would refuse at every connect: another scheme (a libpq
        ``key=value`` string has none), a malformed query string, a port that is not a number
        or is out of range.
        Credentials are left out of every message.
    """
    if not isinstance(dsn, str):
        raise InvalidArgumentType(f"dsn must be a str, got {type(dsn).__name__}")
    parts = urllib.parse.urlsplit(dsn)
    if parts.scheme not in _SCHEMES:
        raise ValueError(
            "dsn must be a postgresql:// or postgres:// URI (libpq key=value strings are not"
            f" accepted), got {'scheme ' + repr(parts.scheme) if parts.scheme else 'no scheme'}"
        )
    try:
        query = urllib.parse.parse_qs(parts.query, strict_parsing=True) if parts.query else {}
    except ValueError as error:
        raise ValueError(f"dsn has a malformed query string: {error}") from None
    settings = {key: values[-1] for key, values in query.items()}
    hosts = parts.netloc.rpartition("@")[2]
    for item in hosts.split(","):
        port = item.rpartition("]")[2].partition(":")[2]  # "[::1]:5432", "host:5432", "host"
        if port and not port.isdigit():
            raise ValueError(f"dsn has a port that is not a number: {port!r}")
        if port and int(port) > 65535:
            raise ValueError(f"dsn has a port out of range (0 to 65535): {port}")
    host = urllib.parse.unquote(hosts) or settings.get("host") or "localhost"
    query_port = settings.get("port")
    return (f"{host}:{query_port}" if query_port and ":" not in host else host), settings


def connect_kwargs(
    given: Mapping[str, Any] | None, dsn_settings: Mapping[str, str]
) -> dict[str, Any]:
    """``given`` checked as ``asyncpg.connect`` arguments (not ``dsn`` nor ``timeout``, which
    the source sets), with ``server_settings`` copied and ``application_name`` defaulting to
    ``"shardline"`` unless the DSN (``dsn_settings``) sets it. Raises ``ValueError``."""
    kwargs = dict(given or {})
    if not all(isinstance(key, str) for key in kwargs):
        raise InvalidArgumentType(
            f"connect_kwargs must have str keys, got {sorted(map(repr, kwargs))}"
        )
    managed = sorted(key for key in _MANAGED if key in kwargs)
    if managed:
        raise ValueError(f"connect_kwargs must not set {', '.join(managed)}: the source does")
    unknown = sorted(set(kwargs) - set(inspect.signature(asyncpg.connect).parameters))
    if unknown:
        raise ValueError(
            f"connect_kwargs has arguments asyncpg.connect does not take: {', '.join(unknown)}"
            " (server settings such as application_name go in server_settings)"
        )
    settings = kwargs.get("server_settings") or {}
    if not isinstance(settings, Mapping) or not all(
        isinstance(key, str) and isinstance(value, str) for key, value in settings.items()
    ):
        raise InvalidArgumentType(
            f"connect_kwargs['server_settings'] must map str to str, got {settings!r}"
        )
    settings = dict(settings)  # the caller's mapping is left as it is
    if "application_name" not in dsn_settings:
        settings.setdefault("application_name", "shardline")
    kwargs["server_settings"] = settings
    return kwargs


def peer(connection: asyncpg.Connection) -> str:
    """The server a connection reached, ``host:port`` (an IPv6 host in brackets; or its socket
    path).

    Implementation notes:
        asyncpg has no public accessor for it; ``Connection._addr`` holds the address it
        connected to, among the DSN's hosts.
    """
    address = getattr(connection, "_addr", None)
    if isinstance(address, tuple) and len(address) >= 2:
        try:
            return join_host_port(address[0], address[1])
        except InvalidAddress:
            pass  # not a host and port after all: said as it is
    return str(address)


def message(error: BaseException) -> str:
    """The first line of an error's text, a refused connect's reason in words first."""
    text = str(error).strip() or type(error).__name__
    if isinstance(error, ConnectionError) and error.errno:
        # asyncio says "[Errno 111] Connect call failed (…)": the reason, in words, goes first
        text = f"{os.strerror(error.errno)}: {text}"
    return text.splitlines()[0]
