"""Certificates for the TLS tests, made at run time with ``trustme``: two certificate
authorities, and servers' and clients' certificates signed by them, written as PEM files
(private keys mode 0600, as a worker expects them)."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from pathlib import Path

import trustme

from shardline.transport.tls import TlsSettings

LOOPBACK_NAMES = ("127.0.0.1", "::1", "localhost")


@dataclass(frozen=True)
class Pair:
    """A certificate and its private key, as files."""

    cert: str
    key: str


@dataclass(frozen=True)
class Certificates:
    """``ca`` signed ``server`` (for the loopback names), ``client``, ``expired_server`` and
    ``expired_client`` (both expired yesterday) and ``named_server`` (for
    ``worker.example`` alone); ``other_ca`` signed ``other_client``."""

    ca: str
    other_ca: str
    server: Pair
    named_server: Pair
    expired_server: Pair
    client: Pair
    other_client: Pair
    expired_client: Pair

    def serving(self, pair: Pair | None = None, *, mutual: bool = False) -> TlsSettings:
        """What a worker serves with: ``pair`` (``server`` by default), requiring client
        certificates signed by ``ca`` when ``mutual``."""
        pair = pair or self.server
        return TlsSettings(pair.cert, pair.key, self.ca if mutual else None)

    def dialling(self, pair: Pair | None = None, **options: str) -> TlsSettings:
        """What a caller dials with: trusting ``ca``, presenting ``pair`` if given."""
        if pair is None:
            return TlsSettings(ca=self.ca, **options)
        return TlsSettings(pair.cert, pair.key, self.ca, **options)


def make_certificates(directory: Path) -> Certificates:
    ca, other_ca = trustme.CA(), trustme.CA()
    now = datetime.datetime.now(datetime.UTC)
    # valid for a day, which ended yesterday
    expired = {
        "not_before": now - datetime.timedelta(days=2),
        "not_after": now - datetime.timedelta(days=1),
    }

    def write(name: str, issued: trustme.LeafCert) -> Pair:
        cert, key = directory / f"{name}.pem", directory / f"{name}.key"
        issued.cert_chain_pems[0].write_to_path(str(cert))
        issued.private_key_pem.write_to_path(str(key))
        os.chmod(key, 0o600)
        return Pair(str(cert), str(key))

    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    other_ca.cert_pem.write_to_path(str(directory / "other-ca.pem"))
    return Certificates(
        ca=str(directory / "ca.pem"),
        other_ca=str(directory / "other-ca.pem"),
        server=write("server", ca.issue_cert(*LOOPBACK_NAMES)),
        named_server=write("named-server", ca.issue_cert("worker.example")),
        expired_server=write("expired-server", ca.issue_cert(*LOOPBACK_NAMES, **expired)),
        client=write("client", ca.issue_cert("client.example")),
        other_client=write("other-client", other_ca.issue_cert("client.example")),
        expired_client=write("expired-client", ca.issue_cert("client.example", **expired)),
    )
