"""The ``shardline`` console command.

``shardline demo`` replays topology events against an in-process :class:`shardline.Topology`,
with no server: by default the built-in seed cases, or a scenario file given with ``--scenario``
(format: ``docs/demo.md``). Then it runs a :class:`shardline.WorkerProxy` over real worker
processes (``shardline worker``, MessagePack-RPC on loopback) announced through
``LocalDiscovery`` in a private temporary directory, or through etcd with ``--etcd URL``:
workers join, one moves to a new address, one is killed and one leaves while tasks keep flowing.
``--in-process`` runs that part with in-process discovery and workers instead (no sockets, no
processes, no msgpack).
Between the two, the registration part (in-process, on virtual time) swaps a service's replica
for one that never comes up and shows the reachability record heal on the serving replica's
next probe (:mod:`shardline.demo.registration`). ``--part`` runs only one of the three.

``shardline worker --namespace NS --address HOST:PORT`` runs one worker process serving the demo
handlers of :mod:`shardline.transport.demo_handlers` over MessagePack-RPC (``--transport
grpc``: gRPC), announced through
``LocalDiscovery(NS)`` (or ``EtcdDiscovery([URL], NS)`` with ``--etcd URL``). Once it serves and
its record is published it prints that record on stdout as one line of JSON, in the discovery
record schema (:mod:`shardline.discovery.record`), so a parent process can wait for that line.
``--heartbeat`` and ``--liveness-timeout`` (LocalDiscovery) or ``--ttl`` (etcd) set how soon a
worker that dies without withdrawing is dropped; ``--weight`` puts a weight in the record's
``extra`` for the weighted balancer. SIGTERM or SIGINT withdraws the record, lets calls in
flight finish (``--grace`` seconds at most) and exits with status 0. A worker that cannot start
(an address in use or not on this machine, an etcd that does not answer) says why in one line
on stderr and exits with status 1.

Usage errors exit with status 2 and one line on stderr, before anything starts: for the worker,
an address that is not ``HOST:PORT`` (or an absolute socket path), a port out of range, a
wildcard host (``0.0.0.0``, ``::``: it would be published, and nobody can dial it), timeouts that
contradict each other, options of the other backend, or a value the library refuses.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import logging
import math
import os
import signal
import socket
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

import shardline
from shardline._extras import require_extra
from shardline.balancers import create_balancer
from shardline.demo import (
    PoolDemoError,
    PoolView,
    RegistrationDemoError,
    Replay,
    ScenarioError,
    load_scenario,
    parse_scenario,
    run_pool_demo,
    run_process_pool_demo,
    run_registration_demo,
    seed_cases,
)
from shardline.demo.live import (
    DEFAULT_INTERVAL,
    DEFAULT_KEYS,
    DEFAULT_POLLS,
    DEFAULT_QUERIES,
    LiveDemo,
    LiveDemoError,
)
from shardline.demo.seed_cases import SOURCE
from shardline.demo.tables import plain_table
from shardline.discovery.protocol import Discovery
from shardline.errors import InvalidArgument, MissingExtra
from shardline.transport.schemes import DEFAULT_TRANSPORT, TRANSPORTS

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line on stderr and status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")


def _usage_error(command: str, message: str) -> int:
    """Says what is wrong with the command line, in one line on stderr; returns status 2."""
    print(f"shardline {command}: error: {message}", file=sys.stderr)
    return 2


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="shardline",
        description="Client-side cluster topology and routing for Picodata.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {shardline.__version__}")
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Parser
    )
    demo = commands.add_parser(
        "demo",
        help="replay topology events and run a worker pool, with no server",
        description=(
            "Build a topology in-process, replay topology events step by step, route a stream"
            " of keyed requests after each step, and show each tier's bucket map, the requests"
            " per master, and how many requests found no route while a map was cleared. Then"
            " swap a service's replica for one that never comes up, on virtual time, and show"
            " its reachability record turn False at the replacement's claim and heal on the"
            " serving replica's next probe (with the pre-fix behaviour for contrast). Then"
            " run a worker pool over real worker processes announced through LocalDiscovery"
            " (or etcd with --etcd): workers join, one moves to a new address, one is killed"
            " and one leaves while tasks keep flowing; show the pool, the tasks per worker,"
            " address and process, the failures retried elsewhere, and whether any task"
            " reached a superseded address."
        ),
    )
    demo.add_argument(
        "--part",
        choices=["all", "topology", "registration", "pool"],
        default="all",
        help="which part to run (default: all: topology, registration, then pool)",
    )
    demo.add_argument(
        "--balancer",
        type=_balancer_name,
        default="round-robin",
        metavar="NAME",
        help=(
            "the pool part's balancer, by its name in the shardline.balancers entry-point group"
            " (default: round-robin; an unknown name lists the known ones)"
        ),
    )
    backend = demo.add_mutually_exclusive_group()
    backend.add_argument(
        "--etcd",
        metavar="URL",
        help=(
            "run the pool part's workers over the etcd at URL (e.g. http://127.0.0.1:2379)"
            " instead of LocalDiscovery"
        ),
    )
    backend.add_argument(
        "--in-process",
        action="store_true",
        help=(
            "run the pool part in-process: simulated discovery and workers, no sockets or"
            " processes (and no msgpack needed)"
        ),
    )
    demo.add_argument(
        "--scenario",
        metavar="FILE",
        help="a JSON scenario file to replay instead of the built-in seed cases (docs/demo.md)",
    )
    demo.add_argument(
        "--plain",
        action="store_true",
        help="plain text even on a terminal (the default when stdout is not one)",
    )
    demo.add_argument(
        "--keys",
        type=int,
        metavar="N",
        help=(
            "route N keys per tier after each step (default: the scenario's keys.count), or"
            f" after each poll with --pg (default: {DEFAULT_KEYS})"
        ),
    )
    demo.add_argument(
        "--pg",
        metavar="DSN",
        help=(
            "the topology part follows the live cluster at DSN (a postgresql:// URI) with a"
            " shardline.picodata client and shows its tiers, bucket maps, routing and where"
            " routed queries ran, instead of replaying events; needs the pg extra (asyncpg)"
        ),
    )
    demo.add_argument(
        "--polls",
        type=int,
        metavar="N",
        help=f"with --pg: how many polls (default: {DEFAULT_POLLS})",
    )
    demo.add_argument(
        "--interval",
        type=float,
        metavar="SECONDS",
        help=f"with --pg: the time between polls (default: {DEFAULT_INTERVAL:g})",
    )
    demo.add_argument(
        "--queries",
        type=int,
        metavar="N",
        help=(
            "with --pg: after each poll, run a routed query (SELECT 1, key=) for each of the"
            f" first N keys in every tier and show where they ran; 0: none (default:"
            f" {DEFAULT_QUERIES})"
        ),
    )
    demo.set_defaults(run=_demo)
    _add_worker_command(commands)
    _add_inspect_command(commands)
    return parser


def _add_worker_command(commands: argparse._SubParsersAction[_Parser]) -> None:
    worker = commands.add_parser(
        "worker",
        help="run one worker process serving the demo handlers (MessagePack-RPC or gRPC)",
        description=(
            "Serve the demo handlers (echo, sleep, whoami, fail-transiently, fail) over"
            " MessagePack-RPC (or gRPC with --transport grpc) and announce the worker through"
            " LocalDiscovery, or etcd with --etcd. When ready, print"
            " the worker's discovery record as one line of JSON on stdout. SIGTERM or SIGINT"
            " withdraws the record, lets calls in flight finish and exits."
        ),
    )
    worker.add_argument("--namespace", required=True, help="the discovery namespace to join")
    worker.add_argument(
        "--address",
        required=True,
        metavar="HOST:PORT",
        help=(
            "where to serve, as subscribers will dial it (so not 0.0.0.0 or ::); port 0 picks"
            " a free port. With the msgpack transport, an absolute path serves on a Unix socket"
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
        "--etcd",
        metavar="URL",
        help="announce through the etcd at URL (e.g. http://127.0.0.1:2379), not LocalDiscovery",
    )
    worker.add_argument(
        "--uid", type=uuid.UUID, help="the worker's uid (default: a new random one)"
    )
    worker.add_argument(
        "--grace",
        type=_seconds(zero=True),
        default=5.0,
        metavar="SECONDS",
        help="how long calls in flight may take to finish on shutdown (default: 5)",
    )
    worker.add_argument(
        "--weight",
        type=_weight,
        metavar="W",
        help="a weight for WeightedRoundRobinLoadBalancer, as the record's extra 'weight'",
    )
    worker.add_argument(
        "--heartbeat",
        type=_seconds(zero=False),
        metavar="SECONDS",
        help="LocalDiscovery only: how often the worker's liveness is renewed (default: 1)",
    )
    worker.add_argument(
        "--liveness-timeout",
        type=_seconds(zero=False),
        metavar="SECONDS",
        help=(
            "LocalDiscovery only: how long after its last heartbeat a worker that died is"
            " dropped (default: 5; at least twice the heartbeat)"
        ),
    )
    worker.add_argument(
        "--ttl",
        type=_whole_seconds,
        metavar="SECONDS",
        help=(
            "etcd only: the TTL of the lease the record is attached to, i.e. how long a worker"
            " that died stays registered (default: 10; etcd may grant more)"
        ),
    )
    worker.set_defaults(run=_worker)


def _seconds(*, zero: bool) -> Callable[[str], float]:
    """An argument type: a finite number of seconds, positive (or also 0 with ``zero``)."""
    least = "0 or more" if zero else "above 0"

    def seconds(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
            raise argparse.ArgumentTypeError(
                f"must be a finite number of seconds, {least}, got {text!r}"
            )
        return value

    return seconds


def _whole_seconds(text: str) -> int:
    """An argument type: a whole number of seconds, at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of seconds: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 second, got {text!r}")
    return value


def _weight(text: str) -> int | float:
    """A positive, finite weight; an integer stays an int in the record."""
    try:
        weight: int | float = int(text)
    except ValueError:
        try:
            weight = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(weight) or weight <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive, finite number, got {text!r}")
    return weight


def _balancer_name(text: str) -> str:
    """A name that resolves to a balancer (one is made and dropped, to check it at parse time)."""
    try:
        create_balancer(text)
    except InvalidArgument as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


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
        return _usage_error("worker", f"{local_only[0]} applies to LocalDiscovery, not --etcd")
    if args.etcd is None and args.ttl is not None:
        return _usage_error("worker", "--ttl applies to --etcd only")
    if args.etcd is None and (contradiction := _liveness_contradiction(args)):
        return _usage_error("worker", contradiction)
    if problem := _address_problem(args.address, args.transport):
        return _usage_error("worker", problem)
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
        discovery = _worker_discovery(args)
    except ValueError as error:
        return _usage_error("worker", str(error))
    except OSError as error:
        print(f"shardline worker: error: {error}", file=sys.stderr)
        return 1
    try:
        try:
            server = await serve(
                DEMO_HANDLERS,
                args.address,
                discovery,
                transport=args.transport,
                uid=args.uid,
                version=shardline.__version__,
                extra=None if args.weight is None else {"weight": args.weight},
            )
        except ValueError as error:
            return _usage_error("worker", str(error))
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
    host, _, port = args.address.removeprefix(_TCP_PREFIXES[args.transport]).rpartition(":")
    if port.isdecimal():
        try:
            family, kind, protocol, _, where = socket.getaddrinfo(
                host.strip("[]"), int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )[0]
            with socket.socket(family, kind, protocol) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(where)
        except OSError as reason:
            if reason.strerror:
                return f"cannot serve at {args.address}: {reason.strerror.lower()}"
    return text


# LocalDiscovery's defaults, as the worker command's help states them
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
    host, colon, port = address.removeprefix(_TCP_PREFIXES[transport]).rpartition(":")
    if not colon or not host or "/" in host:
        unix = " or an absolute path (a Unix socket)" if transport == "msgpack" else ""
        return f"--address must be HOST:PORT{unix}, got {address!r}"
    if not (port.isascii() and port.isdigit()):
        return f"--address {address!r}: the port {port!r} is not a number"
    if int(port) > 65535:
        return f"--address {address!r}: port {int(port)} is out of range (0 to 65535)"
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        wildcard = ipaddress.ip_address(bare).is_unspecified
    except ValueError:
        return None  # a host name: resolved when served
    if wildcard:
        return (
            f"--address {address!r}: {bare} listens on every interface but is no address a"
            " subscriber can dial, and the record publishes it; give the host they reach"
            " this worker at (e.g. 127.0.0.1)"
        )
    return None


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

    if args.ttl is None:
        return EtcdDiscovery([args.etcd], args.namespace)
    return EtcdDiscovery([args.etcd], args.namespace, ttl=args.ttl)


def _demo(args: argparse.Namespace) -> int:
    topology, pool = args.part in ("all", "topology"), args.part in ("all", "pool")
    registration = args.part in ("all", "registration")
    if not topology and (args.scenario is not None or args.keys is not None):
        print(
            "shardline demo: error: --scenario and --keys need the topology part", file=sys.stderr
        )
        return 2
    if args.pg is None and (args.polls is not None or args.interval is not None):
        print("shardline demo: error: --polls and --interval need --pg", file=sys.stderr)
        return 2
    if args.pg is None and args.queries is not None:
        print("shardline demo: error: --queries needs --pg", file=sys.stderr)
        return 2
    if not topology and args.pg is not None:
        print("shardline demo: error: --pg needs the topology part", file=sys.stderr)
        return 2
    if args.pg is not None and args.scenario is not None:
        print(
            "shardline demo: error: --pg and --scenario are two sources of the topology part:"
            " give one",
            file=sys.stderr,
        )
        return 2
    live = None
    if args.pg is not None:
        try:
            live = LiveDemo(
                args.pg,
                polls=DEFAULT_POLLS if args.polls is None else args.polls,
                interval=DEFAULT_INTERVAL if args.interval is None else args.interval,
                keys=DEFAULT_KEYS if args.keys is None else args.keys,
                queries=DEFAULT_QUERIES if args.queries is None else args.queries,
            )
        except LiveDemoError as error:
            print(f"shardline demo: error: {error}", file=sys.stderr)
            return 2
    if not pool and (args.etcd is not None or args.in_process):
        print("shardline demo: error: --etcd and --in-process need the pool part", file=sys.stderr)
        return 2
    # the views draw with rich even for plain text
    require_extra("cli", "this command")
    from shardline.demo.live_view import render_live_plain, render_live_rich
    from shardline.demo.pool_view import PlainPoolView, RichPoolView
    from shardline.demo.registration_view import (
        render_registration_plain,
        render_registration_rich,
    )
    from shardline.demo.view import render_plain, render_rich

    if pool and not args.in_process:
        # checked before any part runs: the worker processes would fail only once started
        try:
            require_extra("msgpack", "the worker-pool part (real worker processes)")
            if args.etcd is not None:
                require_extra("etcd", "the worker-pool part over etcd")
        except MissingExtra as error:
            print(f"shardline demo: error: {error}, or run it with --in-process", file=sys.stderr)
            return 1
    if pool and args.etcd is not None:
        # checked before any part runs, as the worker processes would refuse it at the end
        from shardline.discovery.etcd_connection import parse_endpoints

        try:
            parse_endpoints([args.etcd], tls_configured=False)
        except ValueError as error:
            return _usage_error("demo", f"--etcd: {error}")
    try:
        if not topology or live is not None:
            scenario = None
        elif args.scenario is None:
            scenario = parse_scenario(seed_cases(), source=SOURCE)
        else:
            scenario = load_scenario(args.scenario)
        if scenario is not None and args.keys is not None:
            scenario = scenario.with_key_count(args.keys)
    except ScenarioError as exc:
        print(f"shardline demo: error: {exc}", file=sys.stderr)
        return 2
    out = sys.stdout
    try:
        plain = args.plain or not out.isatty()
        console = None if plain else _console(out)
        if scenario is not None:
            if console is None:
                render_plain(Replay(scenario), out)
            else:
                render_rich(Replay(scenario), console)
            out.flush()
        if live is not None:
            if console is None:
                render_live_plain(live, out)
            else:
                render_live_rich(live, console)
            out.flush()
        if registration:
            if console is None:
                render_registration_plain(run_registration_demo(), out)
            else:
                render_registration_rich(run_registration_demo(), console)
            out.flush()
        if pool:
            view: PoolView = PlainPoolView(out) if console is None else RichPoolView(console)
            if args.in_process:
                run_pool_demo(args.balancer, view=view)
            else:
                run_process_pool_demo(args.balancer, etcd=args.etcd, view=view)
            out.flush()
    except (PoolDemoError, RegistrationDemoError) as error:
        print(f"shardline demo: error: {error}", file=sys.stderr)
        return 1
    except LiveDemoError as error:
        print(f"shardline demo: error: {error}", file=sys.stderr)
        return 2 if error.usage else 1
    except KeyboardInterrupt:
        # every worker process is stopped and the temporary directory removed by now
        print("shardline demo: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader (e.g. `| head`) has seen enough; point stdout at /dev/null so the
        # interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
    return 0


def _console(out: TextIO) -> Console:
    """A rich console writing to ``out`` (the caller has checked that rich is installed)."""
    from rich.console import Console

    return Console(file=out)


def _add_inspect_command(commands: argparse._SubParsersAction[_Parser]) -> None:
    inspect = commands.add_parser(
        "inspect",
        help="poll a Picodata cluster once over pgwire and print its topology",
        description=(
            "Connect to DSN (a postgresql:// URI; credentials and TLS options such as"
            " ?sslmode=verify-full go in it), poll the system tables and _pico_bucket(tier)"
            " once, as PollingSource does, and print the tiers, replicasets, instances (names"
            " next to uuids) and bucket ranges, as tables or, with --json, as one JSON"
            " document. Exits with status 1 if any part could not be read (each failure is"
            " printed on stderr). Needs the pg extra (asyncpg)."
        ),
    )
    inspect.add_argument("dsn", metavar="DSN", help="where to connect, e.g. postgresql://…")
    inspect.add_argument(
        "--tier",
        action="append",
        dest="tiers",
        metavar="TIER",
        help="show only this tier (repeatable; default: every tier)",
    )
    inspect.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how long the poll may take, connecting included (default: 10)",
    )
    output = inspect.add_mutually_exclusive_group()
    output.add_argument(
        "--plain",
        action="store_true",
        help="plain text even on a terminal (the default when stdout is not one)",
    )
    output.add_argument(
        "--json",
        action="store_true",
        help=(
            "print one JSON document on stdout: server, complete, failures, tiers,"
            " replicasets, instances and bucket_ranges (even when the poll failed)"
        ),
    )
    inspect.set_defaults(run=_inspect)


def _inspect(args: argparse.Namespace) -> int:
    require_extra("pg", "this command")
    if not (args.plain or args.json) and sys.stdout.isatty():
        require_extra("cli", "table output on a terminal (--plain and --json do without)")
    from shardline.topology import Topology
    from shardline.topology.sources import SourceState
    from shardline.topology.sources.polling import PollingSource

    async def poll_once() -> tuple[Topology, SourceState, bool]:
        topology = Topology()
        source = PollingSource(
            args.dsn, interval=3600.0, tiers=args.tiers, timeout=args.timeout, retry=3600.0
        )
        task = asyncio.create_task(source.run(topology))
        try:
            complete = await source.refresh()
            state = source.state
        finally:
            await source.aclose()
            await task
        return topology, state, complete

    # failures are summed up below; the source's own warnings would repeat them
    logging.getLogger("shardline.topology.sources").addHandler(logging.NullHandler())

    try:
        topology, state, complete = asyncio.run(poll_once())
    except ValueError as error:
        print(f"shardline inspect: error: {error}", file=sys.stderr)
        return 2
    for reason, count in sorted(state.failures.items()):
        print(f"shardline inspect: {reason} ({count}x)", file=sys.stderr)
    if state.last_failure is not None:
        print(f"shardline inspect: last failure: {state.last_failure}", file=sys.stderr)
    out = sys.stdout
    document = _inspect_document(topology, state, complete)
    if args.json:
        json.dump(document, out, indent=2)
        out.write("\n")
        return 0 if complete else 1
    if not complete and not (topology.tiers or topology.replicasets):
        return 1
    tables = _inspect_tables(document)
    title = (
        f"{state.server or '(not connected)'}: one poll,"
        f" {'complete' if complete else 'INCOMPLETE (see the failures above)'}"
    )
    if args.plain or not out.isatty():
        print(title, file=out)
        for name, header, rows in tables:
            print(f"\n{name}", file=out)
            plain_table(header, rows, out)
    else:
        from shardline.demo.tables import rich_table

        console = _console(out)
        console.print(f"[bold]{title}[/bold]")
        for name, header, rows in tables:
            console.print(rich_table(name, header, rows))
    return 0 if complete else 1


def _inspect_document(topology: Any, state: Any, complete: bool) -> dict[str, Any]:
    """One poll's topology as JSON-ready data (``shardline inspect --json`` prints it; the
    tables are drawn from it). Lists are sorted: tiers by name, replicasets by tier and uuid,
    instances by replicaset and uuid, ranges by tier and start. A name the catalog did not
    give is ``null``."""
    replicasets = topology.replicasets
    instances = topology.instances

    def name_of(member: Any) -> str | None:
        return getattr(member, "name", None) if member is not None else None

    def address_of(instance_uuid: str | None) -> str | None:
        instance = instances.get(instance_uuid) if instance_uuid is not None else None
        return instance.address if instance is not None else None

    maps = topology.bucket_maps
    tiers = []
    for tier, count in sorted(topology.tiers.items()):
        ranges = maps.get(tier, [])
        tiers.append(
            {
                "name": tier,
                "bucket_count": count,
                "ranges": len(ranges),
                "mapped": sum(end - start + 1 for start, end, _ in ranges),
                "replicasets": sum(1 for rs in replicasets.values() if rs.tier == tier),
            }
        )
    rs_rows = []
    for rs in sorted(replicasets.values(), key=lambda r: (r.tier, r.uuid)):
        members = [i for i in instances.values() if i.replicaset_uuid == rs.uuid]
        master = rs.current_master_uuid
        rs_rows.append(
            {
                "uuid": rs.uuid,
                "name": name_of(rs),
                "tier": rs.tier,
                "master_uuid": master,
                "master_name": name_of(instances.get(master) if master else None),
                "master_address": address_of(master),
                "online": sum(1 for i in members if i.is_online),
                "instances": len(members),
            }
        )
    instance_rows = []
    for i in sorted(instances.values(), key=lambda i: (i.replicaset_uuid or "", i.uuid)):
        owner = replicasets.get(i.replicaset_uuid) if i.replicaset_uuid else None
        instance_rows.append(
            {
                "uuid": i.uuid,
                "name": name_of(i),
                "replicaset_uuid": i.replicaset_uuid,
                "replicaset_name": name_of(owner),
                "state": i.current_state,
                "address": i.address,
                "master": owner is not None and owner.current_master_uuid == i.uuid,
            }
        )
    range_rows = []
    for tier in sorted(maps):
        for start, end, owner_uuid in maps[tier]:
            owner = replicasets.get(owner_uuid)
            range_rows.append(
                {
                    "tier": tier,
                    "start": start,
                    "end": end,
                    "replicaset_uuid": owner_uuid,
                    "replicaset_name": name_of(owner),
                    "master_address": address_of(
                        owner.current_master_uuid if owner is not None else None
                    ),
                }
            )
    return {
        "server": state.server,
        "complete": complete,
        "failures": dict(sorted(state.failures.items())),
        "last_failure": state.last_failure,
        "tiers": tiers,
        "replicasets": rs_rows,
        "instances": instance_rows,
        "bucket_ranges": range_rows,
    }


def _inspect_tables(document: Mapping[str, Any]) -> list[tuple[str, list[str], list[list[Any]]]]:
    """The document's parts as (title, header, rows) tables; a missing value is ``-``."""

    def cell(value: Any) -> Any:
        return "-" if value is None else value

    tiers = [
        [
            t["name"],
            t["bucket_count"],
            t["ranges"],
            f"{t['mapped']}/{t['bucket_count']}",
            t["replicasets"],
        ]
        for t in document["tiers"]
    ]
    replicasets = [
        [
            cell(r["name"]),
            r["uuid"],
            r["tier"],
            cell(r["master_name"]),
            cell(r["master_uuid"]),
            cell(r["master_address"]),
            f"{r['online']}/{r['instances']}",
        ]
        for r in document["replicasets"]
    ]
    instances = [
        [
            cell(i["name"]),
            i["uuid"],
            cell(i["replicaset_name"]),
            cell(i["replicaset_uuid"]),
            cell(i["state"]),
            cell(i["address"]),
            "master" if i["master"] else "",
        ]
        for i in document["instances"]
    ]
    ranges = [
        [
            r["tier"],
            f"{r['start']}-{r['end']}",
            cell(r["replicaset_name"]),
            r["replicaset_uuid"],
            cell(r["master_address"]),
        ]
        for r in document["bucket_ranges"]
    ]
    return [
        ("tiers", ["tier", "buckets", "ranges", "mapped", "replicasets"], tiers),
        (
            "replicasets",
            ["replicaset", "uuid", "tier", "master", "master uuid", "master address", "online"],
            replicasets,
        ),
        (
            "instances",
            ["instance", "uuid", "replicaset", "replicaset uuid", "state", "address", "role"],
            instances,
        ),
        (
            "bucket ranges",
            ["tier", "buckets", "replicaset", "replicaset uuid", "master address"],
            ranges,
        ),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``shardline`` command with ``argv`` (default: ``sys.argv[1:]``); returns the
    exit status: 0 on success, 2 for a usage error or an invalid scenario file.
    """
    args = _parser().parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        return run(args)
    except MissingExtra as error:
        print(f"shardline {args.command}: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
