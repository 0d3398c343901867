"""What TLS costs a call (issue 26, item 1): four ways to echo a 40-byte payload to 2 local
worker processes on loopback, interleaved in one run.

Ways (each with 2 worker processes of its own, started once for the module):

- ``floor``: bare length-prefixed frames over asyncio ``Protocol`` objects, no TLS
  (``call_floor.py``, the floor of ``bench_calls.py``: see there);
- ``plaintext``: a ``WorkerProxy`` (round-robin) following 2 ``shardline worker`` processes
  (the demo handlers, MessagePack-RPC over TCP) through ``LocalDiscovery``, with
  ``MsgpackConnection``;
- ``TLS``: the same, the workers started with ``--tls-cert/--tls-key`` (records
  ``msgpack+tls://``), the connections given ``TlsSettings(ca=...)``;
- ``mutual TLS``: the same, the workers also given ``--tls-ca`` and the connections a client
  certificate.

The certificates are ECDSA P-256 (``trustme``'s default), made at the start of the run. The
client and the workers run on uvloop when it is installed (the ``fast`` extra), as
``shardline worker`` does; uvloop's TLS is its own, not asyncio's ``sslproto``. Sockets are
dialled before the timing starts, so the rounds measure calls on established TLS sessions,
not handshakes.

Groups, for each placement of ``placement.py`` (``separate CPUs``, ``one CPU``, ``unpinned``):

``TLS, 1 in flight, {placement}, {loop}``: in each round every way makes a block of 16 calls
one after another, the ways in turn, which goes first rotating from round to round; each call
timed alone. ``by_way``: p50/p99; ``ratios``: per pair of ways, the median over rounds of the
ratio of the two ways' median latencies in that round, with quartiles.

``TLS, 16 in flight, {placement}, {loop}``: in each round every way, in turn, has 16 callers
each make 16 calls one after another. ``by_way``: calls/s (the median round, and quartiles);
``ratios``: the median over rounds of the per-round throughput ratio, with quartiles.

``BENCH_TLS_ROUNDS`` sets the timed rounds of each test (say 3, for a quick check).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import os
import statistics
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pytest_benchmark")
pytest.importorskip("trustme")

import trustme

from shardline.transport.msgpack.connection import MsgpackConnection
from shardline.transport.tls import TlsSettings

from .benchkit import in_turn, percentiles, ratio_summary, timed_rounds
from .call_floor import loop_factory
from .echo_calls import FLOOR_SERVER, floor_way, in_flight, latency_ratio, one_at_a_time, payload
from .placement import PLACEMENTS, placed
from .workerkit import MSGPACK_WORKER, WAIT, Way, start_workers, through_proxy

NEW_LOOP, LOOP = loop_factory()
WORKERS = 2

FLOOR = f"floor: length-prefixed frames, {LOOP}"
PLAIN = "shardline: WorkerProxy + MsgpackConnection, plaintext TCP"
TLS = "shardline: WorkerProxy + MsgpackConnection, TLS"
MUTUAL = "shardline: WorkerProxy + MsgpackConnection, mutual TLS"
NAMES = [FLOOR, PLAIN, TLS, MUTUAL]
PAIRS = [(TLS, PLAIN), (MUTUAL, PLAIN), (TLS, FLOOR), (PLAIN, FLOOR), (MUTUAL, TLS)]

ROUNDS = int(os.environ.get("BENCH_TLS_ROUNDS", 200))
FLIGHT_ROUNDS = int(os.environ.get("BENCH_TLS_ROUNDS", 60))
WARMUP_ROUNDS = 2
SINGLE_CALLS = 16
CALLERS = 16
PER_CALLER = 16
ROUND_WAIT = 60.0


@dataclass
class Stand:
    loop: asyncio.AbstractEventLoop
    ways: dict[str, Way] = field(default_factory=dict)
    pids: dict[str, list[int]] = field(default_factory=dict)

    def run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coroutine, ROUND_WAIT))

    @property
    def all_pids(self) -> list[int]:
        return sorted(itertools.chain(*self.pids.values()))


def certificates(directory: Path) -> tuple[list[str], list[str], TlsSettings, TlsSettings]:
    """The workers' TLS options (server-only, mutual) and the callers' settings for each."""
    ca = trustme.CA()
    server, client = ca.issue_cert("127.0.0.1"), ca.issue_cert("client.example")
    paths = {name: str(directory / name) for name in ("ca", "cert", "key", "ccert", "ckey")}
    ca.cert_pem.write_to_path(paths["ca"])
    server.cert_chain_pems[0].write_to_path(paths["cert"])
    server.private_key_pem.write_to_path(paths["key"])
    client.cert_chain_pems[0].write_to_path(paths["ccert"])
    client.private_key_pem.write_to_path(paths["ckey"])
    for key in ("key", "ckey"):
        os.chmod(paths[key], 0o600)
    serving = ["--tls-cert", paths["cert"], "--tls-key", paths["key"]]
    return (
        serving,
        [*serving, "--tls-ca", paths["ca"]],
        TlsSettings(ca=paths["ca"]),
        TlsSettings(paths["ccert"], paths["ckey"], paths["ca"]),
    )


@pytest.fixture(scope="module")
def stand() -> Iterator[Stand]:
    with contextlib.ExitStack() as stack:
        directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-tls-")))
        serving, mutual, dialling, presenting = certificates(directory)
        floor = stack.enter_context(start_workers(WORKERS, FLOOR_SERVER))
        plain = stack.enter_context(start_workers(WORKERS, MSGPACK_WORKER))
        tls = stack.enter_context(start_workers(WORKERS, (*MSGPACK_WORKER, *serving)))
        both = stack.enter_context(start_workers(WORKERS, (*MSGPACK_WORKER, *mutual)))
        assert all(r.address.startswith("msgpack+tls://") for r in (*tls.records, *both.records))
        loop = NEW_LOOP()
        stack.callback(loop.close)
        stand = Stand(loop)
        for name, workers, make in (
            (FLOOR, floor, functools.partial(floor_way, floor)),
            (PLAIN, plain, functools.partial(through_proxy, plain, MsgpackConnection)),
            (
                TLS,
                tls,
                functools.partial(
                    through_proxy, tls, functools.partial(MsgpackConnection, tls=dialling)
                ),
            ),
            (
                MUTUAL,
                both,
                functools.partial(
                    through_proxy, both, functools.partial(MsgpackConnection, tls=presenting)
                ),
            ),
        ):
            stand.ways[name] = loop.run_until_complete(asyncio.wait_for(make(), WAIT))
            stack.callback(loop.run_until_complete, stand.ways[name].close())
            stand.pids[name] = workers.pids
        for name in NAMES:
            # each way reaches both of its processes (its sockets dialled), and echoes
            assert stand.run(stand.ways[name].whoami()) == set(stand.pids[name]), name
            for n in range(4 * WORKERS):
                sent = payload(99, n)
                assert stand.run(stand.ways[name].call(n, sent))[0] == sent, name
        yield stand


def measure(benchmark: Any, stand: Stand, round_: Any, rounds: int) -> None:
    """``benchkit.timed_rounds`` over every way's worker processes, recording also the loop."""
    timed_rounds(benchmark, round_, rounds, WARMUP_ROUNDS, lambda: stand.all_pids)
    benchmark.extra_info.update(loop=LOOP)


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_tls_1_in_flight(benchmark: Any, stand: Stand, placement: str) -> None:
    latencies: dict[str, list[list[float]]] = {name: [] for name in NAMES}
    numbers = itertools.count()
    turns = itertools.count()

    def round_() -> None:
        for name in in_turn(NAMES, next(turns)):
            block = [payload(0, next(numbers)) for _ in range(SINGLE_CALLS)]
            latencies[name].append(stand.run(one_at_a_time(stand.ways[name], block)))

    benchmark.group = f"TLS, 1 in flight, {placement}, {LOOP}"
    with placed(stand.all_pids, placement):
        measure(benchmark, stand, round_, ROUNDS)
    kept = {name: rounds[-ROUNDS:] for name, rounds in latencies.items()}
    by_way = {name: percentiles(list(itertools.chain(*kept[name]))) for name in NAMES}
    ratios = {
        f"{a} / {b}": latency_ratio(kept[a], kept[b], by_way[a]["p50_ns"], by_way[b]["p50_ns"])
        for a, b in PAIRS
    }
    benchmark.extra_info.update(
        impl="four ways in turn, a block of calls each per round, 1 caller",
        calls_per_round=SINGLE_CALLS * len(NAMES),
        by_way=by_way,
        ratios=ratios,
    )


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_tls_16_in_flight(benchmark: Any, stand: Stand, placement: str) -> None:
    per_s: dict[str, list[float]] = {name: [] for name in NAMES}
    numbers = itertools.count()
    turns = itertools.count()

    def round_() -> None:
        for name in in_turn(NAMES, next(turns)):
            blocks = [
                [payload(c, next(numbers)) for _ in range(PER_CALLER)] for c in range(CALLERS)
            ]
            wall = stand.run(in_flight(stand.ways[name], blocks))
            per_s[name].append(CALLERS * PER_CALLER / wall)

    benchmark.group = f"TLS, 16 in flight, {placement}, {LOOP}"
    with placed(stand.all_pids, placement):
        measure(benchmark, stand, round_, FLIGHT_ROUNDS)
    kept = {name: samples[-FLIGHT_ROUNDS:] for name, samples in per_s.items()}
    by_way = {
        name: {
            "calls_per_s": {"median": statistics.median(kept[name]), **ratio_summary(kept[name])}
        }
        for name in NAMES
    }
    ratios = {
        f"{a} / {b}": ratio_summary([x / y for x, y in zip(kept[a], kept[b], strict=True)])
        for a, b in PAIRS
    }
    benchmark.extra_info.update(
        impl="four ways in turn, 16 callers each per round",
        calls_per_round=CALLERS * PER_CALLER * len(NAMES),
        by_way=by_way,
        ratios=ratios,
    )
