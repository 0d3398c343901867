"""The ``shardline`` console command.

``shardline demo`` replays topology events against an in-process :class:`shardline.Topology`,
with no server: by default the built-in seed cases, or a scenario file given with ``--scenario``
(format: ``docs/demo.md``).
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
    render_rich,
    seed_cases,
)
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
        help="replay topology events with no server and show the bucket maps and routing",
        description=(
            "Build a topology in-process, replay topology events step by step, route a stream"
            " of keyed requests after each step, and show each tier's bucket map, the requests"
            " per master, and how many requests found no route while a map was cleared."
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
        help="route N keys per tier after each step (default: the scenario's keys.count)",
    )
    demo.set_defaults(run=_demo)
    return parser


def _demo(args: argparse.Namespace) -> int:
    try:
        if args.scenario is None:
            scenario = parse_scenario(seed_cases(), source=SOURCE)
        else:
            scenario = load_scenario(args.scenario)
        if args.keys is not None:
            scenario = scenario.with_key_count(args.keys)
    except ScenarioError as exc:
        print(f"shardline demo: error: {exc}", file=sys.stderr)
        return 2
    out = sys.stdout
    try:
        if args.plain or not out.isatty():
            render_plain(Replay(scenario), out)
        else:
            render_rich(Replay(scenario), Console(file=out))
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
