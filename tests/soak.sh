#!/usr/bin/env bash
# Runs the pytest suite RUNS times in a row while a CPU hog keeps every core busy, and stops at
# the first failing run: a race that needs a loaded machine to show shows here, not in CI.
#
# Usage: tests/soak.sh [pytest arguments...]        (`make soak-tests RUNS=20` runs it)
# Environment: RUNS (default 20), PYTHON (default .venv/bin/python), HOGS (busy processes,
# default one per core), RUN_TIMEOUT (seconds one run may take, default 1800). A test still
# running after 300 s has every thread's stack dumped (pytest's faulthandler_timeout), so a
# hang names its test.
set -u

runs=${RUNS:-20}
python=${PYTHON:-.venv/bin/python}
hogs=${HOGS:-$(nproc)}
run_timeout=${RUN_TIMEOUT:-1800}

# A hog spins until its parent (this script) is gone, so even a `kill -9` of the script does not
# leave it burning a core; the trap below ends it at once on every other way out.
hog='import os
parent = os.getppid()
while os.getppid() == parent:
    for _ in range(1_000_000):
        pass'

# pytest runs in the background and the script waits for it, so that a signal to the script
# is handled at once (bash defers traps while a foreground command runs): the EXIT trap then
# ends the run (timeout passes the TERM on to pytest) and the hogs
pids=()
run_pid=
stop() {
    if [[ -n $run_pid ]]; then
        kill "$run_pid" 2>/dev/null
        wait "$run_pid" 2>/dev/null
    fi
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null
    done
    pids=()
}
trap stop EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP

for _ in $(seq "$hogs"); do
    "$python" -c "$hog" &
    pids+=($!)
done

durations=()
summary() {
    local total=0 longest=0 seconds
    for seconds in "${durations[@]}"; do
        total=$((total + seconds))
        ((seconds > longest)) && longest=$seconds
    done
    local mean=$(( ${#durations[@]} ? total / ${#durations[@]} : 0 ))
    echo "soak: $1 of $runs runs passed under $hogs CPU hogs;" \
        "durations ${durations[*]:-none} s (mean $mean s, longest $longest s)"
}

for run in $(seq "$runs"); do
    echo "soak: run $run of $runs"
    started=$SECONDS
    timeout -k 30 "$run_timeout" "$python" -m pytest -q -o faulthandler_timeout=300 "$@" &
    run_pid=$!
    wait "$run_pid"
    status=$?
    run_pid=
    durations+=($((SECONDS - started)))
    if ((status != 0)); then
        summary $((run - 1))
        if ((status == 124)); then
            echo "soak: run $run did not finish within $run_timeout s" >&2
        else
            echo "soak: run $run failed (pytest exit status $status)" >&2
        fi
        exit 1
    fi
done
summary "$runs"
