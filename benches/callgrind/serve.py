"""The bench's stand-in cluster (one PostgreSQL playing six instances), kept running until
SIGTERM; prints its DSN. ``python serve.py WORKTREE``."""

import signal
import sys
import time

sys.path.insert(0, sys.argv[1])  # a worktree: its benches/ and tests/
from benches.picodata_standin import StandinCluster

cl = StandinCluster()
print(cl.dsn, flush=True)
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
try:
    while True:
        time.sleep(3600)
finally:
    cl.close()
