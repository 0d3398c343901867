"""``shardline inspect``: one poll of a Picodata cluster's catalog, printed."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Mapping
from typing import Any

from shardline._extras import require_extra
from shardline.cli.arguments import (
    CommandParser,
    seconds_argument,
    usage_error,
)
from shardline.cli.inspect_probe import PROBE_TIMEOUT, health_table, probe_once
from shardline.cli.terminal import rich_console
from shardline.demo.tables import plain_table

__all__ = ["add_inspect_command"]

WATCH_INTERVAL = 2.0
"""Seconds between the polls of ``inspect --watch`` unless ``--interval`` says otherwise."""


def add_inspect_command(commands: argparse._SubParsersAction[CommandParser]) -> None:
    inspect = commands.add_parser(
        "inspect",
        help="poll a Picodata cluster once over pgwire and print its topology",
        description=(
            "Connect to DSN (a postgresql:// URI; credentials and TLS options such as"
            " ?sslmode=verify-full go in it), poll the system tables and _pico_bucket(tier)"
            " once, as PollingSource does, and print the tiers, replicasets, instances (names"
            " next to uuids) and bucket ranges, as tables or, with --json, as one JSON"
            " document. Exits with status 1 if any part could not be read (each failure is"
            " printed on stderr) or the catalog is empty. With --probe, also a probe query on"
            " each instance through a Picodata client, and each instance's health as that"
            " client sees it (docs/operations.md, 'Which instances would a client skip?')."
            " Needs the pg extra (asyncpg)."
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
    inspect.add_argument(
        "--watch",
        action="store_true",
        help=(
            "poll again every --interval seconds until Ctrl-C (then exit 0), showing what"
            " changed since the previous poll: members added, removed or changed, each tier's"
            " epoch, bucket ranges that moved. On a terminal a live view highlights the"
            " changes; with --plain each poll is printed in turn; with --json each poll is one"
            " JSON document on a line of its own (JSON Lines) with poll, at, epochs and"
            " changes (null on the first poll)"
        ),
    )
    inspect.add_argument(
        "--interval",
        type=seconds_argument(zero=False),
        default=None,
        metavar="SECONDS",
        help=f"with --watch: seconds between polls (default: {WATCH_INTERVAL:g})",
    )
    inspect.add_argument(
        "--probe",
        action="store_true",
        help=(
            "also run a probe query (SELECT 1) on each instance through a Picodata client and"
            " show each instance's health as that client's registry sees it: healthy or"
            " ejected for reads (or waiting for its probe), failures in a row, times ejected,"
            " for how long more, and why; the client ejects an instance after 5 failures or"
            " deadline misses in a row. Once: each instance is probed until it answers or is"
            " ejected (at most 5 rounds); with --watch: one round per poll, the same client"
            " throughout, so ejections and re-admissions show as they happen. In --json: a"
            " health object (null when the client could not start)"
        ),
    )
    inspect.add_argument(
        "--probe-timeout",
        type=seconds_argument(zero=False),
        default=None,
        metavar="SECONDS",
        help=(
            "with --probe: the deadline of each probe, connecting included"
            f" (default: {PROBE_TIMEOUT:g})"
        ),
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
    if args.interval is not None and not args.watch:
        return usage_error("inspect", "--interval needs --watch")
    if args.probe_timeout is not None and not args.probe:
        return usage_error("inspect", "--probe-timeout needs --probe")
    if args.probe_timeout is None:
        args.probe_timeout = PROBE_TIMEOUT
    require_extra("pg", "this command")
    if not (args.plain or args.json) and sys.stdout.isatty():
        require_extra("cli", "table output on a terminal (--plain and --json do without)")
    if args.watch:
        from shardline.cli.inspect_watch import watch

        if args.interval is None:
            args.interval = WATCH_INTERVAL
        return watch(args, _inspect_document, _inspect_tables)
    from shardline.topology import Topology
    from shardline.topology.sources import SourceState
    from shardline.topology.sources.polling import PollingSource

    async def poll_once() -> tuple[Topology, SourceState, bool, dict[str, Any]]:
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
        document = _inspect_document(topology, state, complete)
        if args.probe:
            document["health"] = await probe_once(
                args.dsn,
                tier=args.tiers[0] if args.tiers else None,
                timeout=args.probe_timeout,
                instances=document["instances"],
            )
        return topology, state, complete, document

    # failures are summed up below; the source's own warnings would repeat them
    logging.getLogger("shardline.topology.sources").addHandler(logging.NullHandler())

    try:
        topology, state, complete, document = asyncio.run(poll_once())
    except ValueError as error:
        print(f"shardline inspect: error: {error}", file=sys.stderr)
        return 2
    for reason, count in sorted(state.failures.items()):
        print(f"shardline inspect: {reason} ({count}x)", file=sys.stderr)
    if state.last_failure is not None:
        print(f"shardline inspect: last failure: {state.last_failure}", file=sys.stderr)
    # a catalog read whole that holds nothing (a wrong database, a cluster not yet set up)
    empty = complete and not (topology.tiers or topology.replicasets or topology.instances)
    if empty:
        print(
            f"shardline inspect: the catalog at {state.server} is empty: no tiers, replicasets"
            " or instances (is this the cluster's database?)",
            file=sys.stderr,
        )
    probed = not args.probe or document["health"] is not None
    status = 0 if complete and not empty and probed else 1
    out = sys.stdout
    if args.json:
        json.dump(document, out, indent=2)
        out.write("\n")
        return status
    if empty or not (complete or topology.tiers or topology.replicasets):
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

        console = rich_console(out)
        console.print(f"[bold]{title}[/bold]")
        for name, header, rows in tables:
            console.print(rich_table(name, header, rows))
    return status


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
    probed = [health_table(document["health"])] if document.get("health") else []
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
        *probed,
    ]
