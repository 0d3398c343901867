"""A libpq DSN (keyword/value string or ``postgresql://`` URI) as ``asyncpg.connect`` arguments.

asyncpg reads URIs only, while shardline's sources take what libpq takes; this module turns a
keyword/value string into the equivalent URI (asyncpg then applies every parameter as libpq
would: host, port, dbname, user, password, passfile, the ``ssl*`` parameters, and anything else
as a startup parameter, e.g. ``options`` and ``application_name``). It does no I/O and does not
import asyncpg.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping
from typing import Any

__all__ = ["connect_arguments", "parse_dsn"]

_PAIR = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*('(?:[^'\\]|\\.)*'|[^\s']*)(?=\s|\Z)")
_UNQUOTE = re.compile(r"\\(.)")
_URI_SCHEMES = ("postgresql://", "postgres://")


def parse_dsn(dsn: str) -> dict[str, str]:
    """The parameters of a libpq DSN: a keyword/value string, or a URI's host, port, user,
    password, database and query parameters. Raises ``ValueError`` naming what is wrong."""
    if not isinstance(dsn, str):
        raise ValueError(f"dsn must be a str, got {type(dsn).__name__}")
    if dsn.startswith(_URI_SCHEMES):
        return _parse_uri(dsn)
    given: dict[str, str] = {}
    at = 0
    while at < len(dsn) and not dsn[at:].isspace():
        found = _PAIR.match(dsn, at)
        if found is None:
            raise ValueError(f"dsn is not a valid connection string near {dsn[at : at + 20]!r}")
        key, value = found[1], found[2]
        if value.startswith("'"):
            value = _UNQUOTE.sub(r"\1", value[1:-1])
        given[key] = value
        at = found.end()
    return given


def connect_arguments(
    dsn: str, connect_kwargs: Mapping[str, Any] | None = None
) -> tuple[dict[str, Any], str]:
    """Keyword arguments for ``asyncpg.connect`` equivalent to ``dsn`` and ``connect_kwargs``
    (whose ``server_settings`` are merged over the DSN's), and ``host:port`` for messages.

    ``connect_timeout`` is left out: the caller's own timeout bounds connecting.
    ``application_name`` defaults to ``"shardline"``. Raises ``ValueError`` for a malformed
    DSN or ``connect_kwargs`` that are not a mapping with str keys, or that set ``dsn``.
    """
    given = parse_dsn(dsn)
    kwargs = dict(connect_kwargs or {})
    if not all(isinstance(key, str) for key in kwargs):
        raise ValueError(f"connect_kwargs must have str keys, got {sorted(map(repr, kwargs))}")
    if "dsn" in kwargs or "timeout" in kwargs:
        raise ValueError("connect_kwargs must not set dsn or timeout: the source does")
    given.pop("connect_timeout", None)
    if "hostaddr" in given:
        given["host"] = given.pop("hostaddr")
    settings = dict(kwargs.pop("server_settings", None) or {})
    if "application_name" not in given and "application_name" not in settings:
        settings["application_name"] = "shardline"
    if settings:
        kwargs["server_settings"] = settings
    uri = "postgresql://?" + urllib.parse.urlencode(given) if given else "postgresql://"
    host = given.get("host", "localhost")
    where = f"{host}:{given['port']}" if "port" in given else host
    return {"dsn": uri, **kwargs}, where


def _parse_uri(dsn: str) -> dict[str, str]:
    try:
        parts = urllib.parse.urlsplit(dsn)
        query = urllib.parse.parse_qs(parts.query, keep_blank_values=True, strict_parsing=False)
        port = parts.port
    except ValueError as error:
        raise ValueError(f"dsn is not a valid connection URI: {error}") from None
    given: dict[str, str] = {}
    if parts.hostname:
        given["host"] = parts.hostname
    if port is not None:
        given["port"] = str(port)
    if parts.username:
        given["user"] = urllib.parse.unquote(parts.username)
    if parts.password:
        given["password"] = urllib.parse.unquote(parts.password)
    database = parts.path.lstrip("/")
    if database:
        given["dbname"] = urllib.parse.unquote(database)
    for key, values in query.items():
        given[key] = values[-1]
    return given
