"""Network addresses written ``host:port``: the one parser and the one formatter the library uses
wherever it reads or writes one (a worker's ``--address`` and published record, a gRPC target,
a Picodata instance's pgproto address, an etcd endpoint, the server a connection reached).

An IPv6 host is written in brackets, ``[::1]:8080`` (a zone too: ``[fe80::1%eth0]:8080``), and
handed over without them, ``("::1", 8080)``, as :mod:`socket`, asyncio and asyncpg take it. Any
other host, an IPv4 address or a host name, is written as it is. A host is never resolved here.
"""

from __future__ import annotations

import ipaddress
from typing import NoReturn

from shardline.errors import InvalidAddress

__all__ = ["join_host_port", "split_host_port"]

_NAME_PUNCTUATION = frozenset("-._")


def split_host_port(address: object, *, any_port: bool = False) -> tuple[str, int]:
    """``(host, port)`` of ``address``, ``"host:port"`` or ``"[ipv6]:port"`` (the host
    returned without its brackets). The port is a decimal number from 1 to 65535, or from 0
    with ``any_port`` (a server's "pick a free port").

    Raises :class:`~shardline.errors.InvalidAddress` (a ``ValueError``) naming ``address``
    otherwise: no ``host:port`` shape, a port that is not a number or is out of range, an IPv6
    host without brackets (``::1:80`` could be either ``[::1]:80`` or the address
    ``::1:80`` itself), brackets around anything but an IPv6 address, or a host with a
    character no host name has (a space, ``/``, ``@``, ``%``, ...).
    """
    if not isinstance(address, str):
        raise InvalidAddress(f"address must be a host:port str, got {address!r}")
    if address.startswith("["):
        inner, bracket, rest = address[1:].partition("]")
        if not bracket or not rest.startswith(":"):
            raise InvalidAddress(f"address must be host:port, got {address!r}")
        port = rest[1:]
        problem = _ipv6_problem(inner)
        if problem is not None:
            _refuse(address, problem)
        host = inner
    else:
        host, colon, port = address.rpartition(":")
        if not colon or not host:
            raise InvalidAddress(f"address must be host:port, got {address!r}")
        if ":" in host:
            _refuse(address, "an IPv6 host is written in brackets, as [::1]:port")
        problem = _name_problem(host)
        if problem is not None:
            _refuse(address, problem)
    problem = _port_problem(port, any_port)
    if problem is not None:
        _refuse(address, problem)
    return host, int(port)


def join_host_port(host: str, port: int) -> str:
    """``host:port``, with an IPv6 ``host`` in brackets (``[::1]:8080``): what
    :func:`split_host_port` reads back as ``(host, port)`` with ``any_port``.

    Raises :class:`~shardline.errors.InvalidAddress` naming both for a ``port`` that is not an
    int from 0 to 65535 or a ``host`` that :func:`split_host_port` would refuse (a host
    already in brackets included).
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        problem: str | None = f"the port {port!r} is not an int from 0 to 65535"
    elif not isinstance(host, str) or not host:
        problem = f"the host {host!r} is not a non-empty str"
    elif ":" in host:
        problem = _ipv6_problem(host)
    else:
        problem = _name_problem(host)
    if problem is not None:
        raise InvalidAddress(
            f"host {host!r} and port {port!r} make no host:port address: {problem}",
            reason=problem,
        )
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _refuse(address: str, reason: str) -> NoReturn:
    raise InvalidAddress(f"address must be host:port, got {address!r}: {reason}", reason=reason)


def _port_problem(port: str, any_port: bool) -> str | None:
    # ASCII digits only: str.isdigit() also takes "²", which int() then refuses
    if not (port.isascii() and port.isdigit()):
        return f"the port {port!r} is not a number"
    lowest = 0 if any_port else 1
    if len(port) > 5 or not lowest <= int(port) <= 65535:
        return f"port {port} is out of range ({lowest} to 65535)"
    return None


def _ipv6_problem(text: str) -> str | None:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return f"{text!r} is not an IPv6 address"
    zone = text.partition("%")[2]
    if zone and _name_problem(zone) is not None:
        return f"{text!r} has a zone that is no interface name"
    return None


def _name_problem(name: str) -> str | None:
    """Why ``name`` is no host name (letters, digits, ``-``, ``.``, ``_``), or None."""
    for character in name:
        if not (character.isalnum() or character in _NAME_PUNCTUATION):
            return f"the host {name!r} has a character no host name has: {character!r}"
    return None
