"""``shardline inspect --probe``: a probe query on each instance, sent by a Picodata client, and
each instance's health as that client's registry then sees it."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from shardline.errors import (
    DeadlineExceeded,
    InstanceUnavailable,
    NoWorkersAvailable,
    ShardlineError,
)

if TYPE_CHECKING:
    from shardline.picodata import Client

__all__ = ["PROBE_TIMEOUT", "Prober", "health_table", "probe_once", "start_failed"]

PROBE_TIMEOUT = 1.0
"""Seconds a probe may take, connecting included, unless ``--probe-timeout`` says otherwise:
long past a healthy instance's ``SELECT 1`` (a millisecond or so), short enough that a stalled
instance's five misses in a row (what ejects it) take seconds, not the client's default
deadline of 5 s each."""


class Prober:
    """A Picodata client (:func:`shardline.picodata.connect` on ``dsn``, its deadline and
    ``acquire_timeout`` both ``timeout``) kept open across rounds of probes, so that its health
    registry accumulates what they show as it would for an application's queries.

    Implementation notes:
        The health is the client's own, read back from ``Client.stats()``: the CLI keeps no
        count of its own, so what it shows is what a client's reads would skip.
    """

    def __init__(self, dsn: str, *, tier: str | None, timeout: float) -> None:
        self.timeout = timeout
        self.rounds = 0
        self._dsn = dsn
        self._tier = tier
        self._db: Client | None = None

    async def open(self) -> None:
        """Starts the client: raises what :func:`shardline.picodata.connect` raises when
        awaited (the catalog cannot be read, no tier with buckets, ...)."""
        from shardline.picodata import connect

        self._db = await connect(
            self._dsn, tier=self._tier, timeout=self.timeout, acquire_timeout=self.timeout
        )

    async def close(self) -> None:
        """Closes the client, if it started."""
        if self._db is not None:
            await self._db.close()

    async def probe(self, instances: Sequence[str]) -> dict[str, tuple[str, float | None]]:
        """One probe of each of ``instances`` (uuids), all at once; the outcome of each:
        ``("ok", seconds)``, ``("deadline", None)``, ``("unreachable", None)``, ``("not
        online", None)`` (not probed: the client cannot dial it), or ``("failed: <error>",
        None)``. The client's topology is refreshed first, so it knows the instances the
        caller has just read from the catalog."""
        db = self._client()
        await db.refresh()
        self.rounds += 1

        async def one(uuid: str) -> tuple[str, float | None]:
            began = time.monotonic()
            try:
                await db.ping(uuid)
            except DeadlineExceeded:
                return "deadline", None
            except InstanceUnavailable:
                return "unreachable", None
            except NoWorkersAvailable:
                return "not online", None
            except Exception as error:
                return f"failed: {type(error).__name__}: {error}", None
            return "ok", time.monotonic() - began

        outcomes = await asyncio.gather(*(one(uuid) for uuid in instances))
        return dict(zip(instances, outcomes, strict=True))

    async def settle(self, instances: Sequence[str]) -> dict[str, tuple[str, float | None]]:
        """Probes each of ``instances`` until it answers or the client ejects it, at most the
        client's ``HEALTH_POLICY.failures`` times (the failures in a row that eject an
        instance), every instance still pending probed in each round; the last outcome of
        each (see :meth:`probe`). A healthy cluster takes one round."""
        from shardline.picodata.client import HEALTH_POLICY

        last: dict[str, tuple[str, float | None]] = {}
        pending = list(instances)
        for _ in range(HEALTH_POLICY.failures):
            outcomes = await self.probe(pending)
            last.update(outcomes)
            pools = self._client().stats().pools
            pending = [
                uuid
                for uuid, (outcome, _) in outcomes.items()
                if outcome not in ("ok", "not online")
                and (health := getattr(pools.get(uuid), "health", None)) is not None
                and health.state == "healthy"
            ]
            if not pending:
                break
        return last

    def document(
        self,
        instances: Sequence[Mapping[str, Any]],
        outcomes: Mapping[str, tuple[str, float | None]],
    ) -> dict[str, Any]:
        """The ``health`` part of ``inspect --json``'s document: the probe's settings and the
        client's counts, and one row per instance of ``instances`` (the document's rows, in
        their order) with its last probe's outcome and its health in the client's registry
        (``null`` fields for one the client has no pool for)."""
        stats = self._client().stats()
        rows = []
        for instance in instances:
            uuid = instance["uuid"]
            outcome, seconds = outcomes.get(uuid, ("not probed", None))
            pool = stats.pools.get(uuid)
            health = pool.health if pool is not None else None
            rows.append(
                {
                    "uuid": uuid,
                    "name": instance["name"],
                    "address": instance["address"],
                    "probe": outcome,
                    "probe_seconds": seconds,
                    "state": health.state if health is not None else None,
                    "consecutive_failures": (
                        health.consecutive_failures if health is not None else None
                    ),
                    "times_ejected": health.times_ejected if health is not None else None,
                    "ejected_for": health.ejected_for if health is not None else None,
                    "reason": (health.reason or None) if health is not None else None,
                    "success_rate": health.success_rate if health is not None else None,
                }
            )
        return {
            "timeout": self.timeout,
            "rounds": self.rounds,
            "ejections": stats.ejections,
            "readmissions": stats.readmissions,
            "ejected": stats.ejected,
            "instances": rows,
        }

    def _client(self) -> Client:
        if self._db is None:
            raise RuntimeError("the prober is not open: use async with")
        return self._db


def start_failed(error: ShardlineError) -> None:
    """Says on stderr that the probes' client could not start, and why."""
    print(
        f"shardline inspect: --probe: the Picodata client could not start: {error}",
        file=sys.stderr,
    )


async def probe_once(
    dsn: str, *, tier: str | None, timeout: float, instances: Sequence[Mapping[str, Any]]
) -> dict[str, Any] | None:
    """``inspect --probe`` without ``--watch``: :meth:`Prober.settle` over ``instances`` (the
    document's rows), then :meth:`Prober.document`; None (said on stderr) if the client could
    not start."""
    prober = Prober(dsn, tier=tier, timeout=timeout)
    try:
        await prober.open()
    except ShardlineError as error:
        start_failed(error)
        return None
    try:
        outcomes = await prober.settle([row["uuid"] for row in instances])
        return prober.document(instances, outcomes)
    finally:
        await prober.close()


def health_table(health: Mapping[str, Any]) -> tuple[str, list[str], list[list[Any]]]:
    """The ``health`` part of the document as a (title, header, rows) table; a missing value
    is ``-``."""

    def cell(value: Any) -> Any:
        return "-" if value is None else value

    rows = []
    for row in health["instances"]:
        seconds = row["probe_seconds"]
        probe = f"ok {seconds * 1000:.1f} ms" if seconds is not None else row["probe"]
        ejected_for = row["ejected_for"]
        rows.append(
            [
                cell(row["name"]),
                row["uuid"],
                cell(row["address"]),
                probe,
                cell(row["state"]),
                cell(row["consecutive_failures"]),
                cell(row["times_ejected"]),
                f"{ejected_for:.1f} s" if ejected_for else "-",
                cell(row["reason"]),
            ]
        )
    title = (
        f"instance health (probe timeout {health['timeout']:g} s, {health['rounds']} round(s);"
        f" {health['ejected']} ejected now, {health['ejections']} ejection(s),"
        f" {health['readmissions']} re-admission(s))"
    )
    header = [
        "instance",
        "uuid",
        "address",
        "probe",
        "health",
        "failures in a row",
        "times ejected",
        "ejected for",
        "ejected because",
    ]
    return title, header, rows
