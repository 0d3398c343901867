"""shardline for Picodata: routed SQL over pgwire.

Only re-exports (the client lives beside it, one concept per file).
"""

from __future__ import annotations

from shardline.picodata.sharding_keys import ShardingKey, TableDistribution

__all__ = ["ShardingKey", "TableDistribution"]
