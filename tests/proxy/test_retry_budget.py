"""RetryBudget: a token bucket filled by a share of the dispatches and by time, checked against
a reference model kept in exact fractions."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardline.retry_budget import RetryBudget

# (dispatches since the last ask, seconds since the last ask) of each ask for a retry
asks = st.lists(
    st.tuples(st.integers(0, 50), st.sampled_from([0.0, 0.01, 0.1, 0.5, 2.0])), max_size=60
)


class Model:
    """The bucket as the docstring states it, in fractions: full at the first ask, then
    ``ratio`` a dispatch and ``per_second`` a second, capped at ``per_second * window``."""

    def __init__(self, ratio: float, per_second: float, window: float) -> None:
        self.ratio, self.per_second = Fraction(ratio), Fraction(per_second)
        self.capacity = self.per_second * Fraction(window)
        self.tokens: Fraction | None = None

    def take(self, dispatches: int, seconds: float) -> bool:
        if self.tokens is None:
            tokens = self.capacity
        else:
            tokens = self.tokens + self.ratio * dispatches + self.per_second * Fraction(seconds)
        tokens = min(tokens, self.capacity)
        allowed = tokens >= 1
        self.tokens = tokens - 1 if allowed else tokens
        return allowed


@given(
    ratio=st.sampled_from([0.0, 0.2, 0.5, 1.0]),
    per_second=st.sampled_from([0.0, 0.5, 10.0]),
    window=st.sampled_from([1.0, 10.0]),
    sequence=asks,
)
def test_the_budget_allows_what_the_model_allows(
    ratio: float, per_second: float, window: float, sequence: list[tuple[int, float]]
) -> None:
    budget = RetryBudget(ratio=ratio, per_second=per_second, window=window)
    model = Model(ratio, per_second, window)
    dispatches, now = 0, 1000.0
    for more, seconds in sequence:
        dispatches += more
        now += seconds
        assert budget.take(dispatches, now) == model.take(more, seconds)
    allowed = sum(1 for _ in sequence) - budget.refused
    assert (budget.spent, budget.spent + budget.refused) == (allowed, len(sequence))


def test_a_sick_cluster_gets_a_fifth_of_the_calls_as_retries() -> None:
    budget = RetryBudget()  # ratio 0.2, 10 a second, over 10 s: 100 tokens at most
    allowed = sum(budget.take(calls, 0.0) for calls in range(1, 10_001))
    assert allowed == 100 + 2_000 - 1  # the full bucket, then a fifth of 10,000 calls


@pytest.mark.parametrize(
    ("field", "value"),
    [("ratio", -0.1), ("ratio", float("inf")), ("per_second", True), ("window", 0.0)],
)
def test_a_bad_setting_is_refused_naming_it(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        RetryBudget(**{field: value})  # type: ignore[arg-type]
