"""The charging arithmetic: GPU share times the minutes not yet charged, each minute at its GPU model's
weight then, split at period boundaries. Exact."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

from timekeeper.domain.periods import Period, PeriodKind, periods_overlapping
from timekeeper.domain.weights import UNWEIGHTED, WeightTimeline, microseconds

NANO = Decimal("0.000000001")
MICROSECONDS_PER_MINUTE = Decimal(60_000_000)


def gpu_minutes(share: Decimal, duration: timedelta) -> Decimal:
    """share x minutes, rounded half-up to the nano-GPU-minute (the ledger's scale; PostgreSQL's round())."""
    return (share * microseconds(duration) / MICROSECONDS_PER_MINUTE).quantize(NANO, rounding=ROUND_HALF_UP)


def split_charge(
    share: Decimal,
    uncovered: Iterable[tuple[datetime, datetime]],
    kind: PeriodKind,
    weights: WeightTimeline = UNWEIGHTED,
) -> list[tuple[Period, Decimal]]:
    """The charge of each period the uncovered time falls into, in period order (the lock order): share x
    the period's minutes, each at the weight in force then, rounded once per period. The weighted time is
    summed in integers (WeightTimeline.weighted_microseconds) and made a Decimal once per period."""
    weighted: dict[datetime, tuple[Period, int]] = {}
    for lower, upper in uncovered:
        for period in periods_overlapping(kind, lower, upper):
            start, end = max(lower, period.start), min(upper, period.end or upper)
            if end > start:
                _, seen = weighted.get(period.start, (period, 0))
                weighted[period.start] = (period, seen + weights.weighted_microseconds(start, end))
    scale = -weights.scale
    return [
        (
            period,
            (share * Decimal(units).scaleb(scale) / MICROSECONDS_PER_MINUTE).quantize(
                NANO, rounding=ROUND_HALF_UP
            ),
        )
        for _, (period, units) in sorted(weighted.items())
    ]
