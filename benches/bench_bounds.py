"""A legitimate client's latency while a MessagePack-RPC worker is attacked (issue 26, item 2):
its p99 during each attack against its healthy p99 just before (goal: at most 5x).

One worker process (``tests/transport/bounds_worker.py``, the default ``WorkerLimits``) on
loopback TCP. The legitimate client, in this process, makes one ``echo`` call after another on
a ``MsgpackConnection`` for ``PHASE`` s while nothing else happens (healthy), then for
``PHASE`` s during an attack, and so for each attack: each attack's ratio is to the healthy
phase just before it, so a change in the machine's load (other processes) between the start
and the end of the run weighs less on it. Each attack runs in a process of its own (this module,
``python -m benches.bench_bounds ATTACK HOST PORT SECONDS``), started ``SETTLE`` s before the
client's phase so the phase sees the attack in force, and stopped after it:

- ``cpu_hog``: no attack, a control: a process spinning on a core for the phase, touching no
  socket (on this 2-core machine, the worker, the client and an attacker compete for the
  cores: what that costs the client's p99 whatever the attack is);
- ``never_reads``: 5 sockets, each sending 1,000 pipelined calls for a 1 MB answer and never
  reading;
- ``unfinished_frames``: 50 sockets, each holding a 4 MiB frame 1 KiB short;
- ``idle_sockets``: 1,100 sockets that never say hello;
- ``million_items``: one socket after another, each sending a 4 MB frame of four million
  one-byte ints (the worker closes it at the item bound; the attacker dials again);
- ``calls_flood``: 8 sockets each holding 1,024 calls that never return (the worker-wide
  bound, 4,096, is reached: the client's calls are answered ``busy``, counted as failures);
- ``bad_msgids``: one socket after another, each sending a request of msgid -1;
- ``hello_and_close``: one socket after another, each saying hello, reading the worker's and
  closing: churn that breaks no rule, so ``violation_burst``/``violation_rate`` do not pace
  it (what it costs is measured, as a goal like the others).

The two attacks that dial again and again (``million_items``, ``bad_msgids``) break the
protocol each time, so the worker stops accepting after ``violation_burst`` of them and then
accepts about ``violation_rate`` a second (see docs/msgpack-rpc.md, "Connection churn").

Measured per phase (``extra_info["phases"]``; ``healthy`` is the first healthy phase):
``calls``, ``failures`` (by reason), ``p50_ms``/``p99_ms`` of every call (a failed one
included), ``healthy_p99_ms`` (the healthy phase's just before) and ``p99_ratio`` (to it;
``p99_ratio_to_first``: to the first healthy phase's, as this benchmark measured before), the
worker's resident memory at the phase's end (``rss_mb``) and the CPU seconds it used in the
phase (``worker_cpu_s``); for the attacks that dial again and again, the connections the
attacker made in its ``SETTLE + PHASE`` seconds (``attack_connections``).
``extra_info["goals"]`` judges each attack's ratio against 5. One round of
``benchmark.pedantic`` (the figures are in ``extra_info``).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from .benchkit import process_cpu

PHASE = 5.0
SETTLE = 2.0
GOAL = 5.0
WORKER = Path(__file__).parents[1] / "tests" / "transport" / "bounds_worker.py"
ATTACKS = (
    "cpu_hog",
    "never_reads",
    "unfinished_frames",
    "idle_sockets",
    "million_items",
    "calls_flood",
    "bad_msgids",
    "hello_and_close",
)


# --- the attacks (each in a process of its own) --------------------------------------------


async def _dial(
    host: str, port: int, *, hello: bool = True, receive_buffer: int = 0
) -> socket.socket:
    from shardline.transport.msgpack import wire

    sock = socket.socket()
    if receive_buffer:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (host, port))
    if hello:
        await loop.sock_sendall(sock, wire.hello(1 << 30))
    return sock


def _call(msgid: int, handler: str, payload: Any = None) -> bytes:
    import msgpack  # type: ignore[import-untyped]

    from shardline.transport.msgpack import wire

    return wire.request(msgid, handler, msgpack.packb(payload), None)


async def _hold(socks: list[socket.socket], seconds: float) -> None:
    await asyncio.sleep(seconds)
    for sock in socks:
        sock.close()


async def _again_and_again(
    send: Callable[[socket.socket], Awaitable[None]], host: str, port: int, seconds: float
) -> None:
    """Dials, sends, waits for the worker to close the socket, and again, for ``seconds``;
    prints how many connections it made."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    dialled = 0
    while loop.time() < end:
        sock = await _dial(host, port)
        dialled += 1
        with contextlib.suppress(ConnectionError):
            await send(sock)
            while await loop.sock_recv(sock, 1 << 16):
                pass
        sock.close()
    print(dialled, flush=True)


async def attack(name: str, host: str, port: int, seconds: float) -> None:
    import msgpack

    from shardline.transport.msgpack import wire

    loop = asyncio.get_running_loop()
    if name == "cpu_hog":
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
    elif name == "never_reads":
        flood = b"".join(_call(n, "big") for n in range(1000))
        socks = [await _dial(host, port, receive_buffer=4096) for _ in range(5)]
        for sock in socks:
            await loop.sock_sendall(sock, flood)
        await _hold(socks, seconds)
    elif name == "unfinished_frames":
        frame = wire.request(1, "echo", b"\0" * (4 * 1024 * 1024 - 64), None)[:-1024]
        socks = [await _dial(host, port) for _ in range(50)]
        for sock in socks:
            await loop.sock_sendall(sock, frame)
        await _hold(socks, seconds)
    elif name == "idle_sockets":
        await _hold([await _dial(host, port, hello=False) for _ in range(1100)], seconds)
    elif name == "million_items":
        frame = msgpack.packb([0, 1, wire.DISPATCH, [0] * 4_000_000])

        async def items(sock: socket.socket) -> None:
            await loop.sock_sendall(sock, frame)

        await _again_and_again(items, host, port, seconds)
    elif name == "calls_flood":
        holds = b"".join(_call(n, "hold") for n in range(1024))
        socks = [await _dial(host, port) for _ in range(8)]
        for sock in socks:
            await loop.sock_sendall(sock, holds)
        await _hold(socks, seconds)
    elif name == "bad_msgids":
        bad = msgpack.packb([0, -1, wire.PING, []])

        async def msgid(sock: socket.socket) -> None:
            await loop.sock_sendall(sock, bad)

        await _again_and_again(msgid, host, port, seconds)
    elif name == "hello_and_close":

        async def nothing(sock: socket.socket) -> None:
            await loop.sock_recv(sock, 1 << 16)  # the worker's hello: then close
            with contextlib.suppress(OSError):  # (one the worker reset first)
                sock.shutdown(socket.SHUT_RDWR)

        await _again_and_again(nothing, host, port, seconds)
    else:
        raise ValueError(f"no attack {name!r}")


# --- the legitimate client and the run -----------------------------------------------------


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _phase(connection: Any, seconds: float) -> tuple[list[float], Counter[str]]:
    from shardline import RpcError
    from shardline.transport import Task

    latencies: list[float] = []
    failures: Counter[str] = Counter()
    end = time.perf_counter() + seconds
    while (start := time.perf_counter()) < end:
        try:
            await connection.dispatch(Task("echo", "ping"), timeout=2.0)
        except RpcError as error:
            failures[str(getattr(error, "reason", type(error).__name__))] += 1
        latencies.append(time.perf_counter() - start)
    return latencies, failures


def _summary(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    return {
        "p50_ms": statistics.median(ordered) * 1e3,
        "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3,
    }


async def _run() -> dict[str, Any]:
    from shardline import WorkerMetadata
    from shardline.transport.msgpack import wire
    from shardline.transport.msgpack.connection import MsgpackConnection

    worker = subprocess.Popen(
        [sys.executable, str(WORKER), "{}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert worker.stdout is not None
        address = worker.stdout.readline().decode().strip()
        where = wire.record_address(address)
        assert not isinstance(where, str)
        host, port = where
        record = WorkerMetadata(uid=uuid.uuid4(), address=address, pid=worker.pid, version="")
        connection = MsgpackConnection(record)
        phases: dict[str, Any] = {}
        await _phase(connection, 1.0)  # warm
        for name in (item for attack in ATTACKS for item in ("healthy", attack)):
            attacker = None
            if name != "healthy":
                attacker = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "benches.bench_bounds",
                        name,
                        host,
                        str(port),
                        str(PHASE + SETTLE),
                    ],
                    cwd=Path(__file__).parents[1],
                    stdout=subprocess.PIPE,
                )
                await asyncio.sleep(SETTLE)
            cpu = process_cpu(worker.pid)
            latencies, failures = await _phase(connection, PHASE)
            figures: dict[str, Any] = {
                "calls": len(latencies),
                "failures": dict(failures),
                **_summary(latencies),
                "rss_mb": _rss_mb(worker.pid),
                "worker_cpu_s": process_cpu(worker.pid) - cpu,
            }
            if name == "healthy":
                healthy = figures
                phases.setdefault("healthy", figures)
            else:
                figures["healthy_p99_ms"] = healthy["p99_ms"]
                figures["p99_ratio"] = figures["p99_ms"] / healthy["p99_ms"]
                phases[name] = figures
            if attacker is not None:
                said, _ = attacker.communicate()
                if said.strip():  # the attacks that dial again and again say how often
                    figures["attack_connections"] = int(said)
            # a fresh socket for the next phase, as a client whose socket was closed would dial
            connection.close()
            connection = MsgpackConnection(record)
        connection.close()
    finally:
        worker.terminate()
        worker.wait()
    phases["healthy"].update(healthy_p99_ms=phases["healthy"]["p99_ms"], p99_ratio=1.0)
    for figures in phases.values():
        figures["p99_ratio_to_first"] = figures["p99_ms"] / phases["healthy"]["p99_ms"]
    goals = {
        name: {"p99_ratio": phases[name]["p99_ratio"], "met": phases[name]["p99_ratio"] <= GOAL}
        for name in ATTACKS
        if name != "cpu_hog"
    }
    return {"phases": phases, "goals": goals}


@pytest.mark.benchmark(group="bounds")
def test_a_legitimate_client_during_each_attack(benchmark: Any) -> None:
    from shardline.transport.event_loop import run

    results: dict[str, Any] = {}

    def once() -> None:
        results.update(run(_run()))

    benchmark.pedantic(once, rounds=1, iterations=1)
    benchmark.extra_info.update(results)
    for name, figures in results["phases"].items():
        print(
            f"{name:18} calls {figures['calls']:6d}  p50 {figures['p50_ms']:7.3f} ms"
            f"  p99 {figures['p99_ms']:8.3f} ms  (healthy {figures['healthy_p99_ms']:6.3f})"
            f" x{figures['p99_ratio']:5.2f} (x{figures['p99_ratio_to_first']:5.2f} to the first)"
            f"  rss {figures['rss_mb']:6.0f} MB  cpu {figures['worker_cpu_s']:5.2f} s"
            f"  failures {figures['failures']}"
            f"  attack connections {figures.get('attack_connections', '-')}"
        )


if __name__ == "__main__":
    from shardline.transport.event_loop import run

    run(attack(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])))
