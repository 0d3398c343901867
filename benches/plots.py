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
  flight, one panel per placement, each way a curve (its ``by_way[...]["cdf_ns"]``).

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

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

logger = logging.getLogger("shardline.benches.plots")

LOOKUP = re.compile(r"lookup (\d+)b-(\d+)r")
PROXY = re.compile(r"proxy dispatch overhead, ([\d,]+) workers")
POOL = re.compile(r"pool (.+), ([\d,]+) workers")
CALLS = re.compile(r"calls end to end, 1 in flight, (.+)")
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
        ax.set_xscale("log", base=2)
    axes[0].set_ylabel("ns per call, median (log scale)")
    axes[0].set_yscale("log")
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
    left.set_ylabel("µs per dispatch, median")
    left.set_ylim(bottom=0)
    curves(right, [p for op in sorted(operations) for p in operations[op]])
    right.set_title("the pool's operations")
    right.set_ylabel("ns per operation, median (log scale)")
    right.set_yscale("log")
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_xlabel("workers in the pool (log scale)")
        ax.legend(fontsize="x-small")
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
    axes = fig.subplots(1, len(order), sharey=True, squeeze=False)[0]
    for ax, placement in zip(axes, order, strict=True):
        info = placements[placement]
        for way, figures in info["by_way"].items():
            if not isinstance(figures, dict):  # "not available": the run could not reach it
                continue
            if "cdf_ns" not in figures:
                raise MissingGroups(
                    "calls.png", f"by_way[{way!r}]['cdf_ns'] ({placement})", "bench_calls.py"
                )
            percents, ns = zip(*figures["cdf_ns"], strict=True)
            color, line = style(way)
            ax.plot([v / 1e3 for v in ns], percents, color=color, linestyle=line, label=way)
        ax.set_title(f"{placement}, {info.get('loop', '?')}")
        ax.set_xscale("log")
        ax.set_xlabel("latency of one call, µs (log scale)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("calls at or below, %")
    axes[0].set_ylim(0, 100)
    axes[-1].legend(fontsize="x-small", loc="lower right")
    title(fig, data, "End-to-end call latency, 1 in flight, 2 worker processes on loopback")
    return fig


def curves(ax: Axes, found: list[Point]) -> None:
    """One line per implementation through its sizes, the quartiles as error bars."""
    by_impl: dict[str, list[Point]] = {}
    for point in found:
        by_impl.setdefault(point.impl, []).append(point)
    for impl in sorted(by_impl, key=impl_order):
        line = sorted(by_impl[impl], key=lambda p: p.size)
        color, dash = style(impl)
        ax.errorbar(
            [p.size for p in line],
            [p.median for p in line],
            yerr=[[p.median - p.q1 for p in line], [p.q3 - p.median for p in line]],
            color=color,
            linestyle=dash,
            marker="o",
            markersize=4,
            capsize=3,
            label=impl,
        )
    ax.grid(True, which="both", alpha=0.3)


def impl_order(impl: str) -> tuple[int, str]:
    """Floors first, then shardline, then the peers: the legend reads in that order."""
    for rank, prefix in enumerate(("floor", "ref", "shardline", "picopyn", "wool")):
        if impl.startswith(prefix):
            return rank, impl
    return 9, impl


PEER_COLORS = ("tab:red", "tab:orange", "tab:brown", "tab:pink")
OURS_COLORS = ("tab:blue", "tab:cyan", "tab:purple", "navy")
_colors: dict[str, str] = {}


def style(impl: str) -> tuple[str, str]:
    """(color, line style): shardline in blues, the peers in reds, floors gray and dotted; the
    same name always gets the same color within one process, whichever figure asks first."""
    if impl.startswith(("floor", "ref")):
        return ("0.35" if impl.startswith("floor") else "0.65"), ":"
    family = OURS_COLORS if impl.startswith("shardline") else PEER_COLORS
    if impl not in _colors:
        taken = sum(1 for name, color in _colors.items() if color in family)
        _colors[impl] = family[taken % len(family)]
    dash = "--" if "wool" in impl and "shardline" not in impl else "-"
    return _colors[impl], dash


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


def draw(data: dict[str, Any], out: Path) -> list[Path]:
    """Writes every picture of ``PICTURES`` for the run ``data`` into ``out`` (made if
    missing) and returns their paths; raises :class:`MissingGroups` before writing any file
    when the run lacks what one of them needs."""
    figures = {name: make(data) for name, make in PICTURES.items()}
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
    args = parser.parse_args()
    try:
        written = draw(json.loads(args.run.read_text()), args.out)
    except MissingGroups as error:
        sys.exit(f"plots.py: {args.run}: {error}")
    for path in written:
        logger.info("wrote %s", path)


if __name__ == "__main__":
    main()
