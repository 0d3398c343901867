"""Cost of a ``_pico_bucket`` poll text: peak extra memory on hostile and valid texts, and the
time of a changed and of an unchanged poll.

Memory: a fresh child process (``tests/support/poll_peak_memory.py``, which the tests' bound
uses too) reads the text from a file (as str or bytes), resets its RSS high-water mark
(``/proc/self/clear_refs``), applies the text with ``Topology.apply_bucket_snapshot`` and
reports ``VmHWM`` minus the RSS just before: everything the apply touched on top of the text,
Rust and Python alike (tracemalloc cannot see Rust's allocations). Goal: at most 4x the text.
``--python`` measures another build (e.g. a checkout of the previous release) with the same
texts.

Time: median of repeated calls, per map (ranges of a 3,000- and a 30,000-bucket tier, and a
16 MiB text): a changed text (two texts alternating, so every call replaces the map), the same
through ``BucketPayload`` (read once, then applied), the rows path after ``json.loads`` (what
the text path did before it was read in Rust), and an unchanged text (a distinct but equal
str, recognised without being read).

Run: ``python benches/bench_payload_memory.py [--python PATH]`` on a release build.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

TIER = "t"

PEAK_MEMORY = Path(__file__).parent.parent / "tests" / "support" / "poll_peak_memory.py"


def row(start: int, end: int, owner: int) -> str:
    uuid = f"00000000-0000-0000-0000-{0xA000 + owner:012x}"
    return (
        f'{{"bucket_id_start": {start}, "bucket_id_end": {end}, "current_replicaset_uuid":'
        f' "{uuid}", "target_replicaset_uuid": "{uuid}", "state": "active", "tier_name": "{TIER}"}}'
    )


def rows_text(size: int, *, last: str = "") -> bytes:
    """About ``size`` bytes of one-bucket rows of 8 replicasets, then ``last`` as a final row."""
    per_row = len(row(10**7, 10**7, 1)) + 2  # the longest row: the text stays under ``size``
    rows = [row(n, n, n % 8) for n in range(1, size // per_row + 1)]
    return ("[" + ", ".join([*rows, *([last] if last else [])]) + "]").encode()


HOSTILE: dict[str, Callable[[int], bytes]] = {
    "[{},{},...]": lambda size: b"[" + b"{}," * (size // 3 - 1) + b"{}]",
    "[[[[...]]]]": lambda size: b"[" * (size // 2) + b"]" * (size // 2),
    "valid rows, the last one {}": lambda size: rows_text(size, last="{}"),
    "valid rows": rows_text,
    # a str that is not ASCII has no UTF-8 form in memory until one is made (and kept with it)
    "valid rows, one non-ASCII": lambda size: rows_text(size).replace(
        b"active", "äctive".encode(), 1
    ),
}


def memory(python: str, sizes: list[int]) -> None:
    print("| text | form | size MiB | outcome | peak extra MiB | x text | seconds |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "poll.json"
        for size in sizes:
            for name, make in HOSTILE.items():
                data = make(size << 20)
                path.write_bytes(data)
                del data
                for form in ("str", "bytes"):
                    done = subprocess.run(
                        [python, "-P", PEAK_MEMORY, path, form],
                        capture_output=True,
                        text=True,
                        timeout=600,
                        check=True,
                    )
                    outcome, extra, seconds = done.stdout.split()
                    length = path.stat().st_size
                    print(
                        f"| {name} | {form} | {length / 2**20:.1f} | {outcome}"
                        f" | {int(extra) / 2**20:.1f} | {int(extra) / length:.2f}"
                        f" | {float(seconds):.3f} |",
                        flush=True,
                    )


def median_seconds(call: Callable[[], Any], rounds: int) -> float:
    call()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def time_case(first: str, second: str, rounds: int) -> list[float]:
    """Median seconds of: a changed text, reading a BucketPayload, applying one (changed),
    json.loads then the rows path (changed), an unchanged text."""
    from shardline import Topology
    from shardline.topology.sources import BucketPayload

    topology = Topology()
    topology.apply_tiers({TIER: 2**32 - 1})
    texts = [first, second]
    payloads = [BucketPayload(TIER, first), BucketPayload(TIER, second)]
    copies = [(first + " ")[:-1] for _ in range(8)]  # equal, distinct str, as polls are
    calls = iter(range(1 << 62))

    def changed() -> None:
        assert topology.apply_bucket_snapshot(TIER, texts[next(calls) % 2])

    def applied() -> None:
        assert topology.apply_bucket_snapshot(TIER, payloads[next(calls) % 2])

    def rows_path() -> None:
        assert topology.apply_bucket_snapshot(TIER, json.loads(texts[next(calls) % 2]))

    def unchanged() -> None:
        assert not topology.apply_bucket_snapshot(TIER, copies[next(calls) % 8])

    results = [
        median_seconds(changed, rounds),
        median_seconds(lambda: BucketPayload(TIER, first), rounds),
        median_seconds(applied, rounds),
        median_seconds(rows_path, rounds),
    ]
    topology.apply_bucket_snapshot(TIER, first)
    results.append(median_seconds(unchanged, rounds))
    return results


def layout(buckets: int, ranges: int, shift: int) -> str:
    """A tier of ``buckets`` in ``ranges`` even ranges over 8 replicasets, as poll text."""
    width = buckets // ranges
    rows = [
        row(1 + i * width, buckets if i == ranges - 1 else (i + 1) * width, (i + shift) % 8)
        for i in range(ranges)
    ]
    return "[" + ", ".join(rows) + "]"


def timing() -> None:
    big = rows_text(16 << 20).decode()
    cases = [
        ("3,000 buckets, 256 ranges", layout(3000, 256, 0), layout(3000, 256, 1), 300),
        ("30,000 buckets, 1,024 ranges", layout(30_000, 1024, 0), layout(30_000, 1024, 1), 300),
        (
            f"16 MiB text, {big.count('bucket_id_start'):,} ranges",
            big,
            big.replace("00000000a001", "00000000a009"),
            7,
        ),
    ]
    columns = ["changed text", "BucketPayload()", "apply BucketPayload", "json.loads + rows"]
    print("| map | " + " | ".join([*columns, "unchanged text"]) + " |")
    print("| --- " * (len(columns) + 2) + "|")
    for label, first, second, rounds in cases:
        results = time_case(first, second, rounds)
        print(f"| {label} | " + " | ".join(f"{r * 1e6:,.1f} µs" for r in results) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="the interpreter to measure")
    parser.add_argument("--sizes", default="16,64", help="text sizes in MiB, comma-separated")
    parser.add_argument("--no-timing", action="store_true", help="measure memory only")
    args = parser.parse_args()
    memory(args.python, [int(size) for size in args.sizes.split(",")])
    if not args.no_timing:
        print()
        timing()


if __name__ == "__main__":
    main()
