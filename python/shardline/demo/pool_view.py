"""Rendering the worker-pool part of the demo: plain text for pipes and files, ``rich`` tables for
a terminal, in the same style as the topology part (:mod:`shardline.demo.view`).
"""

from __future__ import annotations

from typing import TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from shardline.demo.pool import PhaseReport, PoolRun

__all__ = ["render_pool_plain", "render_pool_rich"]


def _header(run: PoolRun) -> list[str]:
    return [
        "Worker pool: a WorkerProxy over in-process discovery and in-process workers"
        " (addresses are labels; no socket is opened)",
        f"balancer: {run.balancer}; the tasks of each phase are dispatched after the proxy"
        " has applied its discovery events",
    ]


def _phase_title(phase: PhaseReport, total: int) -> str:
    return f"Pool phase {phase.number}/{total}: {phase.description}"


def _summary(run: PoolRun) -> list[str]:
    lines = [f"total tasks: {run.total}", "tasks per address:"]
    lines += [
        f"  {name} {address}: {count}" for (name, address), count in sorted(run.per_address.items())
    ]
    lines.append(f"tasks sent to a superseded address: {run.superseded}")
    return lines


def render_pool_plain(run: PoolRun, out: TextIO) -> None:
    """Writes the pool scenario to ``out`` as plain text, one block per phase, then the summary."""
    total = len(run.phases)
    out.write("\n" + "\n".join(_header(run)) + "\n")
    for phase in run.phases:
        out.write(f"\n{_phase_title(phase, total)}\n")
        for event in phase.events:
            out.write(f"  - {event}\n")
        out.write(f"  balancer: {phase.balancer}; {phase.tasks} tasks dispatched\n")
        for row in phase.rows:
            out.write(
                f"    {row.name} {row.short_uid} {row.address} {row.status}:"
                f" {row.tasks} tasks ({row.tasks_so_far} at this address so far)\n"
            )
    out.write("\nPool summary:\n")
    out.write("".join(f"  {line}\n" for line in _summary(run)))


def _count(n: int, *, bad: bool = False) -> Text:
    return Text(str(n), style="bold red" if bad and n else "")


def _phase_table(phase: PhaseReport) -> Table:
    table = Table(caption=f"balancer: {phase.balancer}", caption_justify="left")
    for column in ("worker", "uid", "address", "status", "tasks", "tasks at\naddress so far"):
        table.add_column(column, justify="right" if column.startswith("tasks") else "left")
    styles = {"pooled": "green", "superseded": "yellow", "left": "dim"}
    for row in phase.rows:
        table.add_row(
            Text(row.name),
            Text(row.short_uid),
            Text(row.address),
            Text(row.status, style=styles[row.status]),
            _count(row.tasks, bad=row.status != "pooled"),
            Text(str(row.tasks_so_far)),
        )
    return table


def _summary_table(run: PoolRun) -> Table:
    table = Table(title="Pool summary: tasks per address", title_justify="left")
    table.add_column("worker")
    table.add_column("address")
    table.add_column("tasks", justify="right")
    for (name, address), count in sorted(run.per_address.items()):
        table.add_row(Text(name), Text(address), Text(str(count)))
    return table


def render_pool_rich(run: PoolRun, console: Console) -> None:
    """Shows the pool scenario on ``console`` as a table per phase, then the summary."""
    total = len(run.phases)
    console.print()
    for line in _header(run):
        console.print(Text(line))
    for phase in run.phases:
        console.print()
        console.print(Text(_phase_title(phase, total), "bold"))
        for event in phase.events:
            console.print(Text(f"  • {event}", "dim"))
        console.print(_phase_table(phase))
    console.print()
    console.print(_summary_table(run))
    console.print(Text(f"total tasks: {run.total}"))
    style = "bold red" if run.superseded else "green"
    console.print(Text(f"tasks sent to a superseded address: {run.superseded}", style))
