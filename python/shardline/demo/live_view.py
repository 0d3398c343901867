"""Rendering ``shardline demo --pg``: plain text for pipes and files, ``rich`` tables for a
terminal. Both consume :meth:`LiveDemo.polls` as it runs, so each poll is shown as soon as it has
been read and routed; both show the same lines and tables (:mod:`shardline.demo.tables`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TextIO

from rich.console import Console
from rich.text import Text

from shardline.demo.live import QUERY, LiveDemo, LivePoll, QueryBatch
from shardline.demo.tables import TableData, plain_table, rich_table

__all__ = ["render_live_plain", "render_live_rich"]


@dataclass(frozen=True, slots=True)
class _Line:
    text: str
    style: str = ""
    indent: int = 0


_Block = _Line | TableData


def _header(demo: LiveDemo, poll: LivePoll) -> list[_Line]:
    spacing = f", {demo.interval:g} s apart" if demo.total > 1 else ""
    lines = [
        _Line(
            f"shardline demo --pg: the live cluster at {poll.server or '?'}, polled"
            f" {demo.total} {'time' if demo.total == 1 else 'times'}{spacing} by a"
            " shardline.picodata client"
        ),
        _Line(
            f"after each poll {demo.keys.count} keys {demo.keys.pattern!r} are routed in every"
            " tier to the master of the replicaset owning their bucket"
        ),
    ]
    if demo.queries:
        lines.append(
            _Line(
                f"and the first {demo.queries} of them run {QUERY!r} with key= in every tier"
                " with buckets, through the client: each on a connection of its key's master"
            )
        )
    return lines


def _routing(poll: LivePoll) -> TableData:
    rows: list[list[object]] = []
    for state in poll.tiers:
        for master in state.routed:
            rows.append(
                [
                    state.tier,
                    state.epoch,
                    master.instance_uuid,
                    master.address or "-",
                    state.replicasets.get(master.instance_uuid, "-"),
                    master.requests,
                ]
            )
        rows.append([state.tier, state.epoch, "(no route)", "-", "-", state.unrouted])
    return (
        "routing: keys per master",
        ["tier", "epoch", "master", "address", "replicaset", "keys"],
        rows,
    )


def _queries(batch: QueryBatch) -> Iterator[_Block]:
    rows: list[list[object]] = [
        [row.tier or "-", row.label, row.address or "-", row.keys, row.queries, row.failed]
        for row in batch.instances
    ]
    if batch.unrouted:
        rows.append(["-", "(no route)", "-", batch.unrouted, "-", batch.unrouted_failed])
    yield (
        "routed queries: where they ran",
        ["tier", "instance", "address", "keys", "queries", "failed"],
        rows,
    )
    counted = ", ".join(
        f"{what}: {_reasons(counts)}"
        for what, counts in (("misses", batch.misses), ("fallbacks", batch.fallbacks))
    )
    yield _Line(
        f"{batch.sent} queries in {batch.elapsed:.2f} s, {batch.failed} failed; {counted};"
        f" retries: {batch.retries}; catalog polls they triggered: {batch.polls}",
        "",
        2,
    )
    for failure in batch.failures:
        yield _Line(f"failed: {failure}", "red", 2)


def _reasons(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{reason} ({n}x)" for reason, n in counts.items()) or "none"


def _samples(poll: LivePoll) -> TableData:
    rows: list[list[object]] = [
        [s.key, s.tier, s.bucket, s.replicaset or "-", s.master or "(no route)", s.address or "-"]
        for s in poll.samples
    ]
    return ("sample keys", ["key", "tier", "bucket", "replicaset", "master", "address"], rows)


def _poll_blocks(poll: LivePoll) -> Iterator[_Block]:
    status = "complete" if poll.complete else "INCOMPLETE (see the failures)"
    yield _Line(f"Poll {poll.number}/{poll.total}, +{poll.elapsed:.2f} s: {status}", "bold")
    if poll.failures:
        yield _Line(f"failures: {', '.join(poll.failures)}", "bold red", 2)
        if poll.last_failure:
            yield _Line(f"last: {poll.last_failure}", "red", 2)
        yield _Line("what could not be read keeps its previous state", "red", 2)
    by_title = {title: (title, header, rows) for title, header, rows in poll.tables}
    if poll.changes is None:
        yield from poll.tables
    elif not poll.changes:
        yield _Line(f"no change since poll {poll.number - 1}", "dim", 2)
        if poll.queries is not None:
            yield from _queries(poll.queries)
        return
    else:
        yield _Line(f"changes since poll {poll.number - 1}:", "", 2)
        for change in poll.changes:
            yield _Line(f"- {change}", "yellow", 4)
        shown = ["tiers", "replicasets", "instances"] if poll.membership_changed else ["tiers"]
        for title in [*shown, "bucket ranges"]:
            yield by_title[title]
        if poll.moves:
            yield (
                "bucket moves: buckets whose owner changed since the previous poll",
                ["tier", "buckets", "from replicaset", "to replicaset"],
                [
                    [tier, f"{start}-{end}", was or "(unmapped)", now or "(unmapped)"]
                    for tier, start, end, was, now in poll.moves
                ],
            )
    yield _routing(poll)
    if poll.queries is not None:
        yield from _queries(poll.queries)
    yield _samples(poll)


def _summary(polls: list[LivePoll]) -> list[_Line]:
    complete = sum(1 for poll in polls if poll.complete)
    changed = [str(poll.number) for poll in polls if poll.changes]
    last = polls[-1]
    unrouted = ", ".join(f"{state.tier} {state.unrouted}" for state in last.tiers) or "no tier"
    lines = [
        _Line("Live summary:", "bold"),
        _Line(f"polls: {len(polls)}, complete: {complete}", "", 2),
        _Line(
            f"changes seen at polls: {', '.join(changed)}" if changed else "no change seen",
            "",
            2,
        ),
        _Line(f"keys with no route at the last poll: {unrouted}", "", 2),
    ]
    batches = [poll.queries for poll in polls if poll.queries is not None]
    if batches:
        lines.append(
            _Line(
                f"routed queries: {sum(b.sent for b in batches)} sent,"
                f" {sum(b.failed for b in batches)} failed,"
                f" {sum(sum(b.fallbacks.values()) for b in batches)} fallbacks",
                "",
                2,
            )
        )
    return lines


def render_live_plain(demo: LiveDemo, out: TextIO) -> None:
    """Writes each poll to ``out`` as plain text as it is read, then a summary."""
    polls: list[LivePoll] = []
    for poll in demo.polls():
        if not polls:
            for line in _header(demo, poll):
                out.write(line.text + "\n")
        polls.append(poll)
        out.write("\n")
        for block in _poll_blocks(poll):
            if isinstance(block, _Line):
                out.write(" " * block.indent + block.text + "\n")
            else:
                title, header, rows = block
                out.write(f"  {title}\n")
                plain_table(header, rows, out, indent="    ")
        out.flush()
    out.write("\n")
    for line in _summary(polls):
        out.write(" " * line.indent + line.text + "\n")


def render_live_rich(demo: LiveDemo, console: Console) -> None:
    """Shows each poll on ``console`` as lines and tables as it is read, then a summary."""
    polls: list[LivePoll] = []
    for poll in demo.polls():
        if not polls:
            for line in _header(demo, poll):
                console.print(Text(line.text))
        polls.append(poll)
        console.print()
        for block in _poll_blocks(poll):
            if isinstance(block, _Line):
                console.print(Text(" " * block.indent + block.text, block.style))
            else:
                console.print(rich_table(*block))
    console.print()
    for line in _summary(polls):
        console.print(Text(" " * line.indent + line.text, line.style))
