"""Rendering a replay: plain text for pipes and files, ``rich`` tables for a terminal.

Both renderers consume :meth:`Replay.steps` as it runs, so each step is shown as soon as it has
been applied and routed, and end with the summary of clearings and re-fills.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from shardline import BucketEvent, InstanceEvent, ReplicasetEvent
from shardline.demo.replay import Clearing, Replay, StepReport, TierState
from shardline.demo.scenario import Event, Scenario

__all__ = ["render_plain", "render_rich"]

# A full poll of a large cluster has hundreds of rows; the resulting map is shown anyway.
_SHOWN_ROWS = 4


class _Names:
    """Display names for uuids: the scenario's ``names``, else the uuid's first eight digits."""

    def __init__(self, names: Mapping[str, str]) -> None:
        self._names = names

    def __call__(self, uuid: str | None) -> str:
        if uuid is None:
            return "?"
        return self._names.get(uuid, uuid[:8])

    def event(self, event: Event, arrow: str) -> str:
        if isinstance(event, InstanceEvent):
            text = f"instance {event.op} {self(event.instance_uuid)}"
            if event.replicaset_uuid is not None:
                text += f" of {self(event.replicaset_uuid)}"
            if event.current_state is not None:
                text += f", {event.current_state}"
            if event.address is not None:
                text += f", at {event.address}"
            return text
        if isinstance(event, ReplicasetEvent):
            text = f"replicaset {event.op} {self(event.replicaset_uuid)}"
            if event.tier is not None:
                text += f" in tier {event.tier}"
            if event.current_master_uuid is not None:
                text += f", master {self(event.current_master_uuid)}"
            return text
        if isinstance(event, BucketEvent):
            text = (
                f"bucket {event.op} {event.tier} {event.start}-{event.end}"
                f" {arrow} {self(event.current_replicaset_uuid)}"
            )
            return text if event.state == "active" else f"{text} ({event.state})"
        rows = [
            f"{row['bucket_id_start']}-{row['bucket_id_end']} {arrow} "
            f"{self(row['current_replicaset_uuid'])}"
            for row in event.rows[:_SHOWN_ROWS]
        ]
        if len(event.rows) > _SHOWN_ROWS:
            rows.append(f"... ({len(event.rows)} rows in all)")
        return f"bucket snapshot {event.tier}: {', '.join(rows) or '(no rows)'}"

    def ranges(self, state: TierState, arrow: str) -> list[str]:
        return [f"{start}-{end} {arrow} {self(owner)}" for start, end, owner in state.ranges]

    def masters(self, state: TierState) -> list[tuple[str, int]]:
        labelled = [
            (self(m.instance_uuid) + (f" {m.address}" if m.address else ""), m.requests)
            for m in state.routed
        ]
        return sorted(labelled)


def _header(scenario: Scenario) -> list[str]:
    tiers = ", ".join(f"{tier} ({count} buckets)" for tier, count in scenario.tiers.items())
    return [
        f"shardline demo: {scenario.source}",
        f"tiers: {tiers}; after each step {scenario.keys.count} keys"
        f" {scenario.keys.pattern!r} are routed in every tier",
    ]


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _clearing_lines(clearing: Clearing, total_steps: int) -> list[str]:
    head = f"{clearing.tier}, cleared at step {clearing.step}/{total_steps}: {clearing.description}"
    blind = f"{_plural(clearing.unrouted, 'request')} found no route"
    events = _plural(clearing.bucket_events, "bucket event")
    if clearing.refilled_at is None:
        return [head, f"{blind}; not refilled by the end of the scenario ({events} so far)"]
    return [
        head,
        f"{blind}; refilled at step {clearing.refilled_at} after {events}"
        f" over {_plural(clearing.refilled_at - clearing.step, 'step')}"
        f" ({clearing.apply_ns / 1000:.1f} µs of event-apply time)",
    ]


def render_plain(replay: Replay, out: TextIO) -> None:
    """Writes the replay to ``out`` as plain text, one block per step, then the summary."""
    scenario = replay.scenario
    names = _Names(scenario.names)
    total = len(scenario.steps)
    out.write("\n".join(_header(scenario)) + "\n")
    for report in replay.steps():
        out.write(f"\nStep {report.number}/{total}: {report.step.description}\n")
        for event in report.step.events:
            out.write(f"  - {names.event(event, '->')}\n")
        for state in report.tiers:
            out.write(
                f"  {state.tier}: epoch {state.epoch},"
                f" {state.mapped} of {state.bucket_count} buckets mapped\n"
            )
            out.write(f"    map: {', '.join(names.ranges(state, '->')) or '(empty)'}\n")
            routed = [f"{label} {n}" for label, n in names.masters(state)]
            out.write(f"    requests: {', '.join([*routed, f'no route {state.unrouted}'])}\n")
    out.write("\nMap clearings (requests with no route while a map was cleared; the re-fill):\n")
    for clearing in replay.clearings:
        head, outcome = _clearing_lines(clearing, total)
        out.write(f"  {head}\n    {outcome}\n")
    if not replay.clearings:
        out.write("  none\n")


def _count(n: int) -> Text:
    return Text(str(n), style="bold red" if n else "green")


def _step_table(report: StepReport, names: _Names) -> Table:
    # Cells are Text, never str: a str cell is parsed as rich markup, and names and
    # descriptions come from the user's file.
    table = Table()
    for column in ("tier", "epoch", "mapped", "map", "requests per master", "no route"):
        table.add_column(column, justify="right" if column in {"epoch", "no route"} else "left")
    for state in report.tiers:
        ranges = names.ranges(state, "→")
        masters = [f"{label}  {n}" for label, n in names.masters(state)]
        table.add_row(
            Text(state.tier),
            Text(str(state.epoch)),
            Text(f"{state.mapped}/{state.bucket_count}"),
            Text("\n".join(ranges)) if ranges else Text("(empty)", style="dim"),
            Text("\n".join(masters)) if masters else Text("-", style="dim"),
            _count(state.unrouted),
        )
    return table


def _summary_table(replay: Replay) -> Table:
    table = Table(title="Map clearings and re-fills", title_justify="left")
    table.add_column("tier")
    table.add_column("step", justify="right")
    table.add_column("cleared by")
    table.add_column("no route\nwhile cleared", justify="right")
    table.add_column("refilled\nat step", justify="right")
    table.add_column("bucket\nevents", justify="right")
    table.add_column("event-apply\ntime", justify="right")
    for clearing in replay.clearings:
        refilled = clearing.refilled_at is not None
        table.add_row(
            Text(clearing.tier),
            Text(str(clearing.step)),
            Text(clearing.description),
            _count(clearing.unrouted),
            Text(str(clearing.refilled_at)) if refilled else Text("never", style="bold red"),
            Text(str(clearing.bucket_events)),
            Text(f"{clearing.apply_ns / 1000:.1f} µs" if refilled else "-"),
        )
    return table


def render_rich(replay: Replay, console: Console) -> None:
    """Shows the replay on ``console`` as a table per step, then the summary table."""
    scenario = replay.scenario
    names = _Names(scenario.names)
    total = len(scenario.steps)
    for line in _header(scenario):
        console.print(Text(line))
    for report in replay.steps():
        console.print()
        console.print(Text(f"Step {report.number}/{total}: {report.step.description}", "bold"))
        for event in report.step.events:
            console.print(Text(f"  • {names.event(event, '→')}", "dim"))
        console.print(_step_table(report, names))
    console.print()
    console.print(_summary_table(replay) if replay.clearings else Text("No map was cleared."))
