"""The ``shardline`` command's usage errors: status 2, one line on stderr naming the option
and the value, nothing on stdout, nothing started. A worker that cannot serve an address it
was allowed to try exits 1, with one line of its own (no gRPC log line before it)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

TIMEOUT = 60.0
WORKER = ("worker", "--namespace", "usage")


def shardline(directory: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    """``python -m shardline ARGUMENTS``, LocalDiscovery's folder under ``directory``."""
    return subprocess.run(
        [sys.executable, "-m", "shardline", *arguments],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "XDG_RUNTIME_DIR": str(directory)},
        check=False,
    )


USAGE_ERRORS = [
    # the address: not host:port, a port out of range, a wildcard host nobody can dial
    ((*WORKER, "--address", "nope"), "--address must be HOST:PORT", "'nope'"),
    ((*WORKER, "--address", "127.0.0.1:99999"), "port 99999 is out of range", "127.0.0.1:99999"),
    ((*WORKER, "--address", "127.0.0.1:x"), "the port 'x' is not a number", "127.0.0.1:x"),
    ((*WORKER, "--address", "0.0.0.0:0"), "no address a subscriber can dial", "0.0.0.0"),
    ((*WORKER, "--address", "[::]:0", "--transport", "grpc"), "no address a subscriber", "::"),
    # an IPv6 host goes in brackets ("::1:0" could be the address ::1:0 itself), and only one
    ((*WORKER, "--address", "::1:0"), "an IPv6 host is written in brackets", "'::1:0'"),
    (
        (*WORKER, "--address", "grpc://::1:0", "--transport", "grpc"),
        "an IPv6 host is written in brackets",
        "'grpc://::1:0'",
    ),
    ((*WORKER, "--address", "[127.0.0.1]:0"), "'127.0.0.1' is not an IPv6 address", ""),
    ((*WORKER, "--address", "msgpack+unix://rel.sock"), "must be absolute", "rel.sock"),
    ((*WORKER, "--address", "relative.sock"), "or an absolute path", "relative.sock"),
    # timeouts that contradict each other, or the default they leave in place
    (
        (*WORKER, "--address", "127.0.0.1:0", "--heartbeat", "5", "--liveness-timeout", "1"),
        "--liveness-timeout 1 must be at least twice --heartbeat 5",
        "",
    ),
    (
        (*WORKER, "--address", "127.0.0.1:0", "--heartbeat", "3"),
        "--liveness-timeout 5 (the default) must be at least twice --heartbeat 3",
        "",
    ),
    ((*WORKER, "--address", "127.0.0.1:0", "--heartbeat", "-1"), "argument --heartbeat", "-1"),
    ((*WORKER, "--address", "127.0.0.1:0", "--grace", "nan"), "argument --grace", "nan"),
    ((*WORKER, "--address", "127.0.0.1:0", "--grace", "-1"), "argument --grace", "-1"),
    (
        (*WORKER, "--address", "127.0.0.1:0", "--etcd", "http://127.0.0.1:1", "--ttl", "0"),
        "argument --ttl",
        "'0'",
    ),
    # values the library refuses before anything starts
    ((*WORKER, "--address", "127.0.0.1:0", "--etcd", "nope"), "etcd endpoint", "'nope'"),
    (("worker", "--namespace", "", "--address", "127.0.0.1:0"), "namespace", "''"),
    # argparse's own errors, in one line too
    ((*WORKER, "--address", "127.0.0.1:0", "--weight", "0"), "argument --weight", "'0'"),
    ((*WORKER,), "the following arguments are required: --address", ""),
    ((), "the following arguments are required: COMMAND", "shardline --help"),
    (("demo", "--keys", "many"), "argument --keys", "'many'"),
    (("demo", "--etcd", "http://127.0.0.1:99999"), "--etcd: etcd endpoint", "127.0.0.1:99999"),
    (("inspect", "postgresql://app@127.0.0.1:99999"), "port out of range", "99999"),
    (("inspect", "postgresql://app@127.0.0.1:5432", "--timeout", "nan"), "timeout", "nan"),
]


@pytest.mark.parametrize(
    ("arguments", "says", "names"), USAGE_ERRORS, ids=[" ".join(a) for a, _, _ in USAGE_ERRORS]
)
def test_a_usage_error_exits_2_with_one_line(
    tmp_path: Path, arguments: tuple[str, ...], says: str, names: str
) -> None:
    done = shardline(tmp_path, *arguments)
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    command = f"shardline {arguments[0]}" if arguments else "shardline"
    assert lines[0].startswith(f"{command}: error: ")
    assert says in lines[0]
    assert names in lines[0]
    assert list(tmp_path.iterdir()) == []  # no LocalDiscovery folder: nothing was started


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port another socket listens on."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        yield listener.getsockname()[1]


@pytest.mark.parametrize("transport", ["msgpack", "grpc"])
def test_a_port_in_use_is_one_line_of_ours_and_status_1(
    tmp_path: Path, taken_port: int, transport: str
) -> None:
    address = f"127.0.0.1:{taken_port}"
    done = shardline(tmp_path, *WORKER, "--address", address, "--transport", transport)
    assert (done.returncode, done.stdout) == (1, ""), done.stderr
    assert done.stderr.splitlines() == [
        f"shardline worker: error: cannot serve at {address}: address already in use"
    ]
