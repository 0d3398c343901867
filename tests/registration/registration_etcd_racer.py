"""A replica process for the racing tests: runs programs of record operations against an
EtcdRecordStore, one program per round, started on a signal so that two racers run together.

    python registration_etcd_racer.py ENDPOINT NAMESPACE

Each round reads one JSON line ``{"service": NAME, "ops": [OP, ...]}`` from stdin, where an OP is
``["claim", owner]``, ``["report", registered, owner, address]``, ``["get"]`` or
``["sleep", milliseconds]``; reads the record once (so the channel is open), prints ``ready``,
waits for a line ``go``, runs the ops in order and prints one JSON line with each op's outcome:
``null`` for a claim or a sleep, ``true``/``false`` for a report, and for a get the record as
``[owner, registered, address]`` or ``null``. It exits when stdin closes.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from shardline.registration.etcd_store import EtcdRecordStore


def line() -> str:
    return sys.stdin.readline()


async def run(store: EtcdRecordStore, service: str, op: list[Any]) -> Any:
    kind = op[0]
    if kind == "claim":
        await store.claim(service, op[1])
        return None
    if kind == "report":
        return await store.report(service, op[1], op[2], op[3])
    if kind == "get":
        record = await store.get(service)
        return None if record is None else [record.owner, record.registered, record.address]
    if kind == "sleep":
        # a scripted pause, the thing the scenario varies: where the racers' calls interleave
        await asyncio.sleep(op[1] / 1000)
        return None
    raise ValueError(f"unknown op {op!r}")


async def main(endpoint: str, namespace: str) -> None:
    async with EtcdRecordStore([endpoint], namespace, timeout=10) as store:
        while program := await asyncio.to_thread(line):
            round_ = json.loads(program)
            service = round_["service"]
            await store.get(service)
            print("ready", flush=True)
            if (await asyncio.to_thread(line)).strip() != "go":
                return
            outcomes = [await run(store, service, op) for op in round_["ops"]]
            print(json.dumps(outcomes), flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:3]))
