"""The worker process a :class:`~shardline.transport.LocalPool` starts.

``python -m shardline.transport.local.worker --handlers MODULE:ATTRIBUTE --namespace NS
--directory DIR --transport msgpack --address ADDRESS --uid UID --grace SECONDS
[--max-frame-bytes N] [--tls-cert PEM --tls-key PEM [--tls-ca PEM]] [--limit NAME=VALUE ...]``
imports the mapping of handler names to handlers at ``MODULE:ATTRIBUTE``, serves it at
``ADDRESS`` (a Unix socket's path or loopback ``host:port``) over the named transport, refusing
messages over ``N`` bytes (:data:`~shardline.transport.MAX_MESSAGE_BYTES` by default; with TLS
when given the files of a :class:`~shardline.transport.tls.TlsSettings`) and announces the
worker through ``LocalDiscovery(NS, directory=DIR)`` with the record uid ``UID``. It runs until
SIGTERM, or until its standard input reaches end of file, which is how it learns that the
process that started it is gone: it then withdraws its record and stops like on SIGTERM (calls
in flight get ``--grace`` seconds), and exits at the latest ``--grace`` plus 5 seconds after the
end of file even if a handler does not return. A handlers spec that cannot be loaded is logged
(naming the spec and the import error) and the process exits with status 2, before it serves
anything. Its log goes to standard error.

This is an internal entry point of ``LocalPool``, not a command for users (``shardline
worker --handlers`` is theirs); the transports it can serve over are
:data:`shardline.transport.TRANSPORTS`. It is imported by nothing: ``python -m``
runs a module that its package has not imported already.

Implementation notes: the parent holds the only write end of the child's standard input and
never writes to it, so the kernel closes it when the parent exits in any way, SIGKILL
included, and a thread blocked reading it sees end of file. That works on every platform and
has no race with a parent that dies while the child starts (the read returns at once). Linux's
``prctl(PR_SET_PDEATHSIG)`` was not chosen: it exists only on Linux, and it fires when the
*thread* that forked the child exits, not the process. The pipe's limit: a process forked from
the parent without ``exec`` (``multiprocessing`` with the ``fork`` start method) inherits the
write end, and the workers outlive the parent until that process exits too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping

from shardline.discovery.local import LocalDiscovery
from shardline.discovery.protocol import Discovery
from shardline.transport.event_loop import run
from shardline.transport.handlers_spec import HandlersSpecError, load_handlers
from shardline.transport.limits import WorkerLimits
from shardline.transport.schemes import TRANSPORTS, serve
from shardline.transport.serving import Handler
from shardline.transport.task import MAX_MESSAGE_BYTES
from shardline.transport.tls import TlsSettings

__all__ = ["main"]

logger = logging.getLogger("shardline.transport.local.worker")

LOAD_FAILED = 2
"""The exit status of a worker whose handlers spec cannot be loaded."""

_HARD_EXIT_MARGIN = 5.0

_FRAME_LIMIT = {"msgpack": "max_frame_bytes", "grpc": "max_message_bytes"}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m shardline.transport.local.worker",
        description="A worker process of a shardline LocalPool (internal).",
    )
    parser.add_argument("--handlers", required=True, help="MODULE:ATTRIBUTE of the handlers")
    parser.add_argument("--namespace", required=True, help="the LocalDiscovery namespace")
    parser.add_argument("--directory", required=True, help="the LocalDiscovery directory")
    parser.add_argument("--transport", required=True, choices=TRANSPORTS)
    parser.add_argument("--address", required=True, help="host:port, or a Unix socket's path")
    parser.add_argument("--uid", required=True, type=uuid.UUID, help="the record's uid")
    parser.add_argument("--grace", required=True, type=float, help="seconds to drain calls")
    parser.add_argument(
        "--max-frame-bytes",
        type=int,
        default=MAX_MESSAGE_BYTES,
        help="the bound on a message, in bytes (default: %(default)s)",
    )
    parser.add_argument("--tls-cert", help="serve TLS with this certificate chain (PEM)")
    parser.add_argument("--tls-key", help="the private key of --tls-cert (PEM)")
    parser.add_argument("--tls-ca", help="require client certificates signed by these (PEM)")
    parser.add_argument(
        "--limit", action="append", default=[], help="a msgpack worker limit, NAME=VALUE"
    )
    return parser


class _ParentWatch:
    """Reads standard input until end of file, then stops the worker (see the module)."""

    def __init__(self, grace: float) -> None:
        self._grace = grace
        self._lock = threading.Lock()
        self._stop: Callable[[], None] | None = None

    def start(self) -> None:
        threading.Thread(target=self._run, name="shardline-parent-watch", daemon=True).start()

    def attach(self, loop: asyncio.AbstractEventLoop, stopping: asyncio.Event) -> None:
        def stop() -> None:
            loop.call_soon_threadsafe(stopping.set)

        with self._lock:
            self._stop = stop

    def _run(self) -> None:
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass  # a closed or broken standard input means the same: nobody is there
        with self._lock:
            stop = self._stop
        if stop is None:  # still loading the handlers: nothing to withdraw yet
            os._exit(1)
        logger.warning("the parent process is gone (standard input closed): stopping")
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            stop()
        # a handler that never returns must not keep an orphan alive
        time.sleep(self._grace + _HARD_EXIT_MARGIN)
        os._exit(1)


async def _serve(
    args: argparse.Namespace, handlers: Mapping[str, Handler], watch: _ParentWatch
) -> int:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError):  # no signal handlers on Windows loops
        loop.add_signal_handler(signal.SIGTERM, stopping.set)
    watch.attach(loop, stopping)
    tls = None
    if args.tls_cert is not None:
        tls = TlsSettings(args.tls_cert, args.tls_key, args.tls_ca)
    discovery: Discovery = LocalDiscovery(args.namespace, directory=args.directory)
    try:
        server = await serve(
            handlers,
            args.address,
            discovery,
            transport=args.transport,
            uid=args.uid,
            grace=args.grace,
            tls=tls,
            # each transport's server names its bound in its own words
            **{_FRAME_LIMIT[args.transport]: args.max_frame_bytes},
            **({"limits": WorkerLimits.parse(args.limit)} if args.limit else {}),
        )
        try:
            await stopping.wait()
        finally:
            await server.stop()
    finally:
        await discovery.aclose()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Runs one worker as described in the module docstring; returns the exit status."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s pid {os.getpid()} %(levelname)s %(name)s: %(message)s",
    )
    watch = _ParentWatch(args.grace)
    watch.start()
    try:
        handlers = load_handlers(args.handlers)
    except HandlersSpecError as error:
        # the cause's traceback shows where in the caller's module an import failed
        logger.error("%s", error, exc_info=error.__cause__)
        return LOAD_FAILED
    return run(_serve(args, handlers, watch))


if __name__ == "__main__":
    sys.exit(main())
