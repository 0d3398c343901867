"""Instructions per query (callgrind) for one way: 16 callers x 200
`fetchrow("SELECT $1::bigint", k)` (issue 11; outside the suite).

`serve.py WORKTREE` starts the bench's stand-in cluster and prints its DSN; `count.sh VENV DSN
WAY [VARIANT_MODULE]` counts one way (a variant module adds ways: `ways(client, raw, query) ->
{name: fn}`); per query = (WAY - empty) / 3200.

Run under `valgrind --tool=callgrind --toggle-collect=functools_reduce`: only the counted section
(one run_until_complete, called through functools.reduce) is collected. Ways: raw, wrapped (raw
behind one coroutine with the client's signature), shardline (fetchrow(..., key=k)), empty (the
section with no queries). Checks every result and that no connection opened in the section.
"""

import asyncio
import functools
import sys

import asyncpg

import shardline.picodata as sp

Q = "SELECT $1::bigint"
CALLERS, PER = 16, 200
dsn, way = sys.argv[1], sys.argv[2]
_NO = object()
loop = asyncio.new_event_loop()
client = loop.run_until_complete(
    sp.connect(dsn, tier="default", poll_interval=3600, acquire_timeout=120)
)
raw = [loop.run_until_complete(asyncpg.connect(dsn)) for _ in range(CALLERS)]


async def wrapper(
    conn, query, *args, key=_NO, read_only=False, strict=None, timeout=None, **options
):
    return await conn.fetchrow(query, *args)


async def w_raw(c, keys):
    conn = raw[c]
    for k in keys:
        assert (await conn.fetchrow(Q, k))[0] == k


async def w_wrapped(c, keys):
    conn = raw[c]
    for k in keys:
        assert (await wrapper(conn, Q, k, key=k))[0] == k


async def w_sl(c, keys):
    f = client.fetchrow
    for k in keys:
        assert (await f(Q, k, key=k))[0] == k


async def w_empty(c, keys):
    pass


WAYS = {"raw": w_raw, "wrapped": w_wrapped, "shardline": w_sl, "empty": w_empty}
extra = sys.argv[3] if len(sys.argv) > 3 else None
if extra:  # a variant harness module adding ways: extra.ways(client, raw, Q) -> {name: fn}
    import importlib

    WAYS.update(importlib.import_module(extra).ways(client, raw, Q))
fn = WAYS[way]


def blocks(seed):
    return [[(seed * 7919 + c * PER + i) % 4096 for i in range(PER)] for c in range(CALLERS)]


async def flight(f, seed):
    await asyncio.gather(*(f(c, b) for c, b in enumerate(blocks(seed))))


# warm-up: every master's pool filled (16 queries overlapping on each), then every path run
masters = {}
for k in range(4096):
    masters.setdefault(id(client._route("default", k)), k)


async def fill():
    await asyncio.gather(
        *(client.fetchval("SELECT pg_sleep(2)", key=k) for k in masters.values() for _ in range(16))
    )


loop.run_until_complete(fill())
for seed in range(3):  # warm-up: every connection opened, every code path run
    for f in (w_sl, w_raw, fn):
        loop.run_until_complete(flight(f, seed))
connects = sum(p.connects for p in client.stats().pools.values())
functools.reduce(lambda _a, _b: loop.run_until_complete(flight(fn, 5)), [0, 1])
assert sum(p.connects for p in client.stats().pools.values()) == connects, (
    "a connect in the section"
)
loop.run_until_complete(client.close())
for r in raw:
    loop.run_until_complete(r.close())
print("ok", way, connects, flush=True)
