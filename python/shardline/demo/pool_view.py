"""Rendering the worker-pool part of the demo: plain text for pipes and files, ``rich`` tables for
a terminal, in the same style as the topology part (:mod:`shardline.demo.view`).

Both are :class:`~shardline.demo.pool.PoolView`\\ s: a driver shows each phase as soon as it
ends. ``render_pool_plain`` and ``render_pool_rich`` show a finished run at once.
"""

from __future__ import annotations

from typing import TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from shardline.demo.pool import AddressRow, PhaseReport, PoolRun, PoolView

__all__ = ["PlainPoolView", "RichPoolView", "render_pool_plain", "render_pool_rich"]


def _phase_title(run: PoolRun, phase: PhaseReport) -> str:
    return f"Pool phase {phase.number}/{run.phase_count or len(run.phases)}: {phase.description}"


def _phase_counts(phase: PhaseReport, real: bool) -> str:
    text = f"balancer: {phase.balancer}; {_tasks(phase.tasks)} dispatched"
    if real:
        text += (
            f", {_dispatches(phase.retried)} failed transiently and went on to the next worker,"
            f" {_tasks(phase.failed)} failed, {phase.superseded} sent to a superseded address"
        )
    return text


def _tasks(n: int) -> str:
    return "1 task" if n == 1 else f"{n} tasks"


def _dispatches(n: int) -> str:
    return "1 dispatch" if n == 1 else f"{n} dispatches"


def _row_text(row: AddressRow) -> str:
    pid = "" if row.pid is None else f" pid {row.pid}"
    text = (
        f"{row.name} {row.short_uid} {row.address}{pid} {row.status}: {_tasks(row.tasks)}"
        f" ({row.tasks_so_far} at this address so far)"
    )
    if row.failures:
        text += f", {_dispatches(row.failures)} failed here transiently"
    if row.superseded:
        text += f", {row.superseded} sent here while superseded"
    if row.process is not None and row.process != "running":
        text += f"; process {row.process}"
    return text


def _address_label(run: PoolRun, name: str, address: str) -> str:
    pid = run.pids.get(address)
    return f"{name} {address}" if pid is None else f"{name} {address} (pid {pid})"


def _summary(run: PoolRun) -> list[str]:
    lines = [f"total tasks: {run.total}", "tasks per address:"]
    lines += [
        f"  {_address_label(run, name, address)}: {count}"
        for (name, address), count in sorted(run.per_address.items())
    ]
    if run.processes:
        pids = sorted(set(run.pids.values()))
        lines.append(
            f"worker processes that answered: {len(pids)} (pids {', '.join(map(str, pids))})"
        )
        lines.append(
            f"dispatches that failed transiently and went on to the next worker: {run.retried}"
        )
        lines.append(f"tasks failed: {run.failed}")
    if run.closing:
        lines.append(run.closing)
    lines.append(f"tasks sent to a superseded address: {run.superseded}")
    return lines


class PlainPoolView:
    """Plain text on ``out``: one block per phase, then the summary."""

    def __init__(self, out: TextIO) -> None:
        self._out = out

    def header(self, run: PoolRun) -> None:
        self._out.write("\n" + "\n".join(run.header) + "\n")
        self._out.flush()

    def phase(self, run: PoolRun, phase: PhaseReport) -> None:
        out = self._out
        out.write(f"\n{_phase_title(run, phase)}\n")
        for event in phase.events:
            out.write(f"  - {event}\n")
        for note in phase.notes:
            out.write(f"  * {note}\n")
        if phase.pool:
            out.write(f"  pool: {', '.join(phase.pool)}\n")
        out.write(f"  {_phase_counts(phase, run.processes)}\n")
        for row in phase.rows:
            out.write(f"    {_row_text(row)}\n")
        out.flush()

    def summary(self, run: PoolRun) -> None:
        self._out.write("\nPool summary:\n")
        self._out.write("".join(f"  {line}\n" for line in _summary(run)))
        self._out.flush()


def _count(n: int, *, bad: bool = False) -> Text:
    return Text(str(n), style="bold red" if bad and n else "")


def _phase_table(phase: PhaseReport, real: bool) -> Table:
    table = Table(caption=_phase_counts(phase, real), caption_justify="left")
    columns = ["worker", "uid", "address"]
    if real:
        columns += ["pid", "process"]
    columns += ["status", "tasks"]
    if real:
        columns += ["failed\ntransiently"]
    columns += ["sent while\nsuperseded", "tasks at\naddress so far"]
    numbers = {"pid", "tasks", "failed\ntransiently", "sent while\nsuperseded"}
    for column in columns:
        right = column in numbers or column.startswith("tasks")
        table.add_column(column, justify="right" if right else "left")
    styles = {"pooled": "green", "superseded": "yellow", "left": "dim"}
    for row in phase.rows:
        cells = [Text(row.name), Text(row.short_uid), Text(row.address)]
        if real:
            process = row.process or ""
            cells += [
                Text(str(row.pid)),
                Text(process, style="" if process == "running" else "dim"),
            ]
        cells += [Text(row.status, style=styles[row.status]), Text(str(row.tasks))]
        if real:
            cells.append(Text(str(row.failures), style="yellow" if row.failures else ""))
        cells += [_count(row.superseded, bad=True), Text(str(row.tasks_so_far))]
        table.add_row(*cells)
    return table


class RichPoolView:
    """``rich`` tables on ``console``: one per phase, then the summary."""

    def __init__(self, console: Console) -> None:
        self._console = console

    def header(self, run: PoolRun) -> None:
        self._console.print()
        for line in run.header:
            self._console.print(Text(line))

    def phase(self, run: PoolRun, phase: PhaseReport) -> None:
        console = self._console
        console.print()
        console.print(Text(_phase_title(run, phase), "bold"))
        for event in phase.events:
            console.print(Text(f"  • {event}", "dim"))
        for note in phase.notes:
            console.print(Text(f"  ★ {note}", "cyan"))
        if phase.pool:
            console.print(Text(f"  pool: {', '.join(phase.pool)}"))
        console.print(_phase_table(phase, run.processes))

    def summary(self, run: PoolRun) -> None:
        console = self._console
        console.print()
        table = Table(title="Pool summary: tasks per address", title_justify="left")
        table.add_column("worker")
        table.add_column("address")
        if run.processes:
            table.add_column("pid", justify="right")
        table.add_column("tasks", justify="right")
        for (name, address), count in sorted(run.per_address.items()):
            cells = [Text(name), Text(address)]
            if run.processes:
                cells.append(Text(str(run.pids.get(address, ""))))
            cells.append(Text(str(count)))
            table.add_row(*cells)
        console.print(table)
        for line in _summary(run):
            if line.startswith(("tasks per address:", "  ")):
                continue
            bad = line.startswith(
                ("tasks sent to a superseded", "tasks failed")
            ) and not line.endswith(": 0")
            style = "bold red" if bad else "green" if line.endswith(": 0") else ""
            console.print(Text(line, style))


def _replay(run: PoolRun, view: PoolView) -> None:
    view.header(run)
    for phase in run.phases:
        view.phase(run, phase)
    view.summary(run)


def render_pool_plain(run: PoolRun, out: TextIO) -> None:
    """Writes a finished pool run to ``out`` as plain text, one block per phase, then the
    summary."""
    _replay(run, PlainPoolView(out))


def render_pool_rich(run: PoolRun, console: Console) -> None:
    """Shows a finished pool run on ``console`` as a table per phase, then the summary."""
    _replay(run, RichPoolView(console))
