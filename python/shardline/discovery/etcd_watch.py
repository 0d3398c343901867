"""`watch_range`: one key range of etcd followed without end, as a listing and then the changes,
resumed across failures. `EtcdDiscovery` and `EtcdRecordStore` both follow their keys with it,
each reading the keys and values in its own way.

Implementation notes
--------------------
A watch lists the range, then watches it from the revision after the listing. It remembers the
last revision whose events it has all handed out (a watch response never splits a revision, so
each response is handed out as one batch of whole revisions) and, after any failure, watches
again from the next one, on the next endpoint and logging in again if needed
(``EtcdConnection.recover``), so that no change is missed or handed out twice. If etcd has
compacted that revision away, it lists the range again: the reader compares that listing with
what it holds and acts on the differences only. Previous values are not requested: a reader
that needs one (say, for a deletion) keeps what it last handed on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Sequence
from dataclasses import dataclass
from typing import Any

from shardline._extras import requires_extra

with requires_extra("etcd", __name__):
    import grpc.aio
    from aetcd import rpc

from shardline.discovery.etcd_connection import (
    EtcdConnection,
    Stubs,
    backoff,
    describe,
    stream_end,
    stream_step,
    stream_write,
)

__all__ = ["Changes", "Listing", "list_range", "watch_range"]


@dataclass(frozen=True)
class Listing:
    """Every key-value (``mvccpb.KeyValue``) in the range at ``revision``: the whole state, which
    replaces what the reader held."""

    kvs: Sequence[Any]
    revision: int


@dataclass(frozen=True)
class Changes:
    """The events (``mvccpb.Event``, in order) of every revision after the previous batch, up to
    and including ``revision``."""

    events: Sequence[Any]
    revision: int


async def list_range(connection: EtcdConnection, key: bytes, range_end: bytes) -> Listing:
    """The keys from ``key`` up to ``range_end`` (excluded), as they are now."""
    request = rpc.RangeRequest(key=key, range_end=range_end)
    reply = await connection.call("kv", "Range", request)
    return Listing(list(reply.kvs), int(reply.header.revision))


async def watch_range(
    connection: EtcdConnection,
    key: bytes,
    range_end: bytes,
    *,
    what: str,
    logger: logging.Logger,
    listing: Awaitable[Listing | None] | None = None,
) -> AsyncGenerator[Listing | Changes, None]:
    """The keys from ``key`` up to ``range_end`` (excluded): a :class:`Listing`, then a
    :class:`Changes` for each watch response with events, and a new :class:`Listing` whenever
    etcd has compacted the history the watch needs (see the module).

    It never ends on its own: failures are logged on ``logger``, naming the range ``what``, and
    retried; closing ``connection`` ends it. A failure that retrying cannot help (see
    ``EtcdConnection.recover``: credentials or permissions etcd refuses raise
    ``PermissionError``) is raised. ``listing``, if given, is a first listing already under way;
    if it gives ``None``, the range is listed again.
    """
    revision: int | None = None  # every event up to this revision is handed out
    failures = 0
    while not connection.closed:
        stubs: Stubs | None = None
        try:
            if revision is None:
                snapshot = None if listing is None else await listing
                listing = None
                if snapshot is None:
                    snapshot = await list_range(connection, key, range_end)
                yield snapshot
                revision = snapshot.revision
            stubs = await connection.stubs()
            watch = stubs.watch.Watch(metadata=stubs.metadata)
            ended = stream_end(watch)
            try:
                create = rpc.WatchCreateRequest(
                    key=key, range_end=range_end, start_revision=revision + 1
                )
                await stream_write(watch, rpc.WatchRequest(create_request=create), ended)
                while True:
                    response = await stream_step(watch.read())
                    if response is grpc.aio.EOF:
                        raise ConnectionError("etcd ended the watch stream")
                    if response.compact_revision:
                        logger.warning(
                            "etcd compacted %s past revision %d; listing again", what, revision
                        )
                        revision = None
                        break
                    if response.canceled:
                        reason = response.cancel_reason or "no reason given"
                        if "permission denied" in reason:
                            raise PermissionError(f"etcd refused the watch: {reason}")
                        raise ConnectionError(f"etcd cancelled the watch: {reason}")
                    if failures:
                        logger.info("watch of %s resumed after revision %d", what, revision)
                        failures = 0
                    if response.events:
                        changes = Changes(
                            list(response.events), int(response.events[-1].kv.mod_revision)
                        )
                        yield changes
                        revision = changes.revision
            finally:
                watch.cancel()
        except Exception as error:
            if connection.closed:
                return
            await connection.recover(stubs, error)
            if failures == 0:
                logger.warning(
                    "watch of %s failed (%s); resuming after revision %s",
                    what,
                    describe(error),
                    revision,
                )
            failures += 1
            await asyncio.sleep(backoff(failures))
