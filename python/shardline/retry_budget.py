"""`RetryBudget`: how many retries a proxy may send, so that a sick cluster is not hammered."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from shardline.checks import check_seconds, refusal

__all__ = ["RetryBudget"]

# A sum of deposits that makes a whole token in arithmetic may fall a rounding error short of
# one in floating point: it counts as one.
_WHOLE_TOKEN = 1.0 - 1e-9


@dataclass(slots=True)
class RetryBudget:
    """A token bucket of retries, shared by every call of one :class:`~shardline.WorkerProxy`.

    Every dispatch deposits ``ratio`` of a token and time deposits ``per_second`` tokens a
    second; the bucket holds at most ``per_second * window`` tokens. A retry (a second attempt
    after a failure before sending, an idempotent task sent again, a hedge) takes one token;
    with none left the call fails instead of retrying. The defaults (a fifth of the
    dispatches, plus ten a second, over ten seconds) are Finagle's retry budget: on a healthy
    cluster retries are rare and always allowed; when every worker fails, retries add at most
    a fifth to the load plus the floor, rather than multiplying it by the pool's size.

    ``ValueError``, naming the field, for a ``ratio`` or ``per_second`` that is negative or not
    finite, or a ``window`` that is not a positive number of seconds.

    Implementation notes:
        Deposits are made lazily, when a retry asks: the proxy passes its count of
        dispatches so far and the time, and the bucket adds what came in since the last ask,
        so a call that needs no retry costs nothing here.
    """

    ratio: float = 0.2
    per_second: float = 10.0
    window: float = 10.0
    _tokens: float = field(default=-1.0, init=False, repr=False)
    _dispatches: int = field(default=0, init=False, repr=False)
    _at: float = field(default=0.0, init=False, repr=False)
    _spent: int = field(default=0, init=False, repr=False)
    _refused: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("ratio", "per_second"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value < 0
            ):
                raise refusal(value, (int, float))(
                    f"RetryBudget {name} must be a finite number >= 0, not {value!r}"
                )
        check_seconds("window", self.window)

    @property
    def spent(self) -> int:
        """Retries this budget allowed."""
        return self._spent

    @property
    def refused(self) -> int:
        """Retries this budget refused."""
        return self._refused

    def take(self, dispatches: int, now: float) -> bool:
        """Takes a token for one retry if there is one; ``dispatches`` is the proxy's count of
        dispatches so far, ``now`` a monotonic reading in seconds."""
        capacity = self.per_second * self.window
        if self._tokens < 0:  # the first ask: a full bucket, and the count from here
            tokens = capacity
        else:
            tokens = (
                self._tokens
                + self.ratio * (dispatches - self._dispatches)
                + self.per_second * max(now - self._at, 0.0)
            )
        self._dispatches = dispatches
        self._at = now
        tokens = min(tokens, capacity)
        if tokens >= _WHOLE_TOKEN:
            self._tokens = tokens - 1.0
            self._spent += 1
            return True
        self._tokens = tokens
        self._refused += 1
        return False
