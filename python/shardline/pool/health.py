"""Passive health of the pool's workers: the policy that ejects a sick worker
(:class:`HealthPolicy`) and what the pool reports of one (:class:`WorkerHealth`).

The rules themselves run in the pool (``WorkerPool.configure_health``); see
``docs/architecture.md``, "Passive health", for the state machine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

__all__ = ["HealthPolicy", "HealthState", "WorkerHealth"]

HealthState = Literal["healthy", "ejected", "probation", "probing"]


def _check(name: str, value: float, ok: bool, expected: str) -> None:
    if not ok:
        raise ValueError(f"HealthPolicy.{name} must be {expected}, not {value!r}")


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    """When the pool ejects a worker, and for how long.

    A worker is ejected (offered to no balancer) when:

    - ``failures`` dispatches in a row failed (a transport error) or missed their deadline;
    - its success rate, a moving average of outcomes (1 a success, 0 a failure or a deadline
      miss; weight 0.1, starting at 1), falls below ``success_rate`` on a failure;
    - it is stuck: with calls in flight, none has completed (and none started with the worker
      idle) for longer than ``max(stuck_floor, stuck_multiple * its latency average)``, once
      it has a latency average;
    - its latency average is above ``latency_outlier`` times the median of the visible
      workers that have one (at least 3 of them), and above ``stuck_floor``.

    A worker ejected as stuck that then completes a call (one it held) is re-admitted at
    once, its ejection not counted towards the next: it was slow, not stuck.

    Its ``n``-th ejection lasts ``min(base_ejection * n, max_ejection)`` seconds; ``n`` drops by
    one for each ``max_ejection`` spent healthy since its last re-admission. Once the ejection
    has passed, the next dispatch handed to it is its probe: a success re-admits it, a failure
    or a deadline miss ejects it again. At most ``max(1, floor(max_ejected_share * workers))``
    workers are ejected (or waiting for a probe) at once; a worker over that stays in.

    The defaults adapt gRPC's outlier detection (proposal A50) and Envoy's to workers on the
    same host or network, which restart in well under a second and whose calls take
    milliseconds:

    - ``failures=5``: A50's and Envoy's consecutive-failure threshold, as is.
    - ``success_rate=0.6``: a worker failing every other call crosses it on its 7th failure
      (the average falls 1.0, 0.9, 0.91, 0.819… and is 0.594 after the 7th), within 10 of
      its failures, while one failure in 10 keeps it above 0.84.
    - ``stuck_multiple=8.0``, ``stuck_floor=0.02``: no call completing for 8 times the recent
      latency is far past a healthy worker's tail, while a worker answering in 2.5 ms or less
      that stops under load is ejected 20 to 40 ms after it stops (the pool looks every
      10 ms), long before any deadline. The
      floor keeps the pauses a fast worker has anyway (a garbage collection, a scheduler
      hiccup: milliseconds) from ejecting it.
    - ``base_ejection=1.0``, ``max_ejection=30.0``: A50 ejects for 30 s times the ejections
      capped at 300 s, sized for hosts that reboot; a local worker restarts or recovers in
      well under a second, and a second of a 4-worker pool missing a quarter of its capacity
      costs more than one failed probe a second. The same 1:10 shape, scaled down by 30.
    - ``max_ejected_share=0.1``: A50's 10%, always at least one worker.
    - ``latency_outlier=5.0``: a worker 5 times slower than the median is a gray failure
      (a 10 times slower one is the issue's benchmark case); Envoy's success-rate stdev factor
      plays that part there, which needs far more hosts than a local pool has.
    """

    failures: int = 5
    success_rate: float = 0.6
    stuck_multiple: float = 8.0
    stuck_floor: float = 0.02
    base_ejection: float = 1.0
    max_ejection: float = 30.0
    max_ejected_share: float = 0.1
    latency_outlier: float = 5.0

    def __post_init__(self) -> None:
        _check(
            "failures",
            self.failures,
            isinstance(self.failures, int)
            and not isinstance(self.failures, bool)
            and 1 <= self.failures < 2**32,
            "an int of at least 1",
        )
        for name in (
            "success_rate",
            "stuck_multiple",
            "stuck_floor",
            "base_ejection",
            "max_ejection",
            "max_ejected_share",
            "latency_outlier",
        ):
            value = getattr(self, name)
            _check(
                name,
                value,
                isinstance(value, (int, float))
                and not isinstance(value, bool)
                and math.isfinite(value),
                "a finite number",
            )
        _check("success_rate", self.success_rate, 0 <= self.success_rate <= 1, "in [0, 1]")
        _check("stuck_multiple", self.stuck_multiple, self.stuck_multiple >= 1, "at least 1")
        _check("stuck_floor", self.stuck_floor, self.stuck_floor > 0, "positive")
        _check("base_ejection", self.base_ejection, self.base_ejection > 0, "positive")
        _check(
            "max_ejection",
            self.max_ejection,
            self.max_ejection >= self.base_ejection,
            f"at least base_ejection ({self.base_ejection!r})",
        )
        _check(
            "max_ejected_share",
            self.max_ejected_share,
            0 <= self.max_ejected_share <= 1,
            "in [0, 1]",
        )
        _check("latency_outlier", self.latency_outlier, self.latency_outlier > 1, "above 1")


@dataclass(frozen=True, slots=True)
class WorkerHealth:
    """One worker's health as the pool saw it when asked (``WorkerPool.health(uid)``).

    ``state`` is "healthy"; "ejected" (for ``ejected_for`` more seconds); "probation" (its
    ejection has passed, and the next dispatch handed to it is its probe); or "probing" (the
    probe is in flight, and the worker hidden until it ends). ``consecutive_failures`` counts
    failures and deadline misses in a row; ``in_flight`` and ``latency`` (the average in
    seconds, 0.0 before any) are its load; ``success_rate`` the moving average of outcomes;
    ``times_ejected`` its ejections, less those decayed while healthy; ``reason`` why it was
    last ejected ("failures", "success-rate", "stuck", "latency"; "" if never).
    """

    state: HealthState
    consecutive_failures: int
    in_flight: int
    latency: float
    success_rate: float
    times_ejected: int
    ejected_for: float
    reason: str
