async def _noop(): pass
def ways(client, raw, Q):
    async def sl_timeout(c, keys):
        f = client.fetchrow
        for k in keys:
            assert (await f(Q, k, key=k, timeout=5.0))[0] == k
    async def raw_timeout(c, keys):
        conn = raw[c]
        for k in keys:
            assert (await conn.fetchrow(Q, k, timeout=5.0))[0] == k
    return {"sl_timeout": sl_timeout, "raw_timeout": raw_timeout}
