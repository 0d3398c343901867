"""`EtcdDiscovery`: discovery on an etcd cluster (v3 API), for services beyond one machine."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncGenerator, Sequence
from typing import Any, Unpack

from shardline._extras import requires_extra

with requires_extra("etcd", __name__):
    import grpc
    import grpc.aio
    from aetcd import rpc

from shardline.checks import refusal
from shardline.discovery.etcd_connection import (
    EtcdConnection,
    EtcdOptions,
    Stubs,
    backoff,
    describe,
    namespace_prefix,
    stream_end,
    stream_step,
    stream_write,
)
from shardline.discovery.etcd_watch import Listing, list_range, watch_range
from shardline.discovery.protocol import RecordFilter
from shardline.discovery.record import encode_record, stamped
from shardline.discovery.subscription import RecordFeed, Subscription
from shardline.workers import DiscoveryEvent, DiscoveryEventType, WorkerMetadata

__all__ = ["EtcdDiscovery"]

logger = logging.getLogger("shardline.discovery.etcd")


def _prefix_end(prefix: bytes) -> bytes:
    """The first key after every key that starts with ``prefix`` (which ends in ``/``)."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


class _EtcdPublisher:
    """Puts records under the namespace's prefix, attached to one lease that it keeps alive."""

    def __init__(self, connection: EtcdConnection, prefix: bytes, ttl: int) -> None:
        self._connection = connection
        self._prefix = prefix
        self._ttl = ttl
        # one publish at a time: the calls of one publisher reach etcd in call order, and a
        # lease replacement never interleaves with a put
        self._lock = asyncio.Lock()
        self._lease: int | None = None
        self._granted_ttl = ttl
        # the record last put, by uid: put again (stamped anew) if the lease expires
        self._owned: dict[uuid.UUID, WorkerMetadata] = {}
        self._keeper: asyncio.Task[None] | None = None

    def _key(self, uid: uuid.UUID) -> bytes:
        return self._prefix + str(uid).encode()

    async def publish(self, type: DiscoveryEventType, metadata: WorkerMetadata) -> None:
        if type not in ("worker-added", "worker-updated", "worker-dropped"):
            raise ValueError(f"unknown discovery event type {type!r}")
        key = self._key(metadata.uid)
        if type == "worker-dropped":
            async with self._lock:
                await self._connection.call("kv", "DeleteRange", rpc.DeleteRangeRequest(key=key))
                self._owned.pop(metadata.uid, None)
            return
        value = encode_record(stamped(metadata))
        async with self._lock:
            lease = await self._current_lease()
            try:
                await self._put(key, value, lease)
            except grpc.aio.AioRpcError as error:
                if error.code() != grpc.StatusCode.NOT_FOUND:  # "requested lease not found"
                    raise
                await self._replace_lease(lease)
                await self._put(key, value, await self._current_lease())
            self._owned[metadata.uid] = metadata

    async def _put(self, key: bytes, value: bytes, lease: int) -> None:
        await self._connection.call("kv", "Put", rpc.PutRequest(key=key, value=value, lease=lease))

    async def _current_lease(self) -> int:
        """The lease, granted on first use. Call with the lock held."""
        if self._lease is None:
            self._lease = await self._grant()
        if self._keeper is None:
            self._keeper = asyncio.get_running_loop().create_task(self._keep_alive())
        return self._lease

    async def _grant(self) -> int:
        reply = await self._connection.call(
            "lease", "LeaseGrant", rpc.LeaseGrantRequest(TTL=self._ttl)
        )
        self._granted_ttl = int(reply.TTL)
        return int(reply.ID)

    async def _replace_lease(self, lost: int) -> None:
        """``lost`` expired with our records on it: a new lease, and the records again, except
        those another publisher has registered since, each with a new publish time (a re-put
        is a publish: subscribers see the record appear now). Call with the lock held."""
        if self._lease != lost:
            return
        self._lease = lease = await self._grant()
        logger.warning(
            "lease %x of %d workers expired while etcd was out of reach; registering them again",
            lost,
            len(self._owned),
        )
        for uid, metadata in list(self._owned.items()):
            key = self._key(uid)
            value = encode_record(stamped(metadata))
            absent = rpc.Compare(
                key=key, target=rpc.Compare.CREATE, result=rpc.Compare.EQUAL, create_revision=0
            )
            put = rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease))
            reply = await self._connection.call(
                "kv", "Txn", rpc.TxnRequest(compare=[absent], success=[put])
            )
            if not reply.succeeded:
                del self._owned[uid]

    async def _keep_alive(self) -> None:
        failures = 0
        while not self._connection.closed and self._lease is not None:
            stubs: Stubs | None = None
            lease = self._lease
            try:
                stubs = await self._connection.stubs()
                call = stubs.lease.LeaseKeepAlive(metadata=stubs.metadata)
                ended = stream_end(call)
                try:
                    while lease is not None:
                        await stream_write(call, rpc.LeaseKeepAliveRequest(ID=lease), ended)
                        # not asyncio.wait_for: on Python 3.11 it drops a cancellation that
                        # comes as the read completes, and aclose() then waits forever
                        async with asyncio.timeout(self._connection.timeout):
                            reply = await stream_step(call.read())
                        if reply is grpc.aio.EOF:
                            raise ConnectionError("etcd ended the lease keep-alive stream")
                        if failures:
                            logger.info(
                                "lease %x kept alive again after %d failures", lease, failures
                            )
                            failures = 0
                        if reply.TTL > 0:
                            await asyncio.sleep(self._granted_ttl / 3)
                        else:
                            async with self._lock:
                                await self._replace_lease(lease)
                        lease = self._lease
                finally:
                    call.cancel()
            except Exception as error:
                if failures == 0:
                    logger.warning(
                        "keeping lease %x alive failed (%s); retrying", lease, describe(error)
                    )
                failures += 1
                with contextlib.suppress(Exception):
                    await self._connection.recover(stubs, error)
                await asyncio.sleep(backoff(failures))

    async def aclose(self) -> None:
        async with self._lock:
            keeper, self._keeper = self._keeper, None
            if keeper is not None:
                keeper.cancel()
                # waited for, not awaited: a cancellation of aclose() itself must propagate
                await asyncio.wait((keeper,))
            lease, self._lease = self._lease, None
            self._owned.clear()
            if lease is None or self._connection.closed:
                return
            try:
                await self._connection.call(
                    "lease", "LeaseRevoke", rpc.LeaseRevokeRequest(ID=lease)
                )
            except grpc.aio.AioRpcError as error:
                if error.code() != grpc.StatusCode.NOT_FOUND:  # already expired: nothing to do
                    raise
            except (ConnectionError, PermissionError) as error:
                logger.warning(
                    "could not revoke lease %x (%s); its records expire within %d s",
                    lease,
                    describe(error),
                    self._granted_ttl,
                )


class EtcdDiscovery:
    """Discovery on an etcd cluster: every handle created on the same cluster and
    ``namespace`` sees the same records, and each has its own publisher.

    ``endpoints`` are ``host:port``, ``http://host:port`` or ``https://host:port`` (a list, or
    one string separated by commas); a connection that fails moves to the next. A record lives
    as long as its publisher: one that dies (even by SIGKILL) loses its records within ``ttl``
    seconds (whole seconds; etcd may raise a very short one to its minimum). ``options`` are
    the credentials, TLS files and request ``timeout`` of
    :class:`~shardline.discovery.etcd_connection.EtcdOptions`. Each request is retried across
    endpoints for up to ``timeout`` seconds, then
    ``publish`` raises ``ConnectionError``; credentials or permissions etcd refuses raise
    ``PermissionError``, from ``publish`` and from a subscription's iteration.

    A subscription never ends on its own: across a lost connection or an etcd restart it
    resumes where it stopped, with no change missed or repeated. A record that cannot be read
    counts as absent. ``subscribe`` must be called in a running event loop; ``aclose()``
    withdraws this handle's records, ends its subscriptions and closes the connection.

    Implementation notes
    --------------------
    A record is the key ``/shardline/<namespace>/workers/<uid>``, its value the record's wire
    form (:mod:`shardline.discovery.record`), put with the publisher's lease: the last writer's
    lease owns the key, ``worker-dropped`` deletes it, and closing a publisher revokes its lease,
    which deletes exactly the keys still attached to it. The lease is granted on the first
    publish and kept alive over one stream, every third of its TTL. If it expires anyway (etcd
    unreachable for longer than the TTL), the publisher takes a new one and puts its records
    again, each only if the key is absent, so it never overwrites a newer owner, and each with a
    new publish time: a re-put is a publish.

    A subscription follows the prefix with :func:`~shardline.discovery.etcd_watch.watch_range`
    (a listing, then the changes, resumed after any failure from the revision after the last
    one it applied; its module has the details), its first listing taken when ``subscribe`` is
    called. Each listing, the first and any after a compaction, goes whole to the subscription's
    :class:`RecordFeed`, which emits exactly the differences. Deletions need no previous value:
    the feed holds the last record it showed, which is what ``worker-dropped`` carries.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        namespace: str,
        *,
        ttl: int = 10,
        **options: Unpack[EtcdOptions],
    ) -> None:
        self.prefix = namespace_prefix(namespace, "workers")
        self.namespace = namespace
        if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 1:
            raise refusal(ttl, int)(
                f"ttl must be a whole number of seconds, at least 1, got {ttl!r}"
            )
        self._connection = EtcdConnection(endpoints, **options)
        self._publisher = _EtcdPublisher(self._connection, self.prefix, ttl)

    @property
    def publisher(self) -> _EtcdPublisher:
        return self._publisher

    def subscribe(self, filter: RecordFilter | None = None) -> Subscription:
        feed = RecordFeed(filter)
        # listed now, so that the subscription starts from the records registered at this call
        listing = asyncio.get_running_loop().create_task(self._first_listing())
        return Subscription(self._follow(feed, listing), feed)

    async def _first_listing(self) -> Listing | None:
        try:
            return await list_range(self._connection, self.prefix, _prefix_end(self.prefix))
        except Exception as error:
            # the subscription lists again, and reports, when it is read
            logger.debug("listing %s failed: %s", self.prefix.decode(), describe(error))
            return None

    def _uid(self, key: bytes, feed: RecordFeed | None) -> uuid.UUID | None:
        """The uid ``key`` names; ``None`` (counted in ``feed`` if given) if it names none."""
        text = key[len(self.prefix) :].decode(errors="replace")
        try:
            uid = uuid.UUID(text)
        except ValueError:
            uid = None
        if uid is not None and str(uid) == text:
            return uid
        if feed is not None:
            feed.skipped["malformed"] += 1
            logger.warning("skipped the discovery record at %r: the key names no worker uid", key)
        return None

    def _read(self, feed: RecordFeed, kv: Any) -> tuple[uuid.UUID | None, WorkerMetadata | None]:
        """The uid a key names and its record, each ``None`` (logged, counted) if unreadable."""
        uid = self._uid(kv.key, feed)
        if uid is None:
            return None, None
        return uid, feed.decode(kv.value, origin=kv.key.decode(errors="replace"), uid=uid)

    def _resync(self, feed: RecordFeed, kvs: Sequence[Any]) -> list[DiscoveryEvent]:
        current = {}
        for kv in kvs:
            uid, metadata = self._read(feed, kv)
            if uid is not None and metadata is not None:
                current[uid] = metadata
        return feed.resync(current)

    def _apply(self, feed: RecordFeed, change: Any) -> list[DiscoveryEvent]:
        if change.type == rpc.Event.DELETE:
            uid, metadata = self._uid(change.kv.key, None), None
        else:
            uid, metadata = self._read(feed, change.kv)
        if uid is None:
            return []
        # a record that cannot be read counts as absent, as it does in a listing
        return feed.remove(uid) if metadata is None else feed.put(metadata)

    async def _follow(
        self, feed: RecordFeed, listing: asyncio.Task[Listing | None]
    ) -> AsyncGenerator[DiscoveryEvent, None]:
        batches = watch_range(
            self._connection,
            self.prefix,
            _prefix_end(self.prefix),
            what=self.prefix.decode(),
            logger=logger,
            listing=listing,
        )
        try:
            # closed here, not when collected: a subscription that ends cancels its watch now
            async with contextlib.aclosing(batches):
                async for batch in batches:
                    if isinstance(batch, Listing):
                        for event in self._resync(feed, batch.kvs):
                            yield event
                    else:
                        for change in batch.events:
                            for event in self._apply(feed, change):
                                yield event
        finally:
            listing.cancel()

    async def aclose(self) -> None:
        """Withdraws the records this handle's publisher owns, ends its subscriptions and
        closes the connection."""
        try:
            await self._publisher.aclose()
        finally:
            await self._connection.aclose()
