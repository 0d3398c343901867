"""What applying one ``_pico_bucket`` poll text costs in memory, measured in a fresh interpreter:
``tests/topology/test_bucket_payload.py`` holds it to a bound, ``benches/bench_payload_memory.py``
reports it (also for another build's interpreter).

    python -P tests/support/poll_peak_memory.py POLL_FILE str|bytes

reads the text (decoded to str, or as bytes), resets the RSS high-water mark
(``/proc/self/clear_refs``), applies it to tier "t" with ``Topology.apply_bucket_snapshot`` and
prints ``OUTCOME EXTRA SECONDS``: ``applied``, ``unchanged`` or ``rejected``; ``VmHWM`` minus the
RSS just before, in bytes (Rust's allocations and Python's alike: tracemalloc sees only
Python's); the apply's seconds.

It is a script, not a module: the measurement needs a process holding nothing else (``-P``:
nothing of this folder shadows what shardline imports).
"""

import gc
import re
import sys
import time

from shardline import InvalidEvent, Topology


def status(field: str) -> int:
    with open("/proc/self/status") as file:
        text = file.read()
    found = re.search(field + r":\s+(\d+) kB", text)
    assert found is not None, field
    return int(found.group(1)) * 1024


with open(sys.argv[1], "rb") as poll:
    data = poll.read()
text = data.decode() if sys.argv[2] == "str" else data
del data
topology = Topology()
topology.apply_tiers({"t": 2**32 - 1})
gc.collect()
with open("/proc/self/clear_refs", "w") as clear_refs:
    clear_refs.write("5")  # the high-water mark restarts from here
base = status("VmRSS")
start = time.perf_counter()
try:
    outcome = "applied" if topology.apply_bucket_snapshot("t", text) else "unchanged"
except InvalidEvent:
    outcome = "rejected"
sys.stdout.write(f"{outcome} {status('VmHWM') - base} {time.perf_counter() - start}\n")
