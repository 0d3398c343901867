"""The ``shardline`` console command.

``shardline demo`` replays topology events against an in-process :class:`shardline.Topology`,
with no server: by default the built-in seed cases, or a scenario file given with ``--scenario``
(format: ``docs/demo.md``). Then it runs a :class:`shardline.WorkerProxy` over in-process
discovery and workers that join, move to a new address and leave while tasks are dispatched.
``--part`` runs only one of the two.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from rich.console import Console

from shardline.demo import (
    Replay,
    ScenarioError,
    load_scenario,
    parse_scenario,
    render_plain,
    render_pool_plain,
    render_pool_rich,
    render_rich,
    run_pool_demo,
    seed_cases,
)
from shardline.demo.pool import BALANCERS
from shardline.demo.seed_cases import SOURCE

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shardline",
        description="Client-side cluster topology and routing for Picodata.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser(
        "demo",
        help="replay topology events and run a worker pool, with no server",
        description=(
            "Build a topology in-process, replay topology events step by step, route a stream"
            " of keyed requests after each step, and show each tier's bucket map, the requests"
            " per master, and how many requests found no route while a map was cleared. Then"
            " run a worker pool over in-process discovery: workers join, move to a new address"
            " and leave while tasks are dispatched; show the tasks per worker and address."
        ),
    )
    demo.add_argument(
        "--part",
        choices=["all", "topology", "pool"],
        default="all",
        help="which part to run (default: all, the topology part first)",
    )
    demo.add_argument(
        "--balancer",
        choices=sorted(BALANCERS),
        default="round-robin",
        help="the pool part's balancer (default: round-robin)",
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
        help="route N keys per tier after each step (default: the scenario's keys.count)",
    )
    demo.set_defaults(run=_demo)
    return parser


def _demo(args: argparse.Namespace) -> int:
    topology, pool = args.part in ("all", "topology"), args.part in ("all", "pool")
    if not topology and (args.scenario is not None or args.keys is not None):
        print(
            "shardline demo: error: --scenario and --keys need the topology part", file=sys.stderr
        )
        return 2
    try:
        if not topology:
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
        console = None if plain else Console(file=out)
        if scenario is not None:
            if console is None:
                render_plain(Replay(scenario), out)
            else:
                render_rich(Replay(scenario), console)
            out.flush()
        if pool:
            run = run_pool_demo(args.balancer)
            if console is None:
                render_pool_plain(run, out)
            else:
                render_pool_rich(run, console)
            out.flush()
    except BrokenPipeError:
        # The reader (e.g. `| head`) has seen enough; point stdout at /dev/null so the
        # interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``shardline`` command with ``argv`` (default: ``sys.argv[1:]``); returns the
    exit status: 0 on success, 2 for a usage error or an invalid scenario file.
    """
    args = _parser().parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
