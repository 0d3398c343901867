"""When the client's hot path may skip asyncpg's ``execute``/``fetch``/``fetchrow``/``fetchval``
frames and run a query itself: through private methods, so only on the asyncpg releases whose
code for these methods was checked to be the same.

Implementation notes:
    In asyncpg 0.29 to 0.32 each of the three methods is ``self._check_open()`` (raises
    ``InterfaceError`` if ``is_closed()``) then ``await self._execute(query, args, limit,
    timeout, record_class=...)`` (``limit`` 0 for ``fetch``, 1 for the others), the rows
    returned as they are (``fetch``), or the first row or its first column, None without rows
    (their bodies and ``_execute``'s signature compared across these releases' sources). The
    client's hot path already checks ``is_closed()`` on the connection it pops, so awaiting
    ``_execute`` directly does the same work with one coroutine frame less, resumed at every
    wake-up of the query: about 3,700 instructions fewer per query (benches/RESULTS.md, "the
    driver's frame"). A release outside the list keeps the public methods: nothing breaks
    when asyncpg changes, the hot path only gets slower. ``execute`` with arguments is, in
    these releases, ``_execute(query, args, 0, timeout, return_status=True)`` and the status
    decoded (without arguments it takes the simple-query protocol, never shortened). The client
    calls asyncpg's methods as ``asyncpg.Connection`` defines them, shortcut or not: a
    ``connection_class`` overriding them is not consulted.

    Below ``_execute``, when the statement is in the connection's cache, the query has no
    ``timeout=`` and the connections have no ``command_timeout``, the hot path goes one step
    further and awaits the protocol's ``bind_execute`` with the cached statement itself: what
    ``_execute``, ``__execute``, ``_do_execute`` and ``_get_statement`` come to for such a
    query in these releases (the cache keyed by ``(query, record class, False)``, the
    protocol's record class by default; ``bind_execute(state, args, portal_name, limit,
    return_extra, timeout)``), four coroutine frames fewer, each resumed at every wake-up of
    the query (a routed INSERT's client CPU 0.96x, benches/RESULTS.md, issue 27's throughput
    section). It skips ``_stmt_exclusive_section``, asyncpg's guard against two
    queries on one connection at once, which the client's pools already rule out. What
    ``_do_execute`` does when such a query fails, :func:`after_cache_error` does.
"""

from __future__ import annotations

from typing import Any

from asyncpg.exceptions import InvalidCachedStatementError, OutdatedSchemaCacheError

CACHE_ERRORS = (OutdatedSchemaCacheError, InvalidCachedStatementError)
"""The errors of a cached statement that asyncpg's ``_do_execute`` handles itself."""

CHECKED_RELEASES = frozenset({(0, 29), (0, 30), (0, 31), (0, 32)})
"""asyncpg's (major, minor) releases whose ``execute``, ``fetch*``, ``_execute`` down to the
statement cache's key and ``bind_execute``'s signature were compared."""


def shortcut_allowed(asyncpg_version: str) -> bool:
    """True if the hot path may await ``Connection._execute`` for ``fetch``, ``fetchrow`` and
    ``fetchval``: ``asyncpg_version`` (``asyncpg.__version__``) is a checked release."""
    try:
        release = tuple(int(part) for part in asyncpg_version.split(".")[:2])
    except ValueError:
        return False
    return release in CHECKED_RELEASES


async def after_cache_error(
    connection: Any, error: BaseException, query: str, args: Any, limit: int, status: bool
) -> Any:
    """What asyncpg's ``_do_execute`` does after a cached statement's ``error`` (one of
    :data:`CACHE_ERRORS`) on ``connection``, for a query the hot path ran past it: a type
    changed under the rows (``OutdatedSchemaCacheError``) reloads the schema state and
    raises; a statement whose result type changed (``InvalidCachedStatementError``, after an
    ``ALTER TABLE``) drops the statement caches and, outside a transaction, runs the query once
    more through ``_execute`` (which prepares it afresh, and would itself retry once more where
    asyncpg retries once), else raises. Returns what ``_execute`` returns."""
    if isinstance(error, OutdatedSchemaCacheError):
        await connection.reload_schema_state()
        raise error
    connection._drop_global_statement_cache()
    if connection.is_in_transaction():
        raise error
    return await connection._execute(query, args, limit, None, return_status=status)
