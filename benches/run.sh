#!/usr/bin/env sh
# Runs the benchmark suite on the shardline installed in the current Python (build it with
# `maturin develop --release` first) and rewrites the generated part of benches/RESULTS.md.
# RUNS=3 runs it three times back to back: RESULTS.md reports the first run in full and adds the
# goals' numbers of the others, to show the spread. Extra arguments go to pytest (`-k lookup`).
# SHARDLINE_BUILD, if set, is printed in RESULTS.md as the build measured (e.g. "release wheel of
# commit abc123"), next to the extension's file and build time. A full run (no extra arguments) also
# redraws the pictures of benches/plots/ (benches/plots.py, the `plot` extra).
set -eu
cd "$(dirname "$0")/.."
python=${PYTHON:-python}
runs=${RUNS:-1}
mkdir -p .benchmarks
files=""
i=1
while [ "$i" -le "$runs" ]; do
    json=".benchmarks/run-$i.json"
    "$python" -m pytest benches -p no:cacheprovider --benchmark-only \
        --benchmark-columns=median,iqr,rounds --benchmark-json="$json" "$@"
    files="$files $json"
    i=$((i + 1))
done
# shellcheck disable=SC2086
"$python" benches/report.py $files --write benches/RESULTS.md >/dev/null
echo "tables written to benches/RESULTS.md (raw data:$files)"
# The pictures need the groups of bench_lookup.py, bench_pool.py and bench_calls.py, which a run
# narrowed by pytest arguments may lack: only a full run redraws them (from its first run).
if [ "$#" -eq 0 ]; then
    "$python" benches/plots.py .benchmarks/run-1.json --out benches/plots
else
    echo "pictures in benches/plots/ left as they were: pytest arguments given ($*)"
fi
