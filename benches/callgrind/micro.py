"""Micro-changes counted in ir.py's harness (pass `micro` as its third argument):
- sl_bare: InstancePool.take/release without asyncpg's is_closed()/is_in_transaction() (the
  upper bound of what cheaper checks can save);
- sl_protocol: the same checks through asyncpg's protocol object (private attributes:
  `connection._protocol.is_connected()`, `connection._aborted`, `_protocol.is_in_transaction()`).
The pool's methods are patched only for the way being counted."""

import sys

from shardline.picodata import instance_pool

P = instance_pool.InstancePool


def _take_bare(self):
    idle = self._idle
    if idle:
        self.queries += 1
        return idle.pop()
    return None


def _release_bare(self, connection, *, broken=False):
    if broken or self._closing:
        self._discard(connection, terminate=broken)
        return
    waiters = self._waiters
    while waiters:
        waiter = waiters.popleft()
        if not waiter.done():
            waiter.set_result(connection)
            return
    self._idle.append(connection)


def _take_protocol(self):
    idle = self._idle
    while idle:
        connection = idle.pop()
        if not connection._aborted and connection._protocol.is_connected():
            self.queries += 1
            return connection
        self._discard(connection, terminate=True)
    return None


def _release_protocol(self, connection, *, broken=False):
    if broken or self._closing or connection._protocol.is_in_transaction():
        self._discard(connection, terminate=broken)
        return
    waiters = self._waiters
    while waiters:
        waiter = waiters.popleft()
        if not waiter.done():
            waiter.set_result(connection)
            return
    self._idle.append(connection)


def ways(client, raw, q):
    if sys.argv[2] == "sl_bare":
        P.take, P.release = _take_bare, _release_bare
    elif sys.argv[2] == "sl_protocol":
        P.take, P.release = _take_protocol, _release_protocol

    async def sl(c, keys):
        f = client.fetchrow
        for k in keys:
            assert (await f(q, k, key=k))[0] == k

    return {"sl_bare": sl, "sl_protocol": sl}
