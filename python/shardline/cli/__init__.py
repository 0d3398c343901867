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
handlers of :mod:`shardline.transport.demo_handlers`, or with ``--handlers MODULE:ATTRIBUTE``
the mapping of handler names to handlers there (``MODULE`` imported with the current directory
first on ``sys.path``, as ``python -m`` has it), over MessagePack-RPC (``--transport
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
handlers that do not load (the line says why: the spec's form, the module not found or raising
as it is imported, the attribute missing, not a mapping, empty, or an entry not a handler), an
address that is not ``HOST:PORT`` (or an absolute socket path), a port out of range, a
wildcard host (``0.0.0.0``, ``::``: it would be published, and nobody can dial it), timeouts that
contradict each other, options of the other backend, or a value the library refuses.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

import shardline
from shardline.cli.arguments import CommandParser
from shardline.cli.demo import add_demo_command
from shardline.cli.inspect import add_inspect_command
from shardline.cli.worker import add_worker_command
from shardline.errors import MissingExtra

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="shardline",
        description="Client-side cluster topology and routing for Picodata.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {shardline.__version__}")
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=CommandParser
    )
    add_demo_command(commands)
    add_worker_command(commands)
    add_inspect_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``shardline`` command with ``argv`` (default: ``sys.argv[1:]``); returns the
    exit status: 0 on success, 2 for a usage error or an invalid scenario file.

    A command whose reader closes its end of stdout (``shardline inspect ... | head``) stops
    there, quietly, with status 0: the reader had what it wanted (a watch stops at its next
    poll). What it was doing is wound up as on any other exit (worker processes stopped,
    connections closed).
    """
    try:
        args = _parser().parse_args(argv)
        run: Callable[[argparse.Namespace], int] = args.run
        try:
            status = run(args)
        except MissingExtra as error:
            print(f"shardline {args.command}: error: {error}", file=sys.stderr)
            return 1
        # what is still buffered fails here, not in the interpreter's flush at exit
        sys.stdout.flush()
    except BrokenPipeError:
        _discard_stdout()
        return 0
    return status


def _discard_stdout() -> None:
    """Points stdout at the null device, so that what is still buffered for the reader that
    left is dropped at exit instead of failing again (and printing a traceback there)."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, sys.stdout.fileno())
    finally:
        os.close(null)
