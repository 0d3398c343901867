"""``shardline worker``: one worker process serving the demo handlers, or the caller's
(``--handlers MODULE:ATTRIBUTE``), announced through discovery."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import os
import signal
import socket
import sys
import uuid
from typing import TYPE_CHECKING, Any

import shardline
from shardline.cli.arguments import (
    CommandParser,
    handlers_argument,
    seconds_argument,
    usage_error,
    weight_argument,
    whole_seconds_argument,
)
from shardline.discovery.protocol import Discovery
from shardline.errors import InvalidAddress
from shardline.host_port import split_host_port
from shardline.transport.schemes import DEFAULT_TRANSPORT, TRANSPORTS

if TYPE_CHECKING:
    from shardline.transport.tls import TlsSettings

__all__ = ["add_worker_command"]


def add_worker_command(commands: argparse._SubParsersAction[CommandParser]) -> None:
    worker = commands.add_parser(
        "worker",
        help="run one worker process serving your handlers or the demo's (MessagePack-RPC, gRPC)",
        description=(
            "Serve the handlers of --handlers MODULE:ATTRIBUTE, or the demo handlers (echo,"
            " sleep, whoami, fail-transiently, fail), over"
            " MessagePack-RPC (or gRPC with --transport grpc) and announce the worker through"
            " LocalDiscovery, or etcd with --etcd. When ready, print"
            " the worker's discovery record as one line of JSON on stdout. SIGTERM or SIGINT"
            " withdraws the record, lets calls in flight finish and exits."
        ),
    )
    worker.add_argument("--namespace", required=True, help="the discovery namespace to join")
    worker.add_argument(
        "--handlers",
        type=handlers_argument,
        metavar="MODULE:ATTRIBUTE",
        help=(
            "serve the handlers at MODULE:ATTRIBUTE (e.g. myapp.handlers:HANDLERS), a mapping of"
            " handler names to callables, MODULE imported with the current directory first on"
            " the path (default: the demo handlers)"
        ),
    )
    worker.add_argument(
        "--address",
        required=True,
        metavar="HOST:PORT",
        help=(
            "where to serve, as subscribers will dial it (so not 0.0.0.0 or ::); an IPv6 host"
            " in brackets, [::1]:0; port 0 picks a free port. With the msgpack transport, an"
            " absolute path serves on a Unix socket"
        ),
    )
    worker.add_argument(
        "--transport",
        choices=TRANSPORTS,
        default=DEFAULT_TRANSPORT,
        help=(
            f"MessagePack-RPC (msgpack extra) or gRPC (grpc extra) (default: {DEFAULT_TRANSPORT})"
        ),
    )
    worker.add_argument(
        "--tls-cert",
        metavar="PEM",
        help=(
            "serve TCP with TLS, presenting this certificate chain (with --tls-key); the"
            " record's address then says msgpack+tls:// (grpcs:// with gRPC)"
        ),
    )
    worker.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert")
    worker.add_argument(
        "--tls-ca",
        metavar="PEM",
        help="mutual TLS: require client certificates signed by these authorities",
    )
    worker.add_argument(
        "--insecure",
        action="store_true",
        help=(
            "serve plaintext on an address that is not loopback (refused otherwise: anyone who"
            " can reach it could run every handler)"
        ),
    )
    worker.add_argument(
        "--etcd",
        metavar="URL",
        help="announce through the etcd at URL (e.g. http://127.0.0.1:2379), not LocalDiscovery",
    )
    worker.add_argument(
        "--etcd-ca", metavar="PEM", help="etcd only: the CA that signed etcd's certificate"
    )
    worker.add_argument(
        "--etcd-cert", metavar="PEM", help="etcd only: a client certificate (with --etcd-key)"
    )
    worker.add_argument("--etcd-key", metavar="PEM", help="etcd only: its private key")
    worker.add_argument(
        "--etcd-user",
        metavar="NAME",
        help=f"etcd only: log in as NAME, with the password in ${_ETCD_PASSWORD}",
    )
    worker.add_argument(
        "--uid", type=uuid.UUID, help="the worker's uid (default: a new random one)"
    )
    worker.add_argument(
        "--grace",
        type=seconds_argument(zero=True),
        default=5.0,
        metavar="SECONDS",
        help="how long calls in flight may take to finish on shutdown (default: 5)",
    )
    worker.add_argument(
        "--weight",
        type=weight_argument,
        metavar="W",
        help="a weight for WeightedRoundRobinLoadBalancer, as the record's extra 'weight'",
    )
    worker.add_argument(
        "--heartbeat",
        type=seconds_argument(zero=False),
        metavar="SECONDS",
        help="LocalDiscovery only: how often the worker's liveness is renewed (default: 1)",
    )
    worker.add_argument(
        "--liveness-timeout",
        type=seconds_argument(zero=False),
        metavar="SECONDS",
        help=(
            "LocalDiscovery only: how long after its last heartbeat a worker that died is"
            " dropped (default: 5; at least twice the heartbeat)"
        ),
    )
    worker.add_argument(
        "--ttl",
        type=whole_seconds_argument,
        metavar="SECONDS",
        help=(
            "etcd only: the TTL of the lease the record is attached to, i.e. how long a worker"
            " that died stays registered (default: 10; etcd may grant more)"
        ),
    )
    worker.add_argument(
        "--limit",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help=(
            "msgpack only, repeatable: a bound the worker keeps whatever its clients send, one"
            " of WorkerLimits' fields (max_connections, max_calls, max_queued_bytes,"
            " hello_timeout, idle_timeout, frame_timeout, handshake_timeout,"
            " max_message_items, max_payload_items, accept_burst, accept_rate,"
            " violation_burst, violation_rate, log_interval), e.g."
            " --limit max_calls=2048 (default: docs/msgpack-rpc.md)"
        ),
    )
    worker.set_defaults(run=_worker)


def _worker(args: argparse.Namespace) -> int:
    local_only = [
        option
        for option, value in (
            ("--heartbeat", args.heartbeat),
            ("--liveness-timeout", args.liveness_timeout),
        )
        if value is not None
    ]
    if args.etcd is not None and local_only:
        return usage_error("worker", f"{local_only[0]} applies to LocalDiscovery, not --etcd")
    if args.etcd is None and args.ttl is not None:
        return usage_error("worker", "--ttl applies to --etcd only")
    if args.etcd is None and (given := _etcd_credentials(args)):
        return usage_error("worker", f"{given[0]} applies to --etcd only")
    if args.etcd_user is not None and _ETCD_PASSWORD not in os.environ:
        return usage_error("worker", f"--etcd-user needs the password in ${_ETCD_PASSWORD}")
    if args.etcd is None and (contradiction := _liveness_contradiction(args)):
        return usage_error("worker", contradiction)
    if problem := _address_problem(args.address, args.transport):
        return usage_error("worker", problem)
    if problem := _tls_problem(args):
        return usage_error("worker", problem)
    if args.limit and args.transport != "msgpack":
        return usage_error("worker", "--limit applies to the msgpack transport")
    if args.transport == "grpc":
        # gRPC's core logs a failed bind on stderr before the exception says it again; the
        # worker reports failures itself (GRPC_VERBOSITY=debug, set by the user, still works)
        os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from shardline.transport.event_loop import run

    return run(_serve_worker(args))


async def _serve_worker(args: argparse.Namespace) -> int:
    # Imported here so `shardline demo` needs neither a transport nor an etcd client.
    from shardline.discovery.record import encode_record
    from shardline.transport import serve
    from shardline.transport.demo_handlers import DEMO_HANDLERS

    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    # A ValueError is the library refusing a value given on the command line: a usage error.
    try:
        tls = _tls_settings(args)
        discovery = _worker_discovery(args)
    except ValueError as error:
        return usage_error("worker", str(error))
    except OSError as error:
        print(f"shardline worker: error: {error}", file=sys.stderr)
        return 1
    try:
        try:
            server = await serve(
                DEMO_HANDLERS if args.handlers is None else args.handlers,
                args.address,
                discovery,
                transport=args.transport,
                uid=args.uid,
                version=shardline.__version__,
                extra=None if args.weight is None else {"weight": args.weight},
                tls=tls,
                insecure=args.insecure,
                **_limits(args.limit),
            )
        except ValueError as error:
            return usage_error("worker", str(error))
        except OSError as error:
            print(f"shardline worker: error: {_serve_failure(args, error)}", file=sys.stderr)
            return 1
        try:
            print(encode_record(server.metadata).decode(), flush=True)
            await stopping.wait()
        finally:
            await server.stop(args.grace)
    finally:
        await discovery.aclose()
    return 0


def _limits(settings: list[str]) -> dict[str, Any]:
    """``serve``'s ``limits`` option for ``--limit`` (none given: none, the defaults)."""
    from shardline.transport.limits import WorkerLimits

    return {"limits": WorkerLimits.parse(settings)} if settings else {}


def _serve_failure(args: argparse.Namespace, error: OSError) -> str:
    """One line saying why the worker could not start serving.

    Implementation notes:
        Both servers raise ``OSError("cannot serve at ADDRESS: ...")`` when they cannot bind;
        anything else (the discovery failing to publish, say) is said as it was raised. An
        errno is said with its text alone. gRPC's error says only that it could not bind, and
        a host that does not resolve has no errno, so for those the reason is found by
        resolving and binding the same TCP address once more.
    """
    text = error.strerror if error.errno is not None and error.strerror else str(error)
    if not text.startswith("cannot serve at"):
        return str(error)
    if error.errno is not None and error.errno > 0:
        return f"cannot serve at {args.address}: {os.strerror(error.errno).lower()}"
    try:
        host, port = split_host_port(
            args.address.removeprefix(_TCP_PREFIXES[args.transport]), any_port=True
        )
    except InvalidAddress:
        return text  # not TCP (a Unix socket's failure comes with its errno)
    try:
        family, kind, protocol, _, where = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, protocol) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(where)
    except OSError as reason:
        if reason.strerror:
            return f"cannot serve at {args.address}: {reason.strerror.lower()}"
    return text


_HEARTBEAT = 1.0


_LIVENESS_TIMEOUT = 5.0


def _liveness_contradiction(args: argparse.Namespace) -> str | None:
    """Why ``--heartbeat`` and ``--liveness-timeout`` cannot both hold, or None."""
    heartbeat = _HEARTBEAT if args.heartbeat is None else args.heartbeat
    timeout = _LIVENESS_TIMEOUT if args.liveness_timeout is None else args.liveness_timeout
    if timeout >= 2 * heartbeat:
        return None

    def given(option: str, value: float | None, default: float) -> str:
        return f"{option} {default:g} (the default)" if value is None else f"{option} {value:g}"

    return (
        f"{given('--liveness-timeout', args.liveness_timeout, _LIVENESS_TIMEOUT)} must be at"
        f" least twice {given('--heartbeat', args.heartbeat, _HEARTBEAT)}: a live worker would"
        " be dropped between two heartbeats"
    )


_UNIX_PREFIXES = ("msgpack+unix://", "unix://")


_TCP_PREFIXES = {"msgpack": "msgpack+tcp://", "grpc": "grpc://"}


def _address_problem(address: str, transport: str) -> str | None:
    """What makes ``--address`` something the worker cannot serve and publish, or None.

    Implementation notes:
        The servers check the address too, but as a library must: with a ``ValueError`` that
        cannot name the option, and without refusing a wildcard host, which they accept and
        would publish as an address nobody can dial.
    """
    if transport == "msgpack" and address.startswith(("/", *_UNIX_PREFIXES)):
        path = address
        for prefix in _UNIX_PREFIXES:
            path = path.removeprefix(prefix)
        if not path.startswith("/"):
            return f"--address {address!r}: a Unix socket's path must be absolute"
        return None
    try:
        host, _ = split_host_port(address.removeprefix(_TCP_PREFIXES[transport]), any_port=True)
    except InvalidAddress as error:
        unix = " or an absolute path (a Unix socket)" if transport == "msgpack" else ""
        why = f": {error.reason}" if error.reason else ""
        return f"--address must be HOST:PORT{unix}, got {address!r}{why}"
    try:
        wildcard = ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return None  # a host name: resolved when served
    if wildcard:
        return (
            f"--address {address!r}: {host} listens on every interface but is no address a"
            " subscriber can dial, and the record publishes it; give the host they reach"
            " this worker at (e.g. 127.0.0.1)"
        )
    return None


def _tls_problem(args: argparse.Namespace) -> str | None:
    """What contradicts in the TLS options, or None."""
    if (args.tls_cert is None) != (args.tls_key is None):
        given, missing = (
            ("--tls-cert", "--tls-key") if args.tls_key is None else ("--tls-key", "--tls-cert")
        )
        return f"{given} needs {missing}: a certificate and its private key go together"
    if args.tls_cert is None:
        if args.tls_ca is not None:
            return "--tls-ca needs --tls-cert and --tls-key: the worker's own certificate"
        return None
    if args.insecure:
        return "--insecure serves plaintext: it contradicts --tls-cert"
    if args.address.startswith(("/", *_UNIX_PREFIXES)):
        return f"--address {args.address!r} is a Unix socket, served in plaintext: no --tls-*"
    return None


def _tls_settings(args: argparse.Namespace) -> TlsSettings | None:
    if args.tls_cert is None:
        return None
    from shardline.transport.tls import TlsSettings

    settings = TlsSettings(args.tls_cert, args.tls_key, args.tls_ca)
    settings.server_context()  # bad files are a usage error, said before anything starts
    return settings


def _worker_discovery(args: argparse.Namespace) -> Discovery:
    if args.etcd is None:
        from shardline.discovery.local import LocalDiscovery

        liveness: dict[str, Any] = {}
        if args.heartbeat is not None:
            liveness["heartbeat"] = args.heartbeat
        if args.liveness_timeout is not None:
            liveness["liveness_timeout"] = args.liveness_timeout
        return LocalDiscovery(args.namespace, **liveness)
    from shardline.discovery.etcd import EtcdDiscovery

    credentials = {
        "username": args.etcd_user,
        "password": None if args.etcd_user is None else os.environ[_ETCD_PASSWORD],
        "ca_cert": args.etcd_ca,
        "cert_cert": args.etcd_cert,
        "cert_key": args.etcd_key,
    }
    if args.ttl is None:
        return EtcdDiscovery([args.etcd], args.namespace, **credentials)
    return EtcdDiscovery([args.etcd], args.namespace, ttl=args.ttl, **credentials)


_ETCD_PASSWORD = "SHARDLINE_ETCD_PASSWORD"
"""Where ``--etcd-user``'s password is read from: not an option, which ``ps`` would show."""


def _etcd_credentials(args: argparse.Namespace) -> list[str]:
    """The etcd credential options given."""
    return [
        option
        for option, value in (
            ("--etcd-ca", args.etcd_ca),
            ("--etcd-cert", args.etcd_cert),
            ("--etcd-key", args.etcd_key),
            ("--etcd-user", args.etcd_user),
        )
        if value is not None
    ]
