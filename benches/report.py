"""Turns one ``pytest benches/ --benchmark-json=FILE`` run into the tables of RESULTS.md.

    python benches/report.py RUN.json [MORE_RUNS.json ...] [--write benches/RESULTS.md]

Prints the tables (machine, goals, per-group medians in ns per call or per key, ratios) of the
first run; further runs add only a table of the goals' numbers in each, to show the spread. With
``--write``, replaces what lies between the ``<!-- results:start -->`` and
``<!-- results:end -->`` markers of that file, leaving the hand-written notes around them alone.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

START, END = "<!-- results:start -->", "<!-- results:end -->"


def ns(bench: dict[str, Any], stat: str = "median") -> float:
    return float(bench["stats"][stat]) * 1e9 / int(bench["extra_info"].get("calls_per_round", 1))


def others(bench: dict[str, Any]) -> str:
    """Cores kept busy by other processes while the benchmark ran; flagged past BUSY."""
    if "others_cpu" not in bench["extra_info"]:
        return "?"
    value = bench["extra_info"]["others_cpu"]
    if value is None:
        return "n/a"  # too short to tell
    return f"**{value:.2f}**" if value > BUSY else f"{value:.2f}"


BUSY = 0.3


def fmt(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}"


def group_order(name: str) -> tuple[int, str]:
    for rank, prefix in enumerate(
        [
            "lookup",
            "bucket_id",
            "route_many",
            "unchanged poll",
            "design: call",
            "design: bulk",
            "design: route_many decomposition",
            "design: route_many by",
        ]
    ):
        if name.startswith(prefix):
            return rank, name
    return 99, name


def tables(
    data: dict[str, Any],
) -> tuple[
    list[str], dict[str, dict[str, tuple[float, float]]], dict[tuple[str, str], float | None]
]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for bench in data["benchmarks"]:
        if "goal_group" not in bench["extra_info"]:  # bench_goals.py: see interleaved()
            groups.setdefault(bench["group"], []).append(bench)
    out: list[str] = []
    stats: dict[str, dict[str, tuple[float, float]]] = {}
    busy: dict[tuple[str, str], float | None] = {}
    for group in sorted(groups, key=group_order):
        benches = sorted(groups[group], key=lambda b: ns(b))
        by_impl = {b["extra_info"]["impl"]: ns(b) for b in benches}
        stats[group] = {b["extra_info"]["impl"]: (ns(b), ns(b, "min")) for b in benches}
        busy.update(
            {(group, b["extra_info"]["impl"]): b["extra_info"].get("others_cpu") for b in benches}
        )
        floor = next((v for k, v in by_impl.items() if k.startswith("floor")), None)
        peer = next((v for k, v in by_impl.items() if k.startswith("picopyn")), None)
        if benches[0]["extra_info"]["calls_per_round"] >= 100_000:
            unit, scale = "ns per key", 1.0
        elif min(by_impl.values()) >= 1_000:
            unit, scale = "µs per call", 1000.0
        else:
            unit, scale = "ns per call", 1.0
        out.append(f"#### {group}\n")
        header = f"| implementation | median {unit} | IQR | min | rounds | others' CPU |"
        rule = "| --- | ---: | ---: | ---: | ---: | ---: |"
        # per-sample latency distributions and throughput, where a benchmark recorded them
        # (bench_discovery.py, bench_transport.py): in the same unit as the median
        extras = [
            (key, title)
            for key, title in EXTRA_COLUMNS
            if any(key in b["extra_info"] for b in benches)
        ]
        for _, title in extras:
            header += f" {title} |"
            rule += " ---: |"
        if floor is not None:
            header += " x floor |"
            rule += " ---: |"
        if peer is not None:
            header += " picopyn / this |"
            rule += " ---: |"
        out += [header, rule]
        for bench in benches:
            impl = bench["extra_info"]["impl"]
            median = ns(bench)
            row = (
                f"| {impl} | {fmt(median / scale)} | {fmt(ns(bench, 'iqr') / scale)} |"
                f" {fmt(ns(bench, 'min') / scale)} | {bench['stats']['rounds']} |"
                f" {others(bench)} |"
            )
            for key, _ in extras:
                row += f" {extra_cell(bench['extra_info'].get(key), key, scale)} |"
            if floor is not None:
                row += f" {median / floor:.2f} |"
            if peer is not None:
                row += f" {peer / median:.1f} |"
            out.append(row)
        out.append("")
    return out, stats, busy


EXTRA_COLUMNS = [
    ("p50_ns", "p50 of samples"),
    ("p99_ns", "p99 of samples"),
    ("calls_per_s", "calls/s"),
    ("client_cpu", "client's CPU"),
    ("servers_cpu", "servers' CPU"),
]


def extra_cell(value: float | None, key: str, scale: float) -> str:
    if value is None:
        return ""
    if key.endswith("_ns"):
        return fmt(value / scale)
    if key == "calls_per_s":
        return f"{value:,.0f}"
    return f"{value:.2f}"


Goal = tuple[str, str, str, str, str, float]  # text, group, ours, theirs, kind, bound

GOALS: list[Goal] = [
    (
        "`owner` within 1.5x of `dict.get`, {map}",
        "lookup {map}",
        "shardline owner",
        "floor: dict.get",
        "at most",
        1.5,
    ),
    (
        "`owner` >= 5x faster than picopyn `find_bucket_master`, {map}",
        "lookup {map}",
        "shardline owner",
        "picopyn find_bucket_master",
        "speedup",
        5,
    ),
    (
        "`route` of a str key >= 8x faster than picopyn `calculate_bucket_id`",
        "bucket_id str key",
        "shardline route",
        "picopyn calculate_bucket_id",
        "speedup",
        8,
    ),
    (
        "`route_many` of 100,000 str keys <= 10 ns per key",
        "route_many 100,000 keys (3000b-256r)",
        "shardline route_many(list[str])",
        "",
        "ns",
        10,
    ),
    (
        "`route_many` of a 100,000 int64 array <= 10 ns per key",
        "route_many 100,000 keys (3000b-256r)",
        "shardline route_many(np.int64)",
        "",
        "ns",
        10,
    ),
    (
        "unchanged 256-range poll >= 50x faster than picopyn",
        "unchanged poll 3000b-256r",
        "shardline apply_bucket_snapshot",
        "picopyn apply_bucket_rows",
        "speedup",
        50,
    ),
    (
        "unchanged 256-range poll, as JSON text, >= 50x faster than picopyn",
        "unchanged poll 3000b-256r",
        "shardline apply_bucket_snapshot(JSON text)",
        "picopyn apply_bucket_rows(JSON text)",
        "speedup",
        50,
    ),
]


def interleaved(data: dict[str, Any]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """bench_goals.py's measurements, by (goal group, shardline impl, compared impl)."""
    return {
        (e["goal_group"], e["goal_ours"], e["goal_theirs"]): e
        for e in (bench["extra_info"] for bench in data["benchmarks"])
        if "goal_group" in e
    }


def goal_values(
    stats: dict[str, dict[str, tuple[float, float]]],
    busy: dict[tuple[str, str], float | None],
    inter: dict[tuple[str, str, str], dict[str, Any]],
) -> list[dict[str, Any]]:
    """Each goal measured in one run: judged on the medians; the ratio of the minimums aside."""
    expanded: list[Goal] = []
    for goal in GOALS:
        if "{map}" in goal[1]:
            expanded += [
                (goal[0].format(map=m), goal[1].format(map=m), *goal[2:])
                for m in ("3000b-256r", "30000b-256r")
            ]
        else:
            expanded.append(goal)
    values: list[dict[str, Any]] = []
    for text, group, ours, theirs, kind, bound in expanded:
        g = stats.get(group, {})
        value: dict[str, Any] = {"text": text, "kind": kind, "run": ours in g}
        values.append(value)
        if not value["run"]:
            continue
        med, low = g[ours]
        loads = [busy.get((group, impl)) for impl in (ours, theirs) if impl]
        known = [load for load in loads if load is not None]
        value.update(ours=med, ours_min=low, busy=max(known) if known else None)
        if kind == "ns":
            value.update(headline=med, headline_min=low, met=med <= bound, met_min=low <= bound)
            continue
        their_med, their_low = g[theirs]
        if kind == "at most":
            ratio, ratio_low = med / their_med, low / their_low
            met, met_min = ratio <= bound, ratio_low <= bound
        else:
            ratio, ratio_low = their_med / med, their_low / low
            met, met_min = ratio >= bound, ratio_low >= bound
        value.update(
            theirs=their_med,
            ratio=ratio,
            ratio_min=ratio_low,
            headline=ratio,
            headline_min=ratio_low,
            met=met,
            met_min=met_min,
        )
        e = inter.get((group, ours, theirs))
        if e is not None:  # its ratio is theirs / ours, per round
            r, (q1, q3) = e["ratio"], e["ratio_q1_q3"]
            if kind == "at most":
                r, q1, q3 = 1 / r, 1 / q3, 1 / q1
            value.update(
                inter=r,
                inter_q=(q1, q3),
                inter_met=r <= bound if kind == "at most" else r >= bound,
                inter_busy=e.get("others_cpu"),
            )
    return values


def goals(values: list[dict[str, Any]]) -> list[str]:
    rows = [
        "| goal | shardline (median) | compared (median) | ratio of medians | met? "
        "| ratio of minimums | met? | interleaved ratio [q1, q3] | met? | others' CPU |",
        "| --- | ---: | ---: | ---: | :---: | ---: | :---: | ---: | :---: | ---: |",
    ]
    for v in values:
        if not v["run"]:
            rows.append(f"| {v['text']} | not run | | | — | | — | | — | |")
        elif v["kind"] == "ns":
            rows.append(
                f"| {v['text']} | {v['ours']:.1f} ns/key | | | {yes(v['met'])} |"
                f" min {v['ours_min']:.1f} ns/key | {yes(v['met_min'])} | n/a | |"
                f" {busy_mark(v['busy'])} |"
            )
        else:
            scale, unit = (1000.0, "µs") if v["ours"] >= 10_000 else (1.0, "ns")
            rows.append(
                f"| {v['text']} | {v['ours'] / scale:.1f} {unit} |"
                f" {v['theirs'] / scale:.1f} {unit} | {v['ratio']:.2f}x | {yes(v['met'])} |"
                f" {v['ratio_min']:.2f}x | {yes(v['met_min'])} | {inter_cell(v)} |"
                f" {yes(v['inter_met']) if 'inter' in v else '—'} |"
                f" {busy_mark(v['busy'])}{inter_busy(v)} |"
            )
    return rows


def spread(runs: list[list[dict[str, Any]]], stamps: list[str]) -> list[str]:
    """The goals' headline numbers across several runs, the first being the one reported."""
    rows = [
        "| goal | " + " | ".join(stamps) + " |",
        "| --- |" + " ---: |" * len(stamps),
    ]
    for i, first in enumerate(runs[0]):
        cells = []
        for run in runs:
            v = run[i]
            if not v["run"]:
                cells.append("—")
            elif v["kind"] == "ns":
                cells.append(
                    f"{v['headline']:.1f}{miss(v['met'])} / {v['headline_min']:.1f}"
                    f"{miss(v['met_min'])} ns"
                )
            else:
                cell = (
                    f"{v['headline']:.2f}x{miss(v['met'])} / {v['headline_min']:.2f}x"
                    f"{miss(v['met_min'])}"
                )
                if "inter" in v:
                    cell += f" / {v['inter']:.2f}x{miss(v['inter_met'])}"
                cells.append(cell)
        rows.append(f"| {first['text']} | " + " | ".join(cells) + " |")
    return rows


def busy_mark(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"**{value:.2f}**" if value > BUSY else f"{value:.2f}"


def inter_cell(v: dict[str, Any]) -> str:
    if "inter" not in v:
        return "not run"
    q1, q3 = v["inter_q"]
    return f"{v['inter']:.2f}x [{q1:.2f}, {q3:.2f}]"


def inter_busy(v: dict[str, Any]) -> str:
    return f" / {busy_mark(v['inter_busy'])}" if "inter" in v else ""


def miss(met: bool) -> str:
    return "" if met else " ✗"


def yes(met: bool) -> str:
    return "yes" if met else "**NO**"


def render(data: dict[str, Any], others: list[dict[str, Any]]) -> str:
    machine = data["machine_info"]
    commit = data.get("commit_info", {})
    table_lines, stats, busy = tables(data)
    values = goal_values(stats, busy, interleaved(data))
    lines = [
        f"Run of {data['datetime'][:19]} UTC (pytest-benchmark {data['version']}).",
        "",
        f"- CPU: {machine.get('cpu_model', '?')}, nproc = {machine.get('nproc', '?')}",
        f"- Python {machine['python_version']} ({machine['python_implementation']}), "
        f"{machine['system']} {machine['release']}",
        f"- load average (1, 5, 15 min) at collection: {fmt_load(machine, 'loadavg_at_collection')}"
        f"; at the end: {fmt_load(machine, 'loadavg_at_end')}",
        f"- repository HEAD when run: {str(commit.get('id', '?'))[:12]}"
        f"{' (work tree dirty)' if commit.get('dirty') else ''}",
        f"- shardline measured: {build_line(machine.get('shardline_build'))}",
        "",
        "### Goals",
        "",
        *goals(values),
    ]
    if others:
        runs = [values] + [goal_values(*tables(d)[1:], interleaved(d)) for d in others]
        stamps = [
            f"{d['datetime'][11:19]}{' (above)' if i == 0 else ''}"
            for i, d in enumerate([data, *others])
        ]
        lines += [
            "",
            "### The same goals in every run of the session",
            "",
            "Ratio of medians / ratio of minimums / interleaved ratio (for the `route_many`"
            " goals: median / minimum ns per key); ✗ = goal missed.",
            "",
            *spread(runs, stamps),
        ]
    lines += [
        "",
        "### All groups (medians; per call unless said; IQR and min in the same unit)",
        "",
        *table_lines,
    ]
    return "\n".join(lines).rstrip() + "\n"


def build_line(build: dict[str, str] | None) -> str:
    if not build:
        return "?"
    note = f"{build['note']}; " if build.get("note") else ""
    return f"{note}extension built {build['built']} ({build['extension']})"


def fmt_load(machine: dict[str, Any], key: str) -> str:
    load = machine.get(key)
    return ", ".join(f"{x:.2f}" for x in load) if load else "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="--benchmark-json files, first reported")
    parser.add_argument("--write", type=Path, help="RESULTS.md whose generated part to replace")
    args = parser.parse_args()
    data, *others = [json.loads(path.read_text()) for path in args.runs]
    text = render(data, others)
    if args.write:
        current = args.write.read_text() if args.write.exists() else f"{START}\n{END}\n"
        head, rest = current.split(START, 1)
        _, tail = rest.split(END, 1)
        args.write.write_text(f"{head}{START}\n{text}{END}{tail}")
    print(text)


if __name__ == "__main__":
    main()
