"""A constructor or setting given an argument of the wrong type raises ``InvalidArgumentType``:
a ``TypeError`` (as Python's own checks raise) that is still the ``ValueError`` these raised
before; the same argument of the right type but a bad value stays a ``ValueError`` only. Each
case is a public entry point of its own subsystem, checked before anything is started."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from shardline.errors import InvalidArgument, InvalidArgumentType
from shardline.registration.checks import check_owner, check_service, check_services
from shardline.registration.memory_store import MemoryRecordStore
from shardline.retry_budget import RetryBudget
from shardline.topology.sources.pg_notify import PgNotifyTransport
from shardline.topology.sources.polling import PollingSource
from shardline.transport import LocalPool, TlsSettings
from shardline.transport.handlers_spec import check_spec
from shardline.transport.serving import check_handlers, handler_threads

DSN = "postgresql://user@127.0.0.1:1/db"
SPEC = "local_pool_handlers:HANDLERS"


def etcd_discovery(endpoints: object = "127.0.0.1:1", **options: Any) -> object:
    from shardline.discovery import EtcdDiscovery

    return EtcdDiscovery(endpoints, **options)  # type: ignore[arg-type]


def local_discovery(*args: Any, **options: Any) -> object:
    from shardline.discovery import LocalDiscovery

    return LocalDiscovery(*args, **options)


async def report(**record: Any) -> None:
    await MemoryRecordStore().report("svc", owner=None, **record)


# (what, the call with a value of the wrong type, the call with a bad value of the right type)
CASES: list[tuple[str, Callable[[], object], Callable[[], object] | None]] = [
    (
        "EtcdDiscovery ttl",
        lambda: etcd_discovery(namespace="ns", ttl="10"),
        lambda: etcd_discovery(namespace="ns", ttl=0),
    ),
    (
        "EtcdDiscovery namespace",
        lambda: etcd_discovery(namespace=7),
        lambda: etcd_discovery(namespace="a/b"),
    ),
    (
        "EtcdDiscovery timeout",
        lambda: etcd_discovery(namespace="ns", timeout="1"),
        lambda: etcd_discovery(namespace="ns", timeout=0),
    ),
    (
        "EtcdDiscovery endpoint",
        lambda: etcd_discovery(namespace="ns", endpoints=[7]),
        None,
    ),
    ("LocalDiscovery namespace", lambda: local_discovery(7), lambda: local_discovery("")),
    (
        "LocalDiscovery log_retention",
        lambda: local_discovery("ns", log_retention="9"),
        lambda: local_discovery("ns", log_retention=0),
    ),
    ("service", lambda: check_service(7), lambda: check_service("")),
    ("owner", lambda: check_owner(7), None),
    ("services", lambda: check_services("svc"), lambda: check_services([])),
    ("RetryBudget ratio", lambda: RetryBudget(ratio="0.2"), lambda: RetryBudget(ratio=-1.0)),  # type: ignore[arg-type]
    (
        "PollingSource address_type",
        lambda: PollingSource(DSN, address_type=7),
        lambda: PollingSource(DSN, address_type=""),
    ),  # type: ignore[arg-type]
    ("PollingSource tiers", lambda: PollingSource(DSN, tiers="default"), None),
    ("PollingSource dsn", lambda: PollingSource(7), None),  # type: ignore[arg-type]
    ("PollingSource connect_kwargs", lambda: PollingSource(DSN, connect_kwargs={1: 2}), None),  # type: ignore[dict-item]
    (
        "PgNotifyTransport channel",
        lambda: PgNotifyTransport(DSN, channel=7),
        lambda: PgNotifyTransport(DSN, channel=""),
    ),  # type: ignore[arg-type]
    (
        "PgNotifyTransport timeout",
        lambda: PgNotifyTransport(DSN, timeout="5"),
        lambda: PgNotifyTransport(DSN, timeout=0),
    ),  # type: ignore[arg-type]
    (
        "PgNotifyTransport max_queue",
        lambda: PgNotifyTransport(DSN, max_queue=1.5),
        lambda: PgNotifyTransport(DSN, max_queue=0),
    ),  # type: ignore[arg-type]
    ("LocalPool handlers", lambda: check_spec(7), lambda: check_spec("no-colon")),
    (
        "LocalPool max_restarts",
        lambda: LocalPool(SPEC, max_restarts="3"),
        lambda: LocalPool(SPEC, max_restarts=-1),
    ),  # type: ignore[arg-type]
    ("LocalPool tls", lambda: LocalPool(SPEC, tls="cert.pem"), None),  # type: ignore[arg-type]
    ("LocalPool workers", lambda: LocalPool(SPEC, workers="2"), lambda: LocalPool(SPEC, workers=0)),  # type: ignore[arg-type]
    (
        "LocalPool start_timeout",
        lambda: LocalPool(SPEC, start_timeout="30"),
        lambda: LocalPool(SPEC, start_timeout=0),
    ),  # type: ignore[arg-type]
    ("handler name", lambda: check_handlers({7: print}), lambda: check_handlers({"": print})),  # type: ignore[dict-item]
    ("handler threads", lambda: handler_threads("4"), lambda: handler_threads(0)),  # type: ignore[arg-type]
    ("TlsSettings cert", lambda: TlsSettings(cert=7), None),  # type: ignore[arg-type]
    (
        "TlsSettings server_hostname",
        lambda: TlsSettings(server_hostname=7),
        lambda: TlsSettings(server_hostname=" h"),
    ),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("what", "wrong_type", "bad_value"), CASES, ids=[c[0] for c in CASES])
def test_a_wrong_type_is_a_type_error_and_the_value_error_it_was(
    what: str, wrong_type: Callable[[], object], bad_value: Callable[[], object] | None
) -> None:
    with pytest.raises(TypeError) as raised:
        wrong_type()
    assert isinstance(raised.value, InvalidArgumentType)
    assert isinstance(raised.value, InvalidArgument)
    assert isinstance(raised.value, ValueError)
    if bad_value is not None:
        with pytest.raises(ValueError) as refused:  # noqa: PT011 (each case's own message)
            bad_value()
        assert not isinstance(refused.value, TypeError)


@pytest.mark.parametrize(
    ("record", "wrong"),
    [
        ({"registered": "yes", "address": None}, "registered"),
        ({"registered": True, "address": 7}, "address"),
    ],
)
async def test_a_record_store_calls_a_field_of_the_wrong_type_a_type_error(
    record: dict[str, Any], wrong: str
) -> None:
    with pytest.raises(InvalidArgumentType, match=wrong):
        await report(**record)
