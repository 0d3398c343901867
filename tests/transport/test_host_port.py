"""``shardline.host_port``: the one ``host:port`` parser and formatter, round trips over IPv4,
IPv6 (with and without a zone) and host names, malformed text refused, and every answer
checked against a small reference model written with a regular expression."""

from __future__ import annotations

import ipaddress
import re

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from shardline import InvalidAddress
from shardline.host_port import join_host_port, split_host_port

ports = st.integers(0, 65535)
ipv4 = st.ip_addresses(v=4).map(str)
# compressed ("::1"), exploded ("0000:...:0001") and IPv4-mapped ("::ffff:1.2.3.4") forms
ipv6 = st.ip_addresses(v=6).flatmap(
    lambda address: st.sampled_from(
        [str(address), address.exploded, str(address).upper()]
        + ([f"::ffff:{address.ipv4_mapped}"] if address.ipv4_mapped else [])
    )
)
zones = st.from_regex(r"[A-Za-z0-9_.\-]{1,15}", fullmatch=True)
ipv6_with_zone = st.builds(lambda address, zone: f"{address}%{zone}", ipv6, zones)
names = st.from_regex(r"[A-Za-z0-9_\-]{1,20}(\.[A-Za-z0-9_\-]{1,20}){0,3}", fullmatch=True)
hosts = st.one_of(ipv4, ipv6, ipv6_with_zone, names, st.just("localhost"))


@given(hosts, ports)
@example("::1", 0)
@example("::1", 65535)
@example("127.0.0.1", 8080)
@example("fe80::1%eth0", 443)
def test_a_written_address_reads_back_as_its_host_and_port(host: str, port: int) -> None:
    written = join_host_port(host, port)
    assert split_host_port(written, any_port=True) == (host, port)
    if ":" in host:
        assert written == f"[{host}]:{port}"
    else:
        assert written == f"{host}:{port}"
    if port > 0:
        assert split_host_port(written) == (host, port)


@given(hosts, ports)
def test_a_read_address_is_written_back_as_it_was(host: str, port: int) -> None:
    text = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    assert join_host_port(*split_host_port(text, any_port=True)) == text


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("nope", None),
        (":80", None),
        ("", None),
        ("[::1]", None),
        ("[::1]80", None),
        ("[::1:80", None),
        ("127.0.0.1:x", "the port 'x' is not a number"),
        ("127.0.0.1:", "the port '' is not a number"),
        ("127.0.0.1:-1", "the port '-1' is not a number"),
        ("127.0.0.1:²", "the port '²' is not a number"),
        ("127.0.0.1: 80", "the port ' 80' is not a number"),
        ("127.0.0.1:99999", "port 99999 is out of range (1 to 65535)"),
        ("127.0.0.1:0", "port 0 is out of range (1 to 65535)"),
        ("127.0.0.1:000080", "port 000080 is out of range (1 to 65535)"),
        ("::1:80", "an IPv6 host is written in brackets, as [::1]:port"),
        ("::1", "an IPv6 host is written in brackets, as [::1]:port"),
        ("fe80::1%eth0:80", "an IPv6 host is written in brackets, as [::1]:port"),
        ("[127.0.0.1]:80", "'127.0.0.1' is not an IPv6 address"),
        ("[localhost]:80", "'localhost' is not an IPv6 address"),
        ("[[::1]]:80", None),
        ("[::1%]:80", "'::1%' is not an IPv6 address"),
        ("[fe80::1%a b]:80", "'fe80::1%a b' has a zone that is no interface name"),
        ("my host:80", "the host 'my host' has a character no host name has: ' '"),
        ("user@host:80", "the host 'user@host' has a character no host name has: '@'"),
        ("host/path:80", "the host 'host/path' has a character no host name has: '/'"),
        ("host]:80", "the host 'host]' has a character no host name has: ']'"),
        ("127.0.0.1%lo:80", "the host '127.0.0.1%lo' has a character no host name has: '%'"),
    ],
)
def test_malformed_addresses_are_refused_naming_them(address: str, reason: str | None) -> None:

    with pytest.raises(InvalidAddress) as raised:
        split_host_port(address)
    assert raised.value.reason == reason
    message = f"address must be host:port, got {address!r}" + (f": {reason}" if reason else "")
    assert str(raised.value) == message
    assert isinstance(raised.value, ValueError)


def test_port_0_is_any_port_for_a_server_only() -> None:

    assert split_host_port("[::1]:0", any_port=True) == ("::1", 0)
    with pytest.raises(InvalidAddress, match=re.escape("port 0 is out of range (1 to 65535)")):
        split_host_port("[::1]:0")
    with pytest.raises(InvalidAddress, match=re.escape("port 65536 is out of range (0 to 65535)")):
        split_host_port("[::1]:65536", any_port=True)


@pytest.mark.parametrize(
    ("host", "port", "reason"),
    [
        ("[::1]", 80, "'[::1]' is not an IPv6 address"),
        ("::1:", 80, "'::1:' is not an IPv6 address"),
        ("", 80, "the host '' is not a non-empty str"),
        (None, 80, "the host None is not a non-empty str"),
        ("a b", 80, "the host 'a b' has a character no host name has: ' '"),
        ("::1", 65536, "the port 65536 is not an int from 0 to 65535"),
        ("::1", -1, "the port -1 is not an int from 0 to 65535"),
        ("::1", True, "the port True is not an int from 0 to 65535"),
        ("::1", "80", "the port '80' is not an int from 0 to 65535"),
    ],
)
def test_a_host_and_port_that_make_no_address_are_refused(
    host: object, port: object, reason: str
) -> None:

    with pytest.raises(InvalidAddress) as raised:
        join_host_port(host, port)  # type: ignore[arg-type]
    assert raised.value.reason == reason
    assert str(raised.value) == (
        f"host {host!r} and port {port!r} make no host:port address: {reason}"
    )


def test_an_address_that_is_not_a_str_is_refused() -> None:

    with pytest.raises(InvalidAddress, match=re.escape("address must be a host:port str, got 80")):
        split_host_port(80)


# The reference model: the grammar written as one regular expression, the IPv6 literal checked
# by ipaddress, the port's range by int(). Over an alphabet small enough that Hypothesis
# reaches every branch: brackets, colons, hex digits, a zone's "%", and characters no host has.
_GRAMMAR = re.compile(
    r"\[(?P<ipv6>[0-9A-Fa-f:.]+(%[A-Za-z0-9_.\-]+)?)\]:(?P<port6>[0-9]{1,5})"
    r"|(?P<name>[A-Za-z0-9_.\-]+):(?P<port>[0-9]{1,5})"
)


def reference(address: str, any_port: bool) -> tuple[str, int] | None:
    found = _GRAMMAR.fullmatch(address)
    if found is None:
        return None
    host = found["ipv6"] or found["name"]
    port = int(found["port6"] or found["port"])
    if found["ipv6"]:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return None
    if not (0 if any_port else 1) <= port <= 65535:
        return None
    return host, port


@given(
    st.one_of(
        st.text(alphabet="[]:%.0123456789abcdefABCDEFx-_ /@", max_size=24),
        st.builds(lambda host, port: f"[{host}]:{port}", ipv6, st.integers(0, 99999)),
        st.builds(lambda host, port: f"{host}:{port}", hosts, st.integers(0, 99999)),
    ),
    st.booleans(),
)
@example("::1:80", False)
@example("[::1]:0", True)
def test_the_parser_accepts_exactly_what_the_reference_model_does(
    address: str, any_port: bool
) -> None:
    expected = reference(address, any_port)
    if expected is None:
        with pytest.raises(InvalidAddress) as raised:
            split_host_port(address, any_port=any_port)
        assert repr(address) in str(raised.value)
    else:
        assert split_host_port(address, any_port=any_port) == expected
