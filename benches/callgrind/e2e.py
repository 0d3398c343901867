"""Alternates two builds of shardline on the end-to-end benchmark of issue 11.

``python e2e.py MAIN_WORKTREE BRANCH_WORKTREE PAIRS TAG OUT_DIR``: runs ``pytest
benches/bench_picodata_client.py -k "16_in_flight and separate"`` in each worktree (with its own
``.venv`` and release build), main first in odd pairs and the branch first in even ones, and
prints per run the ratio "shardline / floor, throughput" (median of per-round ratios), the
client CPU per call of each way, and the cores other processes kept busy (the machine's busy
time during the run less the run's own, its server included).
"""

import json
import os
import resource
import subprocess
import sys
import time

main_wt, branch_wt, pairs, tag, out_dir = sys.argv[1:6]
WT = {"main": main_wt, "branch": branch_wt}


def busy() -> float:
    with open("/proc/stat") as stat:
        fields = list(map(int, stat.readline().split()[1:]))
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


for p in range(1, int(pairs) + 1):
    for who in ["main", "branch"] if p % 2 else ["branch", "main"]:
        out = f"{out_dir}/{tag}-{p}-{who}.json"
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        b0, t0 = busy(), time.time()
        subprocess.run(
            [
                f"{WT[who]}/.venv/bin/pytest",
                "benches/bench_picodata_client.py",
                "-p",
                "no:cacheprovider",
                "--benchmark-only",
                "-k",
                "16_in_flight and separate",
                "-q",
                f"--benchmark-json={out}",
            ],
            cwd=WT[who],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        wall = time.time() - t0
        own = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        others = (busy() - b0 - own) / wall
        with open(out) as saved:
            info = json.load(saved)["benchmarks"][0]["extra_info"]
        ratio = info["ratios"]["shardline / floor, throughput"]["median"]
        cpu = {
            name.split(":")[0]: round(way["client_cpu_us_per_call"], 2)
            for name, way in info["by_way"].items()
        }
        print(f"pair {p} {who:6} ratio {ratio:.3f} others {others:.2f} cpu_us {cpu}", flush=True)
