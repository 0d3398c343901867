"""A reference model of the load least-loaded weighs (the pool's ``load(uid)``) and of its
choice between two workers (``less_loaded_of``), as the balancer's docstring states them: a
worker's latency average moved toward the pool's mean latency by ``age / (MEMORY + age)``,
``age`` the seconds since its last sample; the pool's mean before its first sample; the cost
``latency x (in flight + 1)``, then fewer in flight. Written with the pool's own ``f64``
operations, in the same order, so its figures equal the pool's to the bit."""

from __future__ import annotations

from dataclasses import dataclass

LATENCY_WEIGHT = 0.2  # a worker's average: weight of each new sample
POOL_WEIGHT = 1 / 32  # the pool's mean: weight of each sample, every worker's
MEMORY = 0.1  # seconds since its last sample that take an average halfway to the mean


def blend(average: float | None, sample: float, weight: float) -> float:
    return sample if average is None else average + weight * (sample - average)


def weighed_latency(latency: float | None, sampled: int, now: int, mean: float | None) -> float:
    """The latency least-loaded weighs at ``now`` (pool clock, ns) a worker by whose average
    ``latency`` was last sampled at ``sampled``."""
    if latency is None or mean is None:
        known = mean if latency is None else latency
        return 0.0 if known is None else known
    age = max(0, now - sampled) * 1e-9
    return latency + (mean - latency) * (age / (MEMORY + age))


def cost(load: tuple[int, float]) -> tuple[float, int]:
    in_flight, latency = load
    return latency * (in_flight + 1), in_flight


@dataclass
class Loads:
    """The latency figures of a pool's workers, by position, and the pool's mean."""

    latency: list[float | None]
    sampled: list[int]
    mean: float | None = None

    @classmethod
    def of(cls, workers: int) -> Loads:
        return cls([None] * workers, [0] * workers)

    def sample(self, worker: int, seconds: float, now: int) -> None:
        self.latency[worker] = blend(self.latency[worker], seconds, LATENCY_WEIGHT)
        self.sampled[worker] = now
        self.mean = blend(self.mean, seconds, POOL_WEIGHT)

    def weighed(self, worker: int, now: int) -> float:
        return weighed_latency(self.latency[worker], self.sampled[worker], now, self.mean)
