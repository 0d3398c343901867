"""Reachability records that reconverge on the truth: a replica re-asserts its service's record
after each successful probe, so a successor that never came up cannot pin it wrong."""

from shardline.registration.record import Record, RecordStore

__all__ = ["Record", "RecordStore"]
