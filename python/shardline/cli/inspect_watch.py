"""``shardline inspect --watch``: poll the catalog again and again, and show what changed."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TextIO

from shardline.cli.inspect_changes import Changes, changes_between
from shardline.cli.inspect_probe import Prober, start_failed
from shardline.cli.terminal import rich_console
from shardline.demo.tables import plain_table
from shardline.errors import ShardlineError

if TYPE_CHECKING:
    import argparse

    from rich.console import RenderableType

__all__ = ["watch"]

Tables = list[tuple[str, list[str], list[list[Any]]]]


def _timestamp(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


class _JsonLines:
    """One JSON document per poll, on a line of its own, flushed at once."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def show(self, document: Mapping[str, Any], changes: Changes | None, tables: Tables) -> None:
        line = dict(document)
        line["changes"] = changes.to_json() if changes is not None else None
        self.out.write(json.dumps(line) + "\n")
        self.out.flush()


def _title(document: Mapping[str, Any]) -> str:
    server = document["server"] or "(not connected)"
    state = "complete" if document["complete"] else "INCOMPLETE (see stderr)"
    return f"poll {document['poll']} at {document['at']}: {server}, {state}"


def _epochs(document: Mapping[str, Any]) -> str:
    return ", ".join(f"{tier} {epoch}" for tier, epoch in document["epochs"].items()) or "-"


class _Plain:
    """Each poll as plain text: a title, the changes since the previous poll, the tables."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def show(self, document: Mapping[str, Any], changes: Changes | None, tables: Tables) -> None:
        out = self.out
        if document["poll"] > 1:
            print(file=out)
        print(_title(document), file=out)
        print(f"epochs: {_epochs(document)}", file=out)
        if changes is None:
            print("changes: (first poll)", file=out)
        elif not changes:
            print("changes: none", file=out)
        else:
            print("changes:", file=out)
            for line in changes.lines():
                print(f"  {line}", file=out)
        for name, header, rows in tables:
            print(f"\n{name}", file=out)
            plain_table(header, rows, out)
        out.flush()


class _Live:
    """A rich Live view redrawn after each poll; rows added or changed since the previous poll
    are highlighted, and the changes (removals included) are listed above the tables."""

    ADDED = "bold green"
    CHANGED = "bold yellow"

    def __init__(self, out: TextIO) -> None:
        from rich.live import Live

        self.live = Live(console=rich_console(out), auto_refresh=False, transient=False)

    def __enter__(self) -> _Live:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(None, None, None)

    def show(self, document: Mapping[str, Any], changes: Changes | None, tables: Tables) -> None:
        self.live.update(self.render(document, changes, tables), refresh=True)

    def render(
        self, document: Mapping[str, Any], changes: Changes | None, tables: Tables
    ) -> RenderableType:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        parts: list[RenderableType] = [
            Text(_title(document), style="bold"),
            Text(f"epochs: {_epochs(document)}"),
        ]
        if changes is None:
            parts.append(Text("changes: (first poll)", style="dim"))
        elif not changes:
            parts.append(Text("changes since the previous poll: none", style="dim"))
        else:
            parts.append(Text("changes since the previous poll:", style="bold"))
            for line in changes.lines():
                style = (
                    "red"
                    if line.endswith(" removed")
                    else self.ADDED
                    if line.endswith(" added")
                    else self.CHANGED
                )
                parts.append(Text(f"  {line}", style=style))
        styles = self.row_styles(document, changes)
        for (name, header, rows), row_styles in zip(tables, styles, strict=True):
            table = Table(title=name, title_justify="left")
            for column in header:
                table.add_column(column)
            for row, row_style in zip(rows, row_styles, strict=True):
                table.add_row(*(str(cell) for cell in row), style=row_style)
            parts.append(table)
        return Group(*parts)

    def row_styles(
        self, document: Mapping[str, Any], changes: Changes | None
    ) -> list[list[str | None]]:
        """The style of each row of each table: added, changed, or none."""

        def styled(rows: list[Mapping[str, Any]], key: str, part: Any) -> list[str | None]:
            changed = {c.key for c in part.changed}
            added = set(part.added)
            return [
                self.ADDED if row[key] in added else self.CHANGED if row[key] in changed else None
                for row in rows
            ]

        health = document.get("health")
        if changes is None:
            plain: list[list[str | None]] = [
                [None] * len(document[part])
                for part in ("tiers", "replicasets", "instances", "bucket_ranges")
            ]
            return plain + ([[None] * len(health["instances"])] if health else [])
        tiers = styled(document["tiers"], "name", changes.tiers)
        tiers = [
            style or (self.CHANGED if row["name"] in changes.epochs else None)
            for row, style in zip(document["tiers"], tiers, strict=True)
        ]
        ranges: list[str | None] = [
            self.CHANGED
            if any(
                m.tier == row["tier"] and m.start <= row["end"] and row["start"] <= m.end
                for m in changes.moved
            )
            else None
            for row in document["bucket_ranges"]
        ]
        return [
            tiers,
            styled(document["replicasets"], "uuid", changes.replicasets),
            styled(document["instances"], "uuid", changes.instances),
            ranges,
        ] + ([styled(health["instances"], "uuid", changes.health)] if health else [])


def watch(
    args: argparse.Namespace,
    document_of: Callable[[Any, Any, bool], dict[str, Any]],
    tables_of: Callable[[Mapping[str, Any]], Tables],
) -> int:
    """Runs ``inspect --watch``: one poll every ``args.interval`` seconds until interrupted
    (Ctrl-C: status 0), each shown with what changed since the previous one. A poll that
    fails, wholly or in part, is reported on stderr and the watch goes on.

    Implementation notes:
        One ``PollingSource`` feeds one ``Topology`` for the whole watch, so a tier's epoch
        moves exactly when its map changes; each poll is ``refresh()`` (the source's own
        schedule is set far out of the way) followed by a sleep of the interval. With
        ``--probe``, one ``Prober`` (one Picodata client) serves the whole watch, one round of
        probes after each poll, so its health registry sees them in a row.
    """
    from shardline.topology import Topology
    from shardline.topology.sources.polling import PollingSource

    out = sys.stdout
    view: _JsonLines | _Plain | _Live
    if args.json:
        view = _JsonLines(out)
    elif args.plain or not out.isatty():
        view = _Plain(out)
    else:
        view = _Live(out)
    # failures are reported per poll below; the source's own warnings would repeat them
    logging.getLogger("shardline.topology.sources").addHandler(logging.NullHandler())

    async def follow() -> None:
        topology = Topology()
        source = PollingSource(
            args.dsn, interval=3600.0, tiers=args.tiers, timeout=args.timeout, retry=3600.0
        )
        task = asyncio.create_task(source.run(topology))
        previous: dict[str, Any] | None = None
        failures: dict[str, int] = {}
        prober = (
            Prober(args.dsn, tier=args.tiers[0] if args.tiers else None, timeout=args.probe_timeout)
            if args.probe
            else None
        )
        started = False
        try:
            poll = 0
            while True:
                poll += 1
                complete = await source.refresh()
                state = source.state
                document = document_of(topology, state, complete)
                document["poll"] = poll
                document["at"] = _timestamp(time.time())
                document["epochs"] = {tier: topology.epoch(tier) for tier in sorted(topology.tiers)}
                for reason, count in sorted(state.failures.items()):
                    if count > failures.get(reason, 0):
                        print(f"shardline inspect: poll {poll}: {reason}", file=sys.stderr)
                if not complete and state.last_failure is not None:
                    print(
                        f"shardline inspect: poll {poll}: last failure: {state.last_failure}",
                        file=sys.stderr,
                    )
                failures = dict(state.failures)
                if prober is not None:
                    if not started:
                        try:
                            await prober.open()
                            started = True
                        except ShardlineError as error:
                            start_failed(error)
                    document["health"] = None
                    if started:
                        uuids = [row["uuid"] for row in document["instances"]]
                        outcomes = await prober.probe(uuids)
                        document["health"] = prober.document(document["instances"], outcomes)
                changes = changes_between(previous, document) if previous is not None else None
                view.show(document, changes, tables_of(document))
                previous = document
                await asyncio.sleep(args.interval)
        finally:
            if prober is not None:
                await prober.close()
            await source.aclose()
            await task

    try:
        if isinstance(view, _Live):
            with view:
                asyncio.run(follow())
        else:
            asyncio.run(follow())
    except KeyboardInterrupt:
        return 0
    except ValueError as error:
        print(f"shardline inspect: error: {error}", file=sys.stderr)
        return 2
    return 0
