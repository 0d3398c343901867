"""Discovery: where the pool learns which workers exist."""

from shardline.discovery.event import DiscoveryEvent, DiscoveryEventType

__all__ = ["DiscoveryEvent", "DiscoveryEventType"]
