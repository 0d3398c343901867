"""When the client's hot path may skip asyncpg's ``fetch``/``fetchrow``/``fetchval`` frame and
await ``Connection._execute`` itself: a private method, so only on the asyncpg releases whose
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
    when asyncpg changes, the hot path only gets slower. ``execute`` is never shortened (its
    body differs between these releases). The client calls asyncpg's methods as
    ``asyncpg.Connection`` defines them, shortcut or not: a ``connection_class`` overriding
    them is not consulted.
"""

from __future__ import annotations

CHECKED_RELEASES = frozenset({(0, 29), (0, 30), (0, 31), (0, 32)})
"""asyncpg's (major, minor) releases whose ``fetch*`` and ``_execute`` were compared."""


def shortcut_allowed(asyncpg_version: str) -> bool:
    """True if the hot path may await ``Connection._execute`` for ``fetch``, ``fetchrow`` and
    ``fetchval``: ``asyncpg_version`` (``asyncpg.__version__``) is a checked release."""
    try:
        release = tuple(int(part) for part in asyncpg_version.split(".")[:2])
    except ValueError:
        return False
    return release in CHECKED_RELEASES
