"""The optional extras: importing shardline loads none of them (nor asyncio, sqlite3, ssl for the
core's names), the core needs only the standard library, and a feature whose extra is missing
raises ``MissingExtra`` naming the pip command, in the library and in the CLI alike.

Each check that depends on what a process has imported runs in a fresh interpreter, with the
missing dependency made unimportable there (``sys.modules[name] = None``, or a meta-path finder
that refuses everything outside the standard library).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from shardline import MissingExtra, ShardlineError
from shardline._extras import EXTRAS, require_extra, requires_extra

pytestmark = pytest.mark.integration

# a Python process where each module in `blocked` cannot be imported, as if not installed
BLOCK = "import sys\nfor _name in {blocked!r}:\n    sys.modules[_name] = None\n"

# a Python process with nothing installed but the standard library and shardline
STDLIB_ONLY = """\
import sys

class _StdlibOnly:
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top != "shardline" and top not in sys.stdlib_module_names:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _StdlibOnly())
"""

PIP = {extra: f"pip install 'shardline[{extra}]'" for extra in EXTRAS}


def python(
    code: str, *, blocked: tuple[str, ...] = (), **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCK.format(blocked=blocked) + code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


def test_importing_shardline_and_discovery_loads_neither_grpc_nor_aetcd(
    child_python: Callable[[str], str],
) -> None:
    probe = (
        "import sys, shardline, shardline.discovery, shardline.registration, shardline.cli;"
        "print(sorted(m for m in ('grpc', 'aetcd') if m in sys.modules))"
    )
    assert child_python(probe) == "[]"


def test_the_etcd_backends_are_loaded_on_first_use() -> None:
    from shardline import discovery, registration
    from shardline.discovery.etcd import EtcdDiscovery
    from shardline.registration.etcd_store import EtcdRecordStore

    assert discovery.EtcdDiscovery is EtcdDiscovery
    assert registration.EtcdRecordStore is EtcdRecordStore


def test_topology_and_bucket_id_load_neither_asyncio_sqlite3_ssl_nor_an_extra() -> None:
    # ... nor once a topology is built and routed on (the events module loads with the first
    # applied event)
    probe = """
import json
from shardline import BucketEvent, InstanceEvent, ReplicasetEvent, Topology, bucket_id
heavy = ("asyncio", "sqlite3", "ssl", "rich", "grpc", "aetcd", "asyncpg", "msgpack", "uvloop")
loaded = {"import": sorted(m for m in heavy if m in sys.modules)}
topology = Topology()
topology.apply_tiers({"default": 3000})
rs, i = "00000000-0000-0000-0000-00000000000a", "00000000-0000-0000-0000-00000000000b"
topology.apply(ReplicasetEvent("replace", rs, tier="default", current_master_uuid=i))
topology.apply(InstanceEvent("replace", i, rs, current_state="Online", address="h:1"))
topology.apply(BucketEvent("default", 1, 3000, rs))
assert topology.route("default", 7).uuid == i, topology.route("default", 7)
assert bucket_id(7, 3000) == topology.bucket_id("default", 7)
loaded["use"] = sorted(m for m in heavy if m in sys.modules)
print(json.dumps(loaded))
"""
    done = python(probe)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"import": [], "use": []}


def test_the_core_needs_only_the_standard_library() -> None:
    # every name of every package resolves, or raises MissingExtra for an extra it names
    probe = (
        STDLIB_ONLY
        + """
import importlib, json
from shardline import MissingExtra
packages = ["shardline", "shardline.discovery", "shardline.registration", "shardline.pool",
            "shardline.balancers", "shardline.topology", "shardline.topology.sources",
            "shardline.transport"]
missing = {}
for package in packages:
    module = importlib.import_module(package)
    for name in module.__all__:
        try:
            getattr(module, name)
        except MissingExtra as error:
            missing[f"{package}.{name}"] = error.extra
import shardline.cli
print(json.dumps(missing))
"""
    )
    done = python(probe)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "shardline.discovery.EtcdDiscovery": "etcd",
        "shardline.registration.EtcdRecordStore": "etcd",
        "shardline.topology.sources.PgNotifyTransport": "pg",
        "shardline.topology.sources.PollingSource": "pg",
        "shardline.transport.GrpcConnection": "grpc",
        "shardline.transport.MsgpackConnection": "msgpack",
        "shardline.transport.MsgpackWorkerServer": "msgpack",
        "shardline.transport.WorkerServer": "grpc",
        "shardline.transport.serve_grpc": "grpc",
        "shardline.transport.serve_msgpack": "msgpack",
    }


@pytest.mark.parametrize(
    ("blocked", "statement", "extra", "needed_by"),
    [
        ("grpc", "from shardline.transport import GrpcConnection", "grpc", "grpc.connection"),
        ("grpc", "from shardline.transport import serve_grpc", "grpc", "grpc.server"),
        ("grpc", "import shardline.transport.grpc.channels", "grpc", "grpc.channels"),
        ("msgpack", "from shardline.transport import MsgpackConnection", "msgpack", "msgpack.wire"),
        ("msgpack", "from shardline.transport import serve_msgpack", "msgpack", "msgpack.wire"),
        ("aetcd", "from shardline.discovery import EtcdDiscovery", "etcd", "discovery.etcd"),
        ("grpc", "from shardline.discovery import EtcdDiscovery", "etcd", "discovery.etcd"),
        ("aetcd", "import shardline.discovery.etcd_watch", "etcd", "discovery.etcd_watch"),
        ("aetcd", "from shardline.registration import EtcdRecordStore", "etcd", "etcd_store"),
        ("asyncpg", "from shardline.topology.sources import PollingSource", "pg", "polling"),
        ("asyncpg", "from shardline.topology.sources import PgNotifyTransport", "pg", "pg_notify"),
        ("asyncpg", "import shardline.topology.sources.pg_connect", "pg", "pg_connect"),
        ("asyncpg", "import shardline.picodata", "pg", "picodata.client"),
    ],
)
def test_a_missing_extra_raises_missing_extra_naming_the_pip_command(
    blocked: str, statement: str, extra: str, needed_by: str
) -> None:
    probe = f"""
import json
from shardline import MissingExtra, ShardlineError
try:
    {statement}
except ImportError as error:
    print(json.dumps({{
        "type": type(error).__name__,
        "message": str(error),
        "extra": getattr(error, "extra", None),
        "name": error.name,
        "bases": [isinstance(error, ShardlineError), isinstance(error, ImportError)],
        "cause": type(error.__cause__).__name__,
    }}))
"""
    done = python(probe, blocked=(blocked,))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["type"] == "MissingExtra"
    assert report["message"].endswith(f"needs {blocked}, which is not installed: {PIP[extra]}")
    assert report["message"].startswith("shardline.")
    assert needed_by in report["message"].partition(" ")[0]
    assert (report["extra"], report["name"]) == (extra, blocked)
    assert report["bases"] == [True, True]
    assert report["cause"] == "ModuleNotFoundError"


@pytest.mark.parametrize("transport", ["msgpack", "grpc"])
def test_local_pool_checks_its_transport_s_extra_before_starting_a_worker(transport: str) -> None:
    probe = f"""
from shardline import LocalPool, MissingExtra
try:
    LocalPool("local_pool_handlers:HANDLERS", 1, transport={transport!r})
except MissingExtra as error:
    print(error)
"""
    done = python(probe, blocked=(transport,))
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        f"LocalPool(transport={transport!r}) needs {transport}, which is not installed:"
        f" {PIP[transport]}\n"
    )


def test_requires_extra_converts_only_its_own_modules() -> None:
    with pytest.raises(MissingExtra) as raised, requires_extra("etcd", "here"):
        raise ModuleNotFoundError("No module named 'aetcd'", name="aetcd")
    assert str(raised.value) == "here needs aetcd, which is not installed: " + PIP["etcd"]
    assert isinstance(raised.value, ImportError)
    assert isinstance(raised.value, ShardlineError)
    # a dependency of an installed extra, or any other module: a broken install, left as is
    for name in ("google.protobuf", "grpc_tools", None):
        with pytest.raises(ModuleNotFoundError) as other, requires_extra("etcd", "here"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        assert not isinstance(other.value, MissingExtra)
    with pytest.raises(ImportError) as broken, requires_extra("grpc", "here"):
        raise ImportError("undefined symbol", name="grpc")
    assert not isinstance(broken.value, MissingExtra)


def test_require_extra_checks_every_module_of_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    require_extra("etcd", "here")
    monkeypatch.setitem(sys.modules, "grpc", None)
    with pytest.raises(MissingExtra, match=r"^here needs grpc, which is not installed: pip "):
        require_extra("etcd", "here")


@pytest.mark.parametrize(
    "package",
    [
        "shardline",
        "shardline.demo",
        "shardline.discovery",
        "shardline.registration",
        "shardline.topology",
        "shardline.topology.sources",
        "shardline.transport",
    ],
)
def test_every_lazy_export_resolves_and_nothing_else_does(package: str) -> None:
    module = importlib.import_module(package)
    for name in module.__all__:
        assert getattr(module, name) is not None, name
    with pytest.raises(AttributeError, match=rf"^module '{package}' has no attribute 'nope'$"):
        getattr(module, "nope")  # noqa: B009
    with pytest.raises(ImportError):
        exec(f"from {package} import nope")


# --- the command -----------------------------------------------------------------------------


def command(
    tmp_path: Path, *argv: str, blocked: tuple[str, ...]
) -> subprocess.CompletedProcess[str]:
    """``shardline ARGV`` with ``blocked`` unimportable; its LocalDiscovery under tmp_path."""
    return python(
        f"from shardline.cli import main\nsys.exit(main({list(argv)!r}))\n",
        blocked=blocked,
        XDG_RUNTIME_DIR=str(tmp_path),
    )


WORKER = ("worker", "--namespace", "extras", "--address", "127.0.0.1:0")


@pytest.mark.parametrize(
    ("argv", "blocked", "message"),
    [
        (
            WORKER,
            ("msgpack",),
            "shardline worker: error: shardline.transport.msgpack.wire needs msgpack, which is"
            " not installed: " + PIP["msgpack"],
        ),
        (
            # the worker needs no rich: it gets as far as its transport
            (*WORKER, "--transport", "grpc"),
            ("grpc", "rich"),
            "shardline worker: error: shardline.transport.grpc.server needs grpc, which is not"
            " installed: " + PIP["grpc"],
        ),
        (
            (*WORKER, "--etcd", "http://127.0.0.1:1"),
            ("aetcd",),
            "shardline worker: error: shardline.discovery.etcd needs aetcd, which is not"
            " installed: " + PIP["etcd"],
        ),
        (
            ("inspect", "postgresql://127.0.0.1:1"),
            ("asyncpg",),
            "shardline inspect: error: this command needs asyncpg, which is not installed: "
            + PIP["pg"],
        ),
        (
            ("demo", "--plain"),
            ("rich",),
            "shardline demo: error: this command needs rich, which is not installed: " + PIP["cli"],
        ),
        (
            ("demo", "--plain", "--part", "pool", "--etcd", "http://127.0.0.1:1"),
            ("aetcd",),
            "shardline demo: error: the worker-pool part over etcd needs aetcd, which is not"
            f" installed: {PIP['etcd']}, or run it with --in-process",
        ),
    ],
)
def test_the_command_exits_with_the_pip_command(
    tmp_path: Path, argv: tuple[str, ...], blocked: tuple[str, ...], message: str
) -> None:
    done = command(tmp_path, *argv, blocked=blocked)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.splitlines()[-1] == message
    assert "Traceback" not in done.stderr


def test_the_version_and_the_worker_need_no_cli_extra(tmp_path: Path) -> None:
    done = command(tmp_path, "--version", blocked=("rich",))
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("shardline ")
