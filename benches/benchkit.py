"""What the benchmarks share: seeded clusters, the two topologies built from them, probes.

Every benchmark times a *round* that makes many calls, then divides: the ``per_call`` fixture
(conftest.py) runs ``benchmark.pedantic`` with a fixed number of rounds and records
``calls_per_round`` in ``extra_info``, so ``report.py`` turns the per-round median into
nanoseconds per call. A round walks the next block of a precomputed, seeded list of probes
(buckets or keys), so shardline, the floor and picopyn do exactly the same work, and no single
hot probe can flatter anyone.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import statistics
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from shardline import InstanceEvent, ReplicasetEvent, Topology

TIER = "default"
SEED = 20_251_202
PROBES = 4096  # probes made per scenario
CALLS_PER_ROUND = 1024  # probes walked per timed round (one block of the probe list)
ROUNDS = 1000
WARMUP_ROUNDS = 50


def make_uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


@dataclass(frozen=True)
class Cluster:
    """A seeded tier: ``n_ranges`` contiguous bucket ranges covering ``1..bucket_count``.

    ``rows`` is the poll exactly as ``SELECT _pico_bucket(tier)`` returns it, decoded from its
    JSON text, in no particular order (so its strings are not the objects the replicaset events
    carry, as in real life). Range sizes are random; adjacent ranges always have different owners.
    """

    def decoded_polls(self, n: int) -> list[list[dict[str, Any]]]:
        """``n`` separately decoded copies of the same poll: equal rows, distinct objects."""
        return [json.loads(self.payload) for _ in range(n)]

    bucket_count: int
    n_ranges: int
    masters: dict[str, str]  # replicaset uuid -> master instance uuid
    addresses: dict[str, str]  # instance uuid -> address
    payload: str  # the poll as the JSON text ``_pico_bucket(tier)`` returns
    rows: list[dict[str, Any]]  # ``json.loads(payload)``: the poll as a driver hands it over
    owner_of: dict[int, str]  # bucket -> replicaset uuid: the floor's map

    @property
    def label(self) -> str:
        return f"{self.bucket_count}b-{self.n_ranges}r"


def make_cluster(bucket_count: int, n_ranges: int, seed: int = SEED) -> Cluster:
    rng = random.Random(f"{seed}/{bucket_count}/{n_ranges}")
    n_replicasets = max(2, min(n_ranges, 32))
    replicasets = [make_uuid(rng) for _ in range(n_replicasets)]
    masters = {rs: make_uuid(rng) for rs in replicasets}
    addresses = {inst: f"127.0.0.1:{3301 + i}" for i, inst in enumerate(masters.values())}
    cuts = sorted(rng.sample(range(2, bucket_count + 1), n_ranges - 1))
    starts = [1, *cuts]
    ends = [cut - 1 for cut in cuts] + [bucket_count]
    rows: list[dict[str, Any]] = []
    owner_of: dict[int, str] = {}
    previous = None
    for start, end in zip(starts, ends, strict=True):
        owner = rng.choice([rs for rs in replicasets if rs != previous])
        previous = owner
        rows.append(
            {
                "bucket_id_start": start,
                "target_replicaset_uuid": owner,
                "tier_name": TIER,
                "state": "active",
                "bucket_id_end": end,
                "current_replicaset_uuid": owner,
            }
        )
        owner_of.update(dict.fromkeys(range(start, end + 1), owner))
    rng.shuffle(rows)
    assert len(owner_of) == bucket_count
    payload = json.dumps(rows)
    return Cluster(
        bucket_count, n_ranges, masters, addresses, payload, json.loads(payload), owner_of
    )


_clusters: dict[tuple[int, int], Cluster] = {}


def cluster(bucket_count: int, n_ranges: int) -> Cluster:
    """The seeded cluster, made once per process."""
    key = (bucket_count, n_ranges)
    if key not in _clusters:
        _clusters[key] = make_cluster(bucket_count, n_ranges)
    return _clusters[key]


def shardline_topology(cluster: Cluster, topology_class: Any = Topology) -> Topology:
    """The cluster as a ``Topology`` (or ``topology_class``: another build's, to compare)."""
    topology = topology_class()
    topology.apply_tiers({TIER: cluster.bucket_count})
    for rs, master in cluster.masters.items():
        topology.apply(ReplicasetEvent("replace", rs, tier=TIER, current_master_uuid=master))
        topology.apply(
            InstanceEvent(
                "replace",
                master,
                replicaset_uuid=rs,
                current_state="Online",
                address=cluster.addresses[master],
            )
        )
    assert topology.apply_bucket_snapshot(TIER, cluster.rows)
    assert len(topology.ranges(TIER)) == cluster.n_ranges
    return topology


def picopyn_topology(cluster: Cluster) -> Any:
    """picopyn's ``Topology``, fed as its polling tracker feeds it: replicasets, instances,
    tiers, then the ``_pico_bucket`` rows through ``picopyn.utils.topology.apply_bucket_rows``."""
    from picopyn.topology import EventInstance, EventReplicaset
    from picopyn.topology import Topology as PeerTopology
    from picopyn.utils.topology import apply_bucket_rows

    topology = PeerTopology()
    for rs, master in cluster.masters.items():
        topology.apply_replicaset(
            EventReplicaset("replace", rs, tier=TIER, current_master_uuid=master)
        )
    for rs, master in cluster.masters.items():
        topology.apply_instance(
            EventInstance("replace", master, rs, "Online", cluster.addresses[master])
        )
    topology.apply_tiers({TIER: cluster.bucket_count})
    apply_bucket_rows(topology, TIER, cluster.rows)
    assert len(topology.buckets) == cluster.n_ranges
    return topology


def probe_buckets(bucket_count: int, n: int = PROBES, seed: int = SEED) -> list[int]:
    rng = random.Random(f"{seed}/probes/{bucket_count}")
    return [rng.randint(1, bucket_count) for _ in range(n)]


def blocks(probes: Sequence[Any], size: int = CALLS_PER_ROUND) -> Iterator[Sequence[Any]]:
    """The probe list cut into blocks of ``size``, cycled forever: one block per round."""
    assert len(probes) % size == 0
    return itertools.cycle([probes[i : i + size] for i in range(0, len(probes), size)])


# --- keys -----------------------------------------------------------------------------------------

OID_INTEGER = 20  # picopyn's distribution-key type OIDs (picopyn.bucket)
OID_TEXT = 25

_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789-_:"
_NON_ASCII = "éжß€中"


def str_keys(n: int = PROBES, seed: int = SEED) -> list[str]:
    """Ids like ``user:8f3k...``, 4 to 40 characters; one in eight has a non-ASCII character."""
    rng = random.Random(f"{seed}/str")
    keys = []
    for i in range(n):
        key = "".join(rng.choices(_ALPHABET, k=rng.randint(4, 40)))
        if i % 8 == 0:
            key += rng.choice(_NON_ASCII)
        keys.append(key)
    return keys


def int_keys(n: int = PROBES, seed: int = SEED) -> list[int]:
    """Log-uniform magnitudes up to 2**62, one in five negative: every msgpack int width."""
    rng = random.Random(f"{seed}/int")
    keys = []
    for _ in range(n):
        value = rng.randrange(1 << rng.randint(1, 62))
        keys.append(-value if rng.random() < 0.2 else value)
    return keys


def tuple_keys(n: int = PROBES, seed: int = SEED) -> list[tuple[int, str, int]]:
    """3-part keys ``(tenant_id, region, order_id)``."""
    rng = random.Random(f"{seed}/tuple")
    regions = ["eu", "us-east", "ap-south-1", "москва"]
    return [(rng.randrange(10_000), rng.choice(regions), rng.randrange(1 << 40)) for _ in range(n)]


def picopyn_meta(kind: str) -> list[tuple[int, int]]:
    """picopyn's ``dk_meta`` for a key kind: (1-based parameter index, type OID) pairs."""
    return {
        "str": [(1, OID_TEXT)],
        "int": [(1, OID_INTEGER)],
        "3-part": [(1, OID_INTEGER), (2, OID_TEXT), (3, OID_INTEGER)],
    }[kind]


def picopyn_params(kind: str, key: Any) -> tuple[Any, ...]:
    """The bound parameters picopyn hashes for ``key`` (a 3-part key is already a tuple)."""
    return key if kind == "3-part" else (key,)


def one_arg_rounds(fn: Callable[[Any], Any], it: Iterator[Sequence[Any]]) -> Callable[[], Any]:
    """A timed round: ``fn(probe)`` for each probe of the next block; returns the last result."""

    def round_() -> Any:
        result = None
        for probe in next(it):
            result = fn(probe)
        return result

    return round_


def two_arg_rounds(fn: Callable[[str, Any], Any], it: Iterator[Sequence[Any]]) -> Callable[[], Any]:
    """A timed round: ``fn(TIER, probe)`` for each probe of the next block."""

    def round_() -> Any:
        result = None
        for probe in next(it):
            result = fn(TIER, probe)
        return result

    return round_


# CPU and latency measures for the benchmarks over real servers and processes


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far, 0.0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_snapshot(servers: Sequence[int]) -> tuple[float, float, float, float]:
    """(wall s, CPU s of the machine, CPU s of this process, CPU s of the server processes)."""
    busy = 0.0
    with contextlib.suppress(OSError), open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
        busy = (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")
    return time.perf_counter(), busy, time.process_time(), sum(map(process_cpu, servers))


def cpu_shares(
    before: tuple[float, float, float, float], after: tuple[float, float, float, float]
) -> dict[str, float]:
    """How many cores this process (``client_cpu``), the server processes (``servers_cpu``) and
    the machine's other processes (``others_cpu``) kept busy between two ``cpu_snapshot`` calls."""
    wall, client, servers = after[0] - before[0], after[2] - before[2], after[3] - before[3]
    others = (after[1] - before[1]) - client - servers
    return {
        "client_cpu": round(client / wall, 2),
        "servers_cpu": round(servers / wall, 2),
        "others_cpu": round(max(others / wall, 0.0), 2),
    }


def timed_rounds(
    benchmark: Any,
    round_: Callable[[], Any],
    rounds: int,
    warmup: int,
    servers: Callable[[], Sequence[int]],
) -> None:
    """``benchmark.pedantic`` of ``round_``; records ``cpu_shares`` in ``extra_info``, warm-up
    rounds included. ``servers()`` gives the server processes' pids; it is asked again after the
    rounds, and a process that started meanwhile counts whole (its CPU before was 0)."""
    pids = servers()
    before = cpu_snapshot(pids)
    benchmark.pedantic(round_, rounds=rounds, warmup_rounds=warmup, iterations=1)
    after = cpu_snapshot(sorted({*pids, *servers()}))
    benchmark.extra_info.update(cpu_shares(before, after))


def in_turn(names: Sequence[str], turn: int) -> list[str]:
    """``names`` starting from the ``turn``-th (cyclically): which goes first rotates from round
    to round."""
    first = turn % len(names)
    return [*names[first:], *names[:first]]


def spread(samples: Sequence[float]) -> dict[str, float]:
    """The median, quartiles and minimum of ``samples`` (at least two)."""
    q1, median, q3 = statistics.quantiles(samples, n=4)
    return {"median": median, "q1": q1, "q3": q3, "min": min(samples)}


def ratio_summary(ratios: Sequence[float]) -> dict[str, float]:
    """The median and quartiles of per-round ratios, to three decimals."""
    q1, median, q3 = statistics.quantiles(ratios, n=4)
    return {"median": round(median, 3), "q1": round(q1, 3), "q3": round(q3, 3)}


def percentiles(samples: Sequence[float]) -> dict[str, float]:
    """p50 and p99 of samples in seconds, in ns."""
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return {"p50_ns": cuts[49] * 1e9, "p99_ns": cuts[98] * 1e9}


CDF_PERCENTS = (0, 1, 2, 5, 10, 20, 25, 30, 40, 50, 60, 70, 75, 80, 90, 95, 98, 99, 99.5, 99.9, 100)


def cdf_ns(samples: Sequence[float]) -> list[tuple[float, int]]:
    """The distribution of samples in seconds, compactly: ``(percent, ns)`` at each of
    ``CDF_PERCENTS`` (0 and 100 being the minimum and the maximum), for plots.py's curves."""
    cuts = statistics.quantiles(samples, n=1000, method="inclusive")
    points = [min(samples), *cuts, max(samples)]  # points[k] is the (k / 10)th percentile
    return [(percent, round(points[round(percent * 10)] * 1e9)) for percent in CDF_PERCENTS]


def interleaved_summary(
    ours_ns: Sequence[float], theirs_ns: Sequence[float], calls: int
) -> dict[str, Any]:
    """What an interleaved benchmark records: each side's median and minimum per call (rounds
    of ``calls`` calls, warm-up already dropped) and the median of the per-round ratios
    theirs / ours, with its quartiles."""
    ratios = [t / o for o, t in zip(ours_ns, theirs_ns, strict=True)]
    return {
        "ours_ns": statistics.median(ours_ns) / calls,
        "theirs_ns": statistics.median(theirs_ns) / calls,
        "ours_min_ns": min(ours_ns) / calls,
        "theirs_min_ns": min(theirs_ns) / calls,
        "ratio": statistics.median(ratios),
        "ratio_q1_q3": statistics.quantiles(ratios, n=4)[::2],
    }
