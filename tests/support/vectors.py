"""The shared ``bucket_id`` vectors (tests/data, copied verbatim from shared/data): the Picodata
driver's and vshard's own unit test, with each key part read back into its Python value."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from support.paths import DATA

PICODATA: list[dict[str, Any]] = json.loads((DATA / "bucket_id_picodata_vectors.json").read_text())[
    "vectors"
]
VSHARD: list[dict[str, Any]] = json.loads((DATA / "bucket_id_vshard_vectors.json").read_text())[
    "vectors"
]

_CONVERT: dict[str, Callable[[Any], Any]] = {
    "int": int,
    "str": str,
    "bool": bool,
    "null": lambda _: None,
    "float": float,
    "decimal": Decimal,
    "datetime": dt.datetime.fromisoformat,
    "uuid": uuid.UUID,
}


def key_part(part: dict[str, Any]) -> Any:
    """A vector's key part (``{"type": ..., "value": ...}``) as the Python value it stands for."""
    return _CONVERT[part["type"]](part["value"])
