"""`EtcdRecordStore`: the reachability records on an etcd cluster (v3 API), shared by every
replica and reader of a namespace, with the owner guard applied by etcd transactions."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Collection, Iterator, Mapping, Sequence
from typing import Any, Unpack

from shardline._closing import AsyncClosing
from shardline._extras import requires_extra

with requires_extra("etcd", __name__):
    from aetcd import rpc

from shardline.discovery.etcd_connection import EtcdConnection, EtcdOptions, namespace_prefix
from shardline.discovery.etcd_watch import Changes, Listing, watch_range
from shardline.discovery.record import load_document
from shardline.errors import InvalidArgumentType, InvalidRecord
from shardline.registration.checks import (
    check_owner,
    check_service,
    check_services,
    check_text,
)
from shardline.registration.record import Record

__all__ = ["MAX_VALUE_BYTES", "SCHEMA_VERSION", "EtcdRecordStore"]

logger = logging.getLogger("shardline.registration.etcd")

SCHEMA_VERSION = 1
MAX_VALUE_BYTES = 4096
"""The longest stored value (a record with its service, as JSON), in bytes: a longer one is
refused when written, and reads as ``oversized``."""


def _encode(service: str, record: Record) -> bytes:
    """The stored form of ``record``; ``ValueError`` if it would exceed MAX_VALUE_BYTES or a
    str in it is not Unicode text (its JSON escapes would not read back as the same str)."""
    check_text("service", service)
    check_text("owner", record.owner)
    check_text("address", record.address)
    document = {
        "schema": SCHEMA_VERSION,
        "service": service,
        "owner": record.owner,
        "registered": record.registered,
        "address": record.address,
    }
    data = json.dumps(document, separators=(",", ":"), sort_keys=True).encode()
    if len(data) > MAX_VALUE_BYTES:
        raise ValueError(
            f"the record of service {service!r} would take {len(data)} bytes, more than "
            f"{MAX_VALUE_BYTES}: owner or address is too long"
        )
    return data


def _decode(service: str, data: bytes) -> Record:
    """The record stored as ``data`` under ``service``'s key; :class:`InvalidRecord` (with
    ``reason`` ``"oversized"``, ``"malformed"`` or ``"unknown-schema"``) says why it cannot be
    read. It raises nothing else, whatever ``data`` holds."""
    document = load_document(data, "the value", max_bytes=MAX_VALUE_BYTES, schema=SCHEMA_VERSION)
    if document.get("service") != service:
        raise InvalidRecord("malformed", f"it is the record of service {document.get('service')!r}")
    owner = document.get("owner")
    registered = document.get("registered")
    address = document.get("address")
    if owner is not None and not isinstance(owner, str):
        raise InvalidRecord("malformed", f"field 'owner' is not a str or null: {owner!r}")
    if not isinstance(registered, bool):
        raise InvalidRecord("malformed", f"field 'registered' is not a bool: {registered!r}")
    if address is not None and not isinstance(address, str):
        raise InvalidRecord("malformed", f"field 'address' is not a str or null: {address!r}")
    if address is not None and not registered:
        raise InvalidRecord("malformed", f"an address ({address!r}) on an unregistered record")
    return Record(owner=owner, registered=registered, address=address)


class EtcdRecordStore(AsyncClosing):
    """The :class:`~shardline.registration.RecordStore` on an etcd cluster: every store made on
    the same cluster and ``namespace``, in any process on any machine, sees the same records.

    ``endpoints`` are ``host:port``, ``http://host:port`` or ``https://host:port`` (a list, or
    one string separated by commas); a connection that fails moves to the next. ``options``
    are the credentials, TLS files and request ``timeout`` of
    :class:`~shardline.discovery.etcd_connection.EtcdOptions`. ``namespace`` is a non-empty str
    without ``/``.

    The owner guard holds across processes: ``report(service, False, owner)`` is applied only
    if, at the moment it is applied, the record is absent or owned by ``owner``; no concurrent
    ``claim`` or ``report`` slips in between the check and the write. ``claim``,
    ``report(service, True, ...)`` and ``clear`` always apply.

    Failures: each request is retried across endpoints for up to ``timeout`` seconds, then
    raises ``ConnectionError``; credentials or permissions etcd refuses raise
    ``PermissionError``; a retraction that keeps losing races to other writers for ``timeout``
    seconds raises ``TimeoutError``. Arguments are checked before anything is sent
    (``ValueError``, naming the argument), including a record that would not fit in
    :data:`MAX_VALUE_BYTES` (a very long owner or address).

    A stored value that cannot be read (not this version's JSON, malformed, oversized, or
    stored under another service's key — written by something other than this store, or by a
    newer schema) is *not* a record: ``get`` raises :class:`~shardline.errors.InvalidRecord`
    (a ``ValueError``; its ``reason`` is ``"oversized"``, ``"malformed"`` or
    ``"unknown-schema"``), on which a reader falls back to its liveness signal as it does for
    an absent record; ``watch`` logs a warning, counts it in :attr:`skipped` and reports the
    service as ``None`` (it never ends a watch); a retraction (``report(..., False, ...)``)
    cannot prove it owns such a record, so it is dropped (returns ``False``) with a warning;
    ``claim``, ``report(True)`` and ``clear`` replace or remove it.

    ``watch(services)`` yields ``(service, record or None)``: when first iterated, the current
    state of every service named (in the order given, duplicates once), then each change of
    one of them, never a repeat of what it last yielded for that service. It never ends on its
    own: across a lost connection or an etcd restart it resumes where it stopped, with no
    change missed; it ends when the store is closed, and raises ``PermissionError`` if etcd
    refuses it. A store belongs to the event loop it is first used in; ``aclose()`` (or
    ``async with``) closes its connection.

    Implementation notes
    --------------------
    A record is the key ``/shardline/<namespace>/registration/<service>``, its value one JSON
    object, UTF-8, at most :data:`MAX_VALUE_BYTES` and nested at most
    :data:`~shardline.discovery.record.MAX_DEPTH` levels deep (deeper is refused unread)::

        {"schema": 1, "service": "<service>", "owner": "<tag>" | null,
         "registered": true | false, "address": "<host:port>" | null}

    Unknown fields are ignored, so optional fields can be added without a version bump; a
    change older readers must not misread bumps ``schema`` (a JSON integer: ``true`` is not 1).
    Nothing is ever unpickled.

    ``claim`` and ``report(True)`` are plain puts and ``clear`` a delete, so each takes effect
    in one revision. ``report(False)`` is an optimistic compare-and-swap on the key's
    ``mod_revision``, which etcd reports as 0 for an absent key: one transaction
    ``if mod_revision == expected then put(False record) else range(key)``, starting with
    ``expected = 0`` (absent). When it fails, the same transaction returned the current value,
    read at the revision the comparison saw: another owner's record ends the retraction
    (dropped, at that revision); the same owner's is tried again with ``expected`` set to its
    ``mod_revision``; a record already equal to the retraction is left as it is. Whatever
    happens between the read and the write moves ``mod_revision`` and fails the comparison, so
    the guard is decided and the write applied at one revision.

    A put whose reply was lost is retried by the connection, so a write may be applied twice
    within one call (harmless: the same value), and a retraction applied just before a lost
    reply and then overwritten by another writer is reported as dropped.

    A watch follows one key range, from the smallest of the services' keys to the largest,
    with :func:`~shardline.discovery.etcd_watch.watch_range` (a listing, then the changes,
    resumed after any failure from the revision after the last one it yielded; its module has
    the details), and keeps the keys of the services asked for. After a listing, the first or
    one after a compaction, it yields only the services whose record differs from what it last
    yielded.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        namespace: str,
        **options: Unpack[EtcdOptions],
    ) -> None:
        self.prefix = namespace_prefix(namespace, "registration")
        self.namespace = namespace
        self._connection = EtcdConnection(endpoints, **options)
        self._skipped: Counter[str] = Counter()

    @property
    def skipped(self) -> Mapping[str, int]:
        """How many stored values this store's watches could not read and reported as absent,
        by :class:`~shardline.errors.InvalidRecord` reason."""
        return self._skipped

    def key(self, service: str) -> bytes:
        """The etcd key holding ``service``'s record."""
        return self.prefix + check_service(service).encode()

    # writes

    async def claim(self, service: str, owner: str | None) -> None:
        """Replaces the record with ``Record(owner, registered=False)``, unconditionally."""
        key = self.key(service)
        value = _encode(service, Record(owner=check_owner(owner), registered=False))
        await self._put(key, value)

    async def report(
        self, service: str, registered: bool, owner: str | None, address: str | None = None
    ) -> bool:
        """``True``: the record becomes ``Record(owner, True, address)``, always. ``False``:
        the record becomes ``Record(owner, False)`` unless it exists and belongs to another
        owner; returns whether it was applied."""
        key = self.key(service)
        check_owner(owner)
        if not isinstance(registered, bool):
            raise InvalidArgumentType(f"registered must be a bool, got {registered!r}")
        if address is not None and not isinstance(address, str):
            raise InvalidArgumentType(f"address must be a str or None, got {address!r}")
        if not registered and address is not None:
            raise ValueError(f"an unregistered record has no address, got {address!r}")
        record = Record(owner=owner, registered=registered, address=address)
        value = _encode(service, record)
        if registered:
            await self._put(key, value)
            return True
        return await self._retract(service, key, record, value)

    async def _put(self, key: bytes, value: bytes) -> None:
        await self._connection.call("kv", "Put", rpc.PutRequest(key=key, value=value))

    async def _retract(self, service: str, key: bytes, record: Record, value: bytes) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._connection.timeout
        put = rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value))
        read = rpc.RequestOp(request_range=rpc.RangeRequest(key=key))
        expected = 0  # the mod_revision the key is believed to have; 0: absent
        while True:
            unchanged = rpc.Compare(
                key=key, target=rpc.Compare.MOD, result=rpc.Compare.EQUAL, mod_revision=expected
            )
            reply = await self._connection.call(
                "kv", "Txn", rpc.TxnRequest(compare=[unchanged], success=[put], failure=[read])
            )
            if reply.succeeded:
                return True
            kvs = reply.responses[0].response_range.kvs
            if not kvs:  # deleted since it was read
                expected = 0
            else:
                kv = kvs[0]
                try:
                    current = _decode(service, kv.value)
                except InvalidRecord as error:
                    logger.warning(
                        "dropped the retraction of %r by owner %r: the stored record cannot be "
                        "read (%s), so its owner is unknown",
                        service,
                        record.owner,
                        error,
                    )
                    return False
                if current.owner != record.owner:
                    logger.debug(
                        "dropped the retraction of %r by owner %r: the record belongs to %r",
                        service,
                        record.owner,
                        current.owner,
                    )
                    return False
                if current == record:
                    return True  # already what the retraction would write
                expected = int(kv.mod_revision)
            if loop.time() >= deadline:
                raise TimeoutError(
                    f"the retraction of {service!r} by owner {record.owner!r} lost every race "
                    f"to other writers for {self._connection.timeout} s"
                )

    async def clear(self, service: str) -> None:
        """Removes the record (undeploy): ``get`` answers ``None`` until the next write."""
        await self._connection.call(
            "kv", "DeleteRange", rpc.DeleteRangeRequest(key=self.key(service))
        )

    # reads

    async def get(self, service: str) -> Record | None:
        """The record, or ``None`` if there is none; :class:`InvalidRecord` if the stored value
        cannot be read."""
        key = self.key(service)
        reply = await self._connection.call("kv", "Range", rpc.RangeRequest(key=key))
        if not reply.kvs:
            return None
        try:
            return _decode(service, reply.kvs[0].value)
        except InvalidRecord as error:
            raise InvalidRecord(
                error.reason,
                f"the registration record of {service!r} at {key.decode(errors='replace')} "
                f"cannot be read: {error}",
            ) from None

    def watch(self, services: Collection[str]) -> AsyncIterator[tuple[str, Record | None]]:
        """The current state of each of ``services``, then every change (see the class)."""
        names = check_services(services)
        return self._follow(names)

    def _readable(self, service: str, kv: Any) -> Record | None:
        try:
            return _decode(service, kv.value)
        except InvalidRecord as error:
            self._skipped[error.reason] += 1
            logger.warning(
                "the registration record of %r at revision %d cannot be read (%s); "
                "reporting it as absent",
                service,
                kv.mod_revision,
                error,
            )
            return None

    def _states(
        self, services: dict[bytes, str], batch: Listing | Changes
    ) -> Iterator[tuple[str, Record | None]]:
        """What ``batch`` says of the ``services`` (key → name) watched: after a listing, the
        state of each, in their order; after changes, the state each event leaves its service
        in, in order."""
        if isinstance(batch, Changes):
            for change in batch.events:
                name = services.get(change.kv.key)
                if name is not None:
                    deleted = change.type == rpc.Event.DELETE
                    yield name, None if deleted else self._readable(name, change.kv)
            return
        current: dict[str, Record | None] = dict.fromkeys(services.values())
        for kv in batch.kvs:
            name = services.get(kv.key)
            if name is not None:
                current[name] = self._readable(name, kv)
        yield from current.items()

    async def _follow(
        self, names: tuple[str, ...]
    ) -> AsyncGenerator[tuple[str, Record | None], None]:
        services = {self.key(name): name for name in names}
        shown: dict[str, Record | None] = {}  # what was last yielded, by service
        batches = watch_range(
            self._connection,
            min(services),
            max(services) + b"\0",
            what=f"the registration records of {self.namespace}",
            logger=logger,
        )
        # closed here, not when collected: a watch that ends cancels its etcd watch now
        async with contextlib.aclosing(batches):
            async for batch in batches:
                for name, record in self._states(services, batch):
                    if name not in shown or shown[name] != record:
                        shown[name] = record
                        yield name, record

    # lifetime

    async def aclose(self) -> None:
        """Closes the connection; watches end, and later calls raise ``RuntimeError``."""
        await self._connection.aclose()
