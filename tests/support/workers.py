"""Worker records for the pool, balancer, proxy and discovery tests."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from shardline import WorkerMetadata


def worker(n: int, **changes: Any) -> WorkerMetadata:
    """Worker n: uid n, address 127.0.0.1:(5000 + n), pid 100 + n, with ``changes`` applied."""
    record = WorkerMetadata(
        uid=uuid.UUID(int=n), address=f"127.0.0.1:{5000 + n}", pid=100 + n, version="1.0"
    )
    return dataclasses.replace(record, **changes)
