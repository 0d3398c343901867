"""Draws the side-by-side results of one ``pytest benches/ --benchmark-json=FILE`` run as PNGs.

    python benches/plots.py RUN.json [--out benches/plots]

JSON in, pictures out (matplotlib's Agg renderer, no display), one file per comparison:

- ``lookup.png`` (``bench_lookup.py``): ns per ``owner`` / ``find_bucket_master`` call against the
  number of ranges in the map, one panel per bucket count, shardline against picopyn and the
  floors;
- ``dispatch.png`` (``bench_pool.py``): a whole ``WorkerProxy.dispatch`` over a connection that
  returns at once, shardline against wool and their floors, and the pool's operations, against
  the number of workers in the pool;
- ``calls.png`` (``bench_calls.py``): the distribution of end-to-end call latencies at 1 in
  flight, one panel per placement, each way a curve (its ``by_way[...]["cdf_ns"]``);
- ``faults.png`` (``bench_faults.py``, drawn only when asked for by ``--only faults.png``, as
  ``make bench-faults`` does: a full run takes minutes more with it): completed calls/s over
  time through each fault scenario, one panel per scenario, each system a curve (its
  ``systems[...]["series"]``), the fault's window shaded.

Points are medians per call, with the interquartile range of the rounds as error bars. Each
figure's title names the machine facts the run carries: date, CPU, load average at collection
and at the end, the shardline build and the repository HEAD. The file names are fixed, so a new
run replaces the pictures that RESULTS.md and the README link.

A run without a picture's groups (say, a ``-k lookup`` run, or a ``bench_calls.py`` run from
before ``cdf_ns``) is refused with :class:`MissingGroups`, which names what is missing and the
bench that makes it; every picture is checked before any file is written.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib import ticker
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

logger = logging.getLogger("shardline.benches.plots")

LOOKUP = re.compile(r"lookup (\d+)b-(\d+)r")
PROXY = re.compile(r"proxy dispatch overhead, ([\d,]+) workers")
POOL = re.compile(r"pool (.+), ([\d,]+) workers")
CALLS = re.compile(r"calls end to end, 1 in flight, (.+)")
FAULTS = "faults: "
# bench_calls.py's placements, in the order its module names them
PLACEMENT_ORDER = ("separate CPUs", "one CPU", "unpinned")


class MissingGroups(ValueError):
    """The run lacks what a picture needs: ``picture`` (its file name), ``missing`` (the
    groups or fields, as the benches name them) and ``bench`` (the file that makes them)."""

    def __init__(self, picture: str, missing: str, bench: str) -> None:
        super().__init__(
            f"{picture} needs {missing} from benches/{bench}, which the run does not hold;"
            f" run {bench} into the JSON (a full `benches/run.sh` does)"
        )
        self.picture, self.missing, self.bench = picture, missing, bench


@dataclass(frozen=True)
class Point:
    """One implementation's median per call at one size, with the rounds' quartiles."""

    impl: str
    size: int
    median: float
    q1: float
    q3: float


def per_call(bench: dict[str, Any], scale: float) -> tuple[float, float, float]:
    """(median, q1, q3) of a benchmark's rounds, per call, in seconds times ``scale``."""
    calls = int(bench["extra_info"].get("calls_per_round", 1))
    median, q1, q3 = (float(bench["stats"][key]) * scale / calls for key in ("median", "q1", "q3"))
    return median, q1, q3


def points(data: dict[str, Any], pattern: re.Pattern[str], scale: float) -> dict[str, list[Point]]:
    """The benchmarks whose whole group matches ``pattern`` (its last group being the size,
    digits with thousands commas), by the group's other captures joined, as ``Point``s."""
    found: dict[str, list[Point]] = {}
    for bench in data["benchmarks"]:
        match = pattern.fullmatch(bench.get("group") or "")
        if match is None or "goal_group" in bench["extra_info"]:
            continue
        *kind, size = match.groups()
        median, q1, q3 = per_call(bench, scale)
        impl = bench["extra_info"]["impl"]
        found.setdefault(" ".join(kind), []).append(
            Point(impl, int(size.replace(",", "")), median, q1, q3)
        )
    return found


def lookup_figure(data: dict[str, Any]) -> Figure:
    by_buckets = points(data, LOOKUP, 1e9)
    if not by_buckets:
        raise MissingGroups(
            "lookup.png", "the groups 'lookup {buckets}b-{ranges}r'", "bench_lookup.py"
        )
    fig = Figure(figsize=(11, 4.8), layout="constrained")
    panels = sorted(by_buckets, key=int)
    axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    for ax, buckets in zip(axes, panels, strict=True):
        curves(ax, by_buckets[buckets])
        ax.set_title(f"{int(buckets):,} buckets")
        ax.set_xlabel("ranges in the map (log scale)")
    axes[0].set_ylabel("ns per call, median and quartiles (log scale)")
    axes[0].set_yscale("log")
    log_values(axes[0].yaxis)
    axes[-1].legend(fontsize="small")
    title(fig, data, "Owner of a bucket, one call at a time: shardline vs picopyn")
    return fig


def dispatch_figure(data: dict[str, Any]) -> Figure:
    proxy = points(data, PROXY, 1e6).get("", [])
    operations = points(data, POOL, 1e9)
    if not proxy:
        raise MissingGroups(
            "dispatch.png", "the groups 'proxy dispatch overhead, {n} workers'", "bench_pool.py"
        )
    if not operations:
        raise MissingGroups("dispatch.png", "the groups 'pool {op}, {n} workers'", "bench_pool.py")
    fig = Figure(figsize=(12, 5), layout="constrained")
    left, right = fig.subplots(1, 2)
    curves(left, proxy)
    left.set_title("WorkerProxy.dispatch, connection returning at once")
    left.set_ylabel("µs per dispatch, median and quartiles (log scale)")
    curves(right, [p for op in sorted(operations) for p in operations[op]], by_operation)
    right.set_title("the pool's operations (solid: shardline, dashed: wool)")
    right.set_ylabel("ns per operation, median and quartiles (log scale)")
    for ax in (left, right):
        ax.set_yscale("log")
        log_values(ax.yaxis)
        ax.set_xlabel("workers in the pool (log scale)")
    left.legend(fontsize="x-small", loc="upper left")
    # eight curves fill the panel: their legend goes under it, a pair per row
    right.legend(fontsize="x-small", loc="upper center", bbox_to_anchor=(0.5, -0.14), ncols=2)
    title(fig, data, "Dispatch overhead against pool size: shardline vs wool")
    return fig


def calls_figure(data: dict[str, Any]) -> Figure:
    placements: dict[str, dict[str, Any]] = {}
    for bench in data["benchmarks"]:
        match = CALLS.fullmatch(bench.get("group") or "")
        if match is not None:
            placements[bench["params"]["placement"]] = bench["extra_info"]
    if not placements:
        raise MissingGroups(
            "calls.png",
            "the groups 'calls end to end, 1 in flight, {placement}, {loop}'",
            "bench_calls.py",
        )
    order = sorted(placements, key=lambda p: (*PLACEMENT_ORDER, p).index(p))
    fig = Figure(figsize=(5 * len(order), 5), layout="constrained")
    axes = fig.subplots(1, len(order), sharex=True, sharey=True, squeeze=False)[0]
    for ax, placement in zip(axes, order, strict=True):
        info = placements[placement]
        # a way the run could not reach is "not available" instead of its figures
        ways = {way: f for way, f in info["by_way"].items() if isinstance(f, dict)}
        for way, figures in ways.items():
            if "cdf_ns" not in figures:
                raise MissingGroups(
                    "calls.png", f"by_way[{way!r}]['cdf_ns'] ({placement})", "bench_calls.py"
                )
        for way, (color, dash, _) in by_project(list(ways)).items():
            percents, ns = zip(*ways[way]["cdf_ns"], strict=True)
            ax.plot([v / 1e3 for v in ns], percents, color=color, linestyle=dash, label=way)
        ax.set_title(f"{placement}, {info.get('loop', '?')}")
        ax.set_xscale("log")
        ax.set_xlabel("latency of one call, µs (log scale)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:,.10g}"))
    axes[0].set_ylabel("calls at or below, %")
    axes[0].set_ylim(0, 100)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=3, fontsize="small")
    title(fig, data, "End-to-end call latency, 1 in flight, 2 worker processes on loopback")
    return fig


def faults_figure(data: dict[str, Any]) -> Figure:
    scenarios = [
        bench["extra_info"]
        for bench in data["benchmarks"]
        if (bench.get("group") or "").startswith(FAULTS)
    ]
    if not scenarios:
        raise MissingGroups("faults.png", "the groups 'faults: {scenario}'", "bench_faults.py")
    rows = (len(scenarios) + 1) // 2
    fig = Figure(figsize=(13, 2.9 * rows + 1.4), layout="constrained")
    axes = fig.subplots(rows, 2, sharex=True, squeeze=False).flatten()
    for ax, info in zip(axes, scenarios, strict=False):
        phases = info["phases_s"]
        if not info["scenario"].startswith("healthy"):
            start = phases["steady"]
            ax.axvspan(start, start + phases["fault"], color="0.92", label="the fault")
        for name, figures in info["systems"].items():
            color, dash = fault_style(name)
            series = figures["series"]
            times = [(k + 1) * phases["bin"] for k in range(len(series))]
            ax.plot(times, series, color=color, linestyle=dash, label=name)
        ax.set_title(info["scenario"], fontsize="medium")
        # wool's hundreds of calls/s beside shardline's tens of thousands, and the zeros of a
        # stalled pool: logarithmic above 100, linear below
        ax.set_yscale("symlog", linthresh=100, linscale=0.5)
        ax.yaxis.set_major_locator(
            ticker.SymmetricalLogLocator(linthresh=100, base=10, subs=(1, 3))
        )
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:,.10g}"))
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())
        top = max((max(f["series"], default=0) for f in info["systems"].values()), default=0)
        ax.set_ylim(0, max(top, 100) * 1.6)
        ax.grid(True, which="both", alpha=0.3)
    for ax in axes[len(scenarios) :]:
        ax.set_visible(False)
    for ax in axes[::2]:
        ax.set_ylabel(f"calls/s (per {scenarios[0]['phases_s']['bin']:g} s)")
    for ax in axes[-2:]:
        ax.set_xlabel("seconds since the callers started")
        ax.xaxis.set_tick_params(labelbottom=True)
    labels: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            labels.setdefault(label, handle)
    fig.legend(
        labels.values(), labels.keys(), loc="outside lower center", ncols=3, fontsize="small"
    )
    workers, callers = scenarios[0]["workers"], scenarios[0]["callers"]
    title(fig, data, f"Calls/s through one sick worker of {workers}, {callers} callers")
    return fig


# bench_faults.py's systems: a color and a line style each, the same in every panel
FAULT_STYLES = (
    ("standalone workers + LocalDiscovery, health=None", ("tab:brown", "-")),
    ("standalone", ("navy", "-")),
    ("health=None", ("tab:orange", "-")),
    ("least-loaded", ("tab:cyan", "-")),
    ("3 workers", ("0.45", ":")),
    ("shardline", ("tab:blue", "-")),
)


def fault_style(name: str) -> tuple[str, str]:
    for part, style in FAULT_STYLES:
        if part in name:
            return style
    return "tab:red", "--"


Style = tuple[str, str, str]  # color, line style, marker


def curves(
    ax: Axes, found: list[Point], styles: Callable[[list[str]], dict[str, Style]] | None = None
) -> None:
    """One line per implementation through its sizes, the quartiles as error bars; the x axis
    logarithmic, ticked at the sizes measured."""
    by_impl: dict[str, list[Point]] = {}
    for point in found:
        by_impl.setdefault(point.impl, []).append(point)
    impls = sorted(by_impl, key=impl_order)
    for impl, (color, dash, marker) in (styles or by_project)(impls).items():
        line = sorted(by_impl[impl], key=lambda p: p.size)
        ax.errorbar(
            [p.size for p in line],
            [p.median for p in line],
            yerr=[[p.median - p.q1 for p in line], [p.q3 - p.median for p in line]],
            color=color,
            linestyle=dash,
            marker=marker,
            markersize=4,
            capsize=3,
            label=impl,
        )
    sizes = sorted({p.size for p in found})
    ax.set_xscale("log")
    ax.set_xticks(sizes, [f"{size:,}" for size in sizes])
    ax.xaxis.set_minor_locator(ticker.NullLocator())
    ax.grid(True, which="both", alpha=0.3)


def impl_order(impl: str) -> tuple[int, str]:
    """Floors first, then shardline, then the peers: the legend reads in that order."""
    for rank, prefix in enumerate(("floor", "ref", "bare", "shardline")):
        if impl.startswith(prefix):
            return rank, impl
    return 9, impl


OURS = ("tab:blue", "navy", "tab:cyan", "tab:purple")
PEERS = ("tab:red", "tab:orange", "tab:brown", "tab:pink")
GRAYS = {"floor": ("0.3", ":"), "ref": ("0.6", ":"), "bare": ("0.45", "-.")}


def by_project(impls: list[str]) -> dict[str, Style]:
    """shardline solid in blues, the peers dashed in reds, floors and references gray."""
    styles: dict[str, Style] = {}
    ours, peers = iter(OURS), iter(PEERS)
    for impl in impls:
        gray = next((g for prefix, g in GRAYS.items() if impl.startswith(prefix)), None)
        if gray is not None:
            styles[impl] = (*gray, ".")
        elif impl.startswith("shardline"):
            styles[impl] = (next(ours, "tab:blue"), "-", "o")
        else:
            styles[impl] = (next(peers, "tab:red"), "--", "^")
    return styles


def by_operation(impls: list[str]) -> dict[str, Style]:
    """``"{project} {operation}"``: a color per operation, solid for shardline, dashed for the
    peer, so each pair reads side by side."""
    operations = sorted({impl.split(" ", 1)[1] for impl in impls})
    styles: dict[str, Style] = {}
    for impl in impls:
        project, operation = impl.split(" ", 1)
        ours = project == "shardline"
        color = f"C{operations.index(operation)}"
        styles[impl] = (color, "-" if ours else "--", "o" if ours else "^")
    return styles


def log_values(axis: Any) -> None:
    """A logarithmic value axis ticked at 1, 2 and 5 of each decade, in plain numbers."""
    axis.set_major_locator(ticker.LogLocator(base=10, subs=(1, 2, 5)))
    axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:,.10g}"))
    axis.set_minor_formatter(ticker.NullFormatter())


def title(fig: Figure, data: dict[str, Any], what: str) -> None:
    machine = data.get("machine_info", {})
    commit = data.get("commit_info", {})
    build = machine.get("shardline_build") or {}
    facts = [
        f"{str(data.get('datetime', '?'))[:16].replace('T', ' ')} UTC",
        f"{machine.get('cpu_model', '?')}, {machine.get('nproc', '?')} CPUs",
        f"load avg (1/5/15 min) {load(machine, 'loadavg_at_collection')} at start,"
        f" {load(machine, 'loadavg_at_end')} at end",
    ]
    built = f"{build['note']}, " if build.get("note") else ""
    built += f"extension built {build.get('built', '?')}"
    head = f"HEAD {str(commit.get('id', '?'))[:12]}{' (dirty)' if commit.get('dirty') else ''}"
    fig.suptitle(f"{what}\n{' · '.join(facts)}\n{built} · {head}", fontsize="medium")


def load(machine: dict[str, Any], key: str) -> str:
    values = machine.get(key)
    return "/".join(f"{v:.2f}" for v in values) if values else "?"


PICTURES: dict[str, Callable[[dict[str, Any]], Figure]] = {
    "lookup.png": lookup_figure,
    "dispatch.png": dispatch_figure,
    "calls.png": calls_figure,
}
# drawn only when named: their benchmarks are not part of every full run's pictures
ON_REQUEST: dict[str, Callable[[dict[str, Any]], Figure]] = {"faults.png": faults_figure}


def draw(data: dict[str, Any], out: Path, only: list[str] | None = None) -> list[Path]:
    """Writes every picture of ``PICTURES`` (or those named by ``only``, from ``PICTURES``
    and ``ON_REQUEST``) for the run ``data`` into ``out`` (made if missing) and returns their
    paths; raises :class:`MissingGroups` before writing any file when the run lacks what one
    of them needs, ``ValueError`` for a name in ``only`` that is no picture."""
    known = {**PICTURES, **ON_REQUEST}
    unknown = [name for name in only or [] if name not in known]
    if unknown:
        raise ValueError(f"no picture named {', '.join(unknown)}; known: {', '.join(known)}")
    chosen = {name: known[name] for name in only} if only else PICTURES
    figures = {name: make(data) for name, make in chosen.items()}
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fig in figures.items():
        FigureCanvasAgg(fig)
        # no "Software" entry: the bytes depend on the data, not on matplotlib's version string
        fig.savefig(out / name, dpi=110, metadata={"Software": None})
        written.append(out / name)
    return written


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path, help="a --benchmark-json file")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("plots"))
    parser.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help="draw only this picture (repeatable), e.g. faults.png",
    )
    args = parser.parse_args()
    try:
        written = draw(json.loads(args.run.read_text()), args.out, args.only)
    except (MissingGroups, ValueError) as error:
        sys.exit(f"plots.py: {args.run}: {error}")
    for path in written:
        logger.info("wrote %s", path)


if __name__ == "__main__":
    main()
