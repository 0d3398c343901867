"""Rendering the registration part of the demo: plain text for pipes and files, ``rich`` tables
for a terminal, in the style of the other parts (:mod:`shardline.demo.view`,
:mod:`shardline.demo.pool_view`)."""

from __future__ import annotations

from typing import TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from shardline.demo.registration import RegistrationRun, Timeline, TimelineRow
from shardline.registration import Record

__all__ = ["render_registration_plain", "render_registration_rich"]


def _seconds(value: float) -> str:
    return f"{value:g} s"


def _time(value: float) -> str:
    return f"{value:.1f} s"


def _record(record: Record | None) -> str:
    if record is None:
        return "none (never reported)"
    address = f"address {record.address}" if record.address else "no address"
    return f"owner {record.owner}, registered {record.registered}, {address}"


def _dispatch(row: TimelineRow) -> str:
    if row.served_by is not None:
        return f"served by {row.served_by}"
    return f"failed, {row.failure}"


def _timelines(run: RegistrationRun) -> list[Timeline]:
    return [run.fixed] if run.contrast is None else [run.fixed, run.contrast]


def _title(run: RegistrationRun, number: int, timeline: Timeline) -> str:
    return f"Registration timeline {number}/{len(_timelines(run))}, {timeline.title}"


def _summary(run: RegistrationRun, timeline: Timeline) -> list[tuple[str, bool | None]]:
    """The timeline's measured results, each with whether it is bad (True), good (False) or
    neither (None)."""
    lines: list[tuple[str, bool | None]] = []
    bound = (
        f"the bound: probe interval {_seconds(run.probe_interval)} + tick"
        f" {_seconds(run.tick)} = {_seconds(run.bound)}"
    )
    for window in timeline.windows:
        if window.end is None:
            lines.append(
                (
                    f"wrong-False window: still open at the end of the run ({_time(timeline.end)}),"
                    f" {_time(timeline.end - window.start)} after {window.opened_by} at"
                    f" {_time(window.start)}, while A served all along: nothing will ever write"
                    " True again",
                    True,
                )
            )
            continue
        length = window.end - window.start
        verdict = "within" if length <= run.bound else "OVER"
        lines.append(
            (
                f"wrong-False window: {_time(length)}, from {window.opened_by} at"
                f" {_time(window.start)} until {window.closed_by} at {_time(window.end)}"
                f" healed the record; {verdict} {bound}"
                + (
                    f", and within one probe interval ({_seconds(run.probe_interval)})"
                    if length <= run.probe_interval
                    else ""
                ),
                length > run.bound,
            )
        )
    if not timeline.windows:
        lines.append(("wrong-False window: none", False))
    dropped = ", ".join(_time(t) for t in timeline.dropped_at) or "never"
    again = [t for t in timeline.added_at if timeline.dropped_at and t > timeline.dropped_at[0]]
    lines.append(
        (
            f"the proxy (fed by RegistrationDiscovery): worker-dropped at {dropped};"
            + (
                f" worker-added again at {', '.join(_time(t) for t in again)}"
                if again
                else " never added again"
            ),
            bool(timeline.dropped_at) and not again,
        )
    )
    text = (
        f"requests to app through the proxy, one per virtual second: {timeline.requests};"
        f" served by A: {timeline.served}; failed with NoWorkersAvailable while A served and"
        f" the record said False: {timeline.failed_while_wrong}"
    )
    if timeline.failed_otherwise:
        text += f"; failed otherwise: {timeline.failed_otherwise}"
    lines.append((text, None))
    return lines


def _footer(run: RegistrationRun) -> str:
    runs = "both runs" if run.contrast is not None else "the run"
    return (
        f"Registration: {_seconds(run.end)} of virtual time per run; {runs} took"
        f" {run.elapsed:.2f} s of real time"
    )


def render_registration_plain(run: RegistrationRun, out: TextIO) -> None:
    """Writes the registration part to ``out`` as plain text: the header, then each timeline
    (a block per moment something happened) with its measured results."""
    out.write("\n" + "\n".join(run.header) + "\n")
    for number, timeline in enumerate(_timelines(run), 1):
        out.write(f"\n{_title(run, number, timeline)}\n")
        out.write(f"  {timeline.keeper}\n")
        width = max((len(_time(row.time)) for row in timeline.rows), default=0)
        for row in timeline.rows:
            out.write(f"  - {_time(row.time).rjust(width)}  {'; '.join(row.events)}\n")
            indent = " " * (width + 6)
            for log in row.logs:
                out.write(f"{indent}* {log}\n")
            got = ", ".join(row.pool_events) or "nothing"
            out.write(
                f"{indent}record: {_record(row.record)}; advertised_address: {row.advertised};"
                f" the proxy got {got}; a dispatch now: {_dispatch(row)}\n"
            )
        for line, _ in _summary(run, timeline):
            out.write(f"  {line}\n")
    out.write(f"\n{_footer(run)}\n")
    out.flush()


def _style(bad: bool | None) -> str:
    return "" if bad is None else "bold red" if bad else "green"


def _table(timeline: Timeline) -> Table:
    table = Table()
    table.add_column("time", justify="right", no_wrap=True)
    table.add_column("event", ratio=1)
    table.add_column("record\n(owner, registered,\naddress)", no_wrap=True)
    table.add_column("advertised\naddress", no_wrap=True)
    table.add_column("proxy got", no_wrap=True)
    table.add_column("a dispatch\nnow", no_wrap=True)
    for row in timeline.rows:
        event = Text("\n".join(row.events))
        for log in row.logs:
            event.append(f"\n{log}", style="dim")
        record = row.record
        if record is None:
            record_text = Text("none", style="dim")
        else:
            record_text = Text(
                f"{record.owner}, {record.registered}, {record.address or '-'}",
                style="green" if record.registered else "bold red",
            )
        table.add_row(
            Text(_time(row.time)),
            event,
            record_text,
            Text(str(row.advertised), style="" if row.advertised else "red"),
            Text(
                "\n".join(event.split(" ")[0] for event in row.pool_events) or "-",
                style="" if row.pool_events else "dim",
            ),
            Text(f"served by {row.served_by}", style="green")
            if row.served_by is not None
            else Text((row.failure or "failed").split(" ")[0], style="bold red"),
        )
    return table


def render_registration_rich(run: RegistrationRun, console: Console) -> None:
    """Shows the registration part on ``console``: the header, then a table per timeline with
    its measured results."""
    console.print()
    for line in run.header:
        console.print(Text(line))
    for number, timeline in enumerate(_timelines(run), 1):
        console.print()
        console.print(Text(_title(run, number, timeline), "bold"))
        console.print(Text(f"  {timeline.keeper}", "dim"))
        console.print(_table(timeline))
        for line, bad in _summary(run, timeline):
            console.print(Text(line, _style(bad)))
    console.print()
    console.print(Text(_footer(run), "dim"))
