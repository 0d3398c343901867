"""``shardline demo``: the topology, registration and pool parts, with no server."""

from __future__ import annotations

import argparse
import sys

from shardline._extras import require_extra
from shardline.cli.arguments import (
    CommandParser,
    balancer_name_argument,
    usage_error,
)
from shardline.cli.terminal import rich_console
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
from shardline.errors import MissingExtra

__all__ = ["add_demo_command"]


def add_demo_command(commands: argparse._SubParsersAction[CommandParser]) -> None:
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
        type=balancer_name_argument,
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
            return usage_error("demo", f"--etcd: {error}")
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
        console = None if plain else rich_console(out)
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
    return 0
