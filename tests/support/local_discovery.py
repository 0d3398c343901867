"""LocalDiscovery's database written by hand, as a buggy or newer writer might leave it."""

from __future__ import annotations

import sqlite3
import uuid
from contextlib import closing
from pathlib import Path

from support.discovery_contract import WAIT


def write_by_hand(path: Path, rows: list[tuple[uuid.UUID, bytes]]) -> None:
    """What a buggy or newer writer might leave: each record stored and logged as a change."""
    with closing(sqlite3.connect(path, timeout=WAIT, isolation_level=None)) as db:
        db.execute("BEGIN IMMEDIATE")
        for uid, data in rows:
            db.execute(
                "INSERT OR REPLACE INTO records (uid, data, owner) VALUES (?, ?, 0)",
                (uid.bytes, data),
            )
            db.execute("INSERT INTO changes (uid, data) VALUES (?, ?)", (uid.bytes, data))
        db.execute("COMMIT")
