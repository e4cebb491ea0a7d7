"""One backoff rule: full jitter under a bound that doubles per failure up to the cap; success resets it."""

from __future__ import annotations

import random

import pytest

from gpuaccounting.backoff import Backoff


def bounds(backoff: Backoff, failures: int) -> list[float]:
    return [backoff.next_delay() for _ in range(failures)]


def test_the_bound_doubles_per_failure_up_to_the_cap():
    backoff = Backoff(0.5, 5.0, rng=lambda: 1.0)  # the top of the range: the bound itself
    assert bounds(backoff, 6) == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]


def test_full_jitter_spans_zero_to_the_bound():
    assert bounds(Backoff(1.0, 60.0, rng=lambda: 0.0), 3) == [0.0, 0.0, 0.0]
    assert bounds(Backoff(1.0, 60.0, rng=lambda: 0.25), 4) == [0.25, 0.5, 1.0, 2.0]


def test_delays_stay_within_the_bound_with_the_real_generator():
    backoff = Backoff(1.0, 8.0, rng=random.Random(7).random)
    delays = bounds(backoff, 200)
    assert all(0 <= d <= 8.0 for d in delays)
    assert max(delays[10:]) > 4.0  # the range reaches up to the cap, not only half of it (equal jitter)
    assert min(delays[10:]) < 4.0  # ... and down below half of it


def test_a_success_starts_the_run_again():
    backoff = Backoff(1.0, 60.0, rng=lambda: 1.0)
    bounds(backoff, 4)
    backoff.reset()
    assert bounds(backoff, 2) == [1.0, 2.0]


def test_a_long_outage_never_overflows():
    backoff = Backoff(1.0, 30.0, rng=lambda: 1.0)
    assert bounds(backoff, 5000)[-1] == 30.0


@pytest.mark.parametrize(("base", "cap"), [(0, 1), (-1, 1), (2, 1)])
def test_a_meaningless_range_is_refused(base: float, cap: float):
    with pytest.raises(ValueError, match="0 < base <= cap"):
        Backoff(base, cap)
