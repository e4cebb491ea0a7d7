"""The charging arithmetic: GPU share times the minutes not yet charged, split at period boundaries. Exact."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

from timekeeper.budgets.periods import Period, PeriodKind, periods_overlapping

NANO = Decimal("0.000000001")
MICROSECONDS_PER_MINUTE = Decimal(60_000_000)


def _microseconds(delta: timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def gpu_minutes(share: Decimal, duration: timedelta) -> Decimal:
    """share x minutes, rounded half-up to the nano-GPU-minute (the ledger's scale; PostgreSQL's round())."""
    return (share * _microseconds(duration) / MICROSECONDS_PER_MINUTE).quantize(NANO, rounding=ROUND_HALF_UP)


def split_charge(
    share: Decimal, uncovered: Iterable[tuple[datetime, datetime]], kind: PeriodKind
) -> list[tuple[Period, Decimal]]:
    """The charge of each period the uncovered time falls into, in period order (the lock order)."""
    durations: dict[datetime, tuple[Period, timedelta]] = {}
    for lower, upper in uncovered:
        for period in periods_overlapping(kind, lower, upper):
            overlap = min(upper, period.end or upper) - max(lower, period.start)
            if overlap > timedelta(0):
                _, seen = durations.get(period.start, (period, timedelta(0)))
                durations[period.start] = (period, seen + overlap)
    return [(period, gpu_minutes(share, duration)) for _, (period, duration) in sorted(durations.items())]
