"""Instructions a MessagePack-RPC worker process retires per echo call, under callgrind.

``python worker_ir.py VENV [N]``: starts ``echo_worker.py`` in ``VENV``'s interpreter under
callgrind twice, makes N (default 1,000) and then 3N echo calls of a 40-character str to it,
one at a time over one socket (this interpreter's shardline writes the requests), and prints
the difference of the two totals per call: the worker's whole process (the event loop, the
system call wrappers, the decoding, the handler) with its start-up and shutdown cancelled
out. Callgrind counts are deterministic, so two builds compare without alternating."""

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from shardline.transport.msgpack import wire

WORKER = Path(__file__).with_name("echo_worker.py")


def total_instructions(venv: str, calls: int) -> int:
    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "callgrind.out")
        worker = subprocess.Popen(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}",
                f"{venv}/bin/python",
                str(WORKER),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert worker.stdin is not None
        assert worker.stdout is not None
        address = worker.stdout.readline().decode().strip()
        host, port = address.rsplit("//", 1)[1].rsplit(":", 1)
        with socket.create_connection((host, int(port))) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            decoder = wire.FrameDecoder(1 << 22, "answers")
            sock.sendall(wire.hello(1 << 22, time.monotonic()))
            payload = wire.pack_value("x" * 40, "the payload", "echo")
            for msgid in range(calls):
                sock.sendall(wire.request(msgid, "echo", payload, 20.0, time.monotonic() + 20.0))
                answered = False
                while not answered:
                    for message in decoder.feed(sock.recv(65536)):
                        answered |= not (
                            isinstance(message, list) and message[0] == wire.NOTIFICATION
                        )
        worker.stdin.close()
        worker.wait()
        for line in Path(out).read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError(f"no total in callgrind's output for {venv}")


if __name__ == "__main__":
    venv, calls = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    few, many = total_instructions(venv, calls), total_instructions(venv, 3 * calls)
    print(f"{venv}: {(many - few) / (2 * calls):,.0f} instructions per call")
