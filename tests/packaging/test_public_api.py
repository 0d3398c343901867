"""The package's public surface as a caller meets it: every exception constructible with no
arguments, as the builtins (and wool's) are, and ``dir()`` of a lazily exporting package listing
its exports and not the loader's internals."""

from __future__ import annotations

import copy
import importlib
import inspect
import pickle
import pkgutil
from collections.abc import Callable
from typing import Any

import pytest

import shardline
from shardline import errors

ERRORS = [
    value
    for name in errors.__all__
    if isinstance(value := getattr(errors, name), type) and issubclass(value, BaseException)
]


def public_errors() -> list[type[BaseException]]:
    """Every exception class a public module of shardline exports (in its ``__all__``)."""
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(shardline.__path__, "shardline."):
        if any(part.startswith("_") for part in info.name.split(".")):
            continue
        module = importlib.import_module(info.name)
        for name in getattr(module, "__all__", ()):
            value = getattr(module, name)
            if (
                isinstance(value, type)
                and issubclass(value, BaseException)
                and value.__module__.startswith("shardline.")
            ):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return [found[name] for name in sorted(found)]


PUBLIC_ERRORS = public_errors()

LAZY_PACKAGES = [
    "shardline",
    "shardline.demo",
    "shardline.discovery",
    "shardline.registration",
    "shardline.topology.sources",
    "shardline.transport",
]
LOADER_INTERNALS = {"lazy_exports", "TYPE_CHECKING", "__getattr__", "__dir__", "_lazy"}


@pytest.mark.parametrize("cls", ERRORS, ids=lambda cls: cls.__name__)
def test_every_error_is_made_with_no_arguments_as_a_builtin_is(cls: type[Exception]) -> None:
    with pytest.raises(cls) as raised:
        raise cls()
    error = raised.value
    assert error.args == ()
    assert str(error) == ""
    assert isinstance(error, shardline.ShardlineError)


def test_the_public_errors_found_include_those_of_the_subpackages() -> None:
    names = {cls.__name__ for cls in PUBLIC_ERRORS}
    assert {"TransientRpcError", "TransportError", "FrameTooLarge", "RetryElsewhere"} <= names


@pytest.mark.parametrize("cls", PUBLIC_ERRORS, ids=lambda cls: f"{cls.__module__}.{cls.__name__}")
def test_every_public_error_of_every_module_is_made_with_no_arguments(
    cls: type[Exception],
) -> None:
    with pytest.raises(cls) as raised:
        raise cls()
    assert raised.value.args == ()
    assert str(raised.value) == ""


@pytest.mark.parametrize("cls", ERRORS, ids=lambda cls: cls.__name__)
def test_an_error_made_with_no_arguments_survives_pickling(cls: type[Exception]) -> None:
    copy: Any = pickle.loads(pickle.dumps(cls()))
    assert type(copy) is cls
    assert copy.args == ()


WITH_ARGUMENTS = [
    shardline.RpcError("m", reason="busy", address="grpc://h:1", sent=True),
    shardline.OutcomeUnknown("m", reason="deadline", address="grpc://h:1", uid=7),
    shardline.DeadlineExceeded("m", timeout=1.0, tried=((7, "a", "deadline"),), may_have_run=True),
    shardline.WorkerError("ValueError", "bad", handler="h", address="a", remote_traceback="tb"),
    shardline.MissingExtra("pg", "asyncpg", needed_by="the client"),
    shardline.InvalidRecord("oversized", "m"),
    shardline.InvalidAddress("m", reason="r"),
    shardline.InstanceUnavailable("m", instance="i", address="h:1"),
    errors.NotPicodata("m", address="h:1"),
    shardline.InvalidArgumentType("m"),
]


@pytest.mark.parametrize("error", WITH_ARGUMENTS, ids=lambda error: type(error).__name__)
def test_an_error_made_with_arguments_survives_pickling_and_copying(error: Exception) -> None:
    for copied in (pickle.loads(pickle.dumps(error)), copy.copy(error)):
        assert type(copied) is type(error)
        assert copied.args == error.args
        assert str(copied) == str(error)
        assert vars(copied) == vars(error)
    if isinstance(error, ImportError):
        assert pickle.loads(pickle.dumps(error)).name == error.name


def test_an_rpc_error_made_with_no_arguments_has_the_documented_defaults() -> None:
    for cls in (shardline.RpcError, shardline.TransientRpcError):
        error = cls()
        assert (error.reason, error.address, error.sent) == ("unspecified", None, False)
    unknown = shardline.OutcomeUnknown()
    assert (unknown.reason, unknown.address, unknown.sent, unknown.uid) == (
        "unspecified",
        None,
        True,
        None,
    )
    deadline = shardline.DeadlineExceeded()
    assert (deadline.timeout, deadline.tried, deadline.may_have_run) == (0.0, (), False)


def test_the_other_errors_made_with_no_arguments_have_the_documented_defaults() -> None:
    worker = shardline.WorkerError()
    assert (worker.remote_type, worker.remote_message, worker.handler, worker.address) == (
        "",
        "",
        "",
        "",
    )
    assert worker.remote_traceback is None
    assert shardline.InvalidRecord().reason == "malformed"
    assert shardline.InvalidAddress().reason is None
    unavailable = shardline.InstanceUnavailable()
    assert (unavailable.instance, unavailable.address) == (None, None)
    assert errors.NotPicodata().address is None
    missing = shardline.MissingExtra()
    assert (missing.extra, missing.name) == ("", None)


def test_a_message_given_is_the_errors_one_argument_as_before() -> None:
    error = shardline.TransientRpcError("busy now", reason="busy", address="grpc://h:1")
    assert error.args == ("busy now",)
    assert (error.reason, error.address) == ("busy", "grpc://h:1")
    worker = shardline.WorkerError("ValueError", "bad", handler="h", address="grpc://h:1")
    assert str(worker) == "handler 'h' of the worker at grpc://h:1: ValueError: bad"
    missing = shardline.MissingExtra("pg", "asyncpg", needed_by="the client")
    assert str(missing) == (
        "the client needs asyncpg, which is not installed: pip install 'shardline[pg]'"
    )
    assert missing.name == "asyncpg"


def test_a_wrong_type_is_both_a_type_error_and_the_invalid_argument_it_was() -> None:
    cls = shardline.InvalidArgumentType
    assert issubclass(cls, TypeError)
    assert issubclass(cls, shardline.InvalidArgument)
    assert issubclass(cls, ValueError)
    assert issubclass(cls, shardline.ShardlineError)


@pytest.mark.parametrize("name", LAZY_PACKAGES)
def test_dir_lists_every_export_of_a_lazy_package_and_no_loader_internal(name: str) -> None:
    package = importlib.import_module(name)
    listed = dir(package)
    assert listed == sorted(listed)
    assert set(package.__all__) <= set(listed)
    assert not LOADER_INTERNALS & set(listed)
    for export in listed:
        getattr(package, export)  # every name listed can be read


def test_dir_of_shardline_names_the_lazy_exports() -> None:
    listed = set(dir(shardline))
    assert {"LocalPool", "WorkerProxy", "TopologyDiscovery", "__version__"} <= listed
    assert {"Topology", "bucket_id", "InvalidArgumentType", "__doc__", "__name__"} <= listed
    assert not {name for name in listed if not name.startswith("__") and name.startswith("_")}


def test_dir_lists_the_lazy_exports_before_their_modules_are_imported(
    child_python: Callable[[str], str],
) -> None:
    script = (
        "import sys, shardline\n"
        "listed = dir(shardline)\n"
        "assert 'shardline.transport.local.pool' not in sys.modules\n"
        "assert 'shardline.proxy' not in sys.modules\n"
        "print(' '.join(listed))\n"
    )
    assert {"LocalPool", "WorkerProxy"} <= set(child_python(script).split())


def test_a_name_dir_lists_is_found_by_inspect() -> None:
    members = dict(inspect.getmembers(shardline))
    assert members["LocalPool"] is shardline.LocalPool
    assert "lazy_exports" not in members
