"""`WorkerMetadata`: what discovery says about one worker."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = ["WorkerMetadata"]


@dataclass(frozen=True, slots=True)
class WorkerMetadata:
    """One worker's record, as discovery announces it.

    Identity is ``uid``: two records with the same uid describe the same worker, whatever else
    differs, and the pool never compares or hashes records (only uids).
    """

    uid: uuid.UUID
    address: str
    pid: int
    version: str
    tags: frozenset[str] = frozenset()
    extra: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
