"""The pure arithmetic under the charging rules: periods anchored in UTC, exact splits, budget states."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal

import pytest

from timekeeper.domain.periods import EPOCH, PeriodKind, period_containing, periods_overlapping
from timekeeper.domain.states import budget_state
from timekeeper.usage.charging import gpu_minutes, split_charge


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


@pytest.mark.parametrize(
    ("kind", "moment", "start", "end"),
    [
        (PeriodKind.DAILY, utc(2026, 3, 18, 23, 59), utc(2026, 3, 18), utc(2026, 3, 19)),
        (
            PeriodKind.WEEKLY,
            utc(2026, 3, 22, 23),
            utc(2026, 3, 16),
            utc(2026, 3, 23),
        ),  # Sunday: week of Monday 16th
        (PeriodKind.WEEKLY, utc(2026, 3, 23), utc(2026, 3, 23), utc(2026, 3, 30)),
        (PeriodKind.MONTHLY, utc(2026, 2, 28, 12), utc(2026, 2, 1), utc(2026, 3, 1)),
        (PeriodKind.MONTHLY, utc(2026, 12, 31, 23), utc(2026, 12, 1), utc(2027, 1, 1)),
        (PeriodKind.NONE, utc(2026, 5, 5), EPOCH, None),
    ],
)
def test_periods_are_anchored_in_utc(
    kind: PeriodKind, moment: datetime, start: datetime, end: datetime | None
) -> None:
    period = period_containing(kind, moment)

    assert (period.start, period.end) == (start, end)


def test_a_moment_with_another_offset_belongs_to_its_utc_day() -> None:
    tokyo_morning = datetime(2026, 3, 19, 8, 0, tzinfo=timezone(timedelta(hours=9)))

    assert period_containing(PeriodKind.DAILY, tokyo_morning).start == utc(2026, 3, 18)


def test_periods_are_remembered_by_their_utc_day_not_the_moments_own() -> None:
    """period_containing keeps the periods of a UTC day (budgets.periods._period_containing_day): the
    same local date on either side of UTC midnight is two days, and a plain string is no period kind."""
    plus_one, minus_one = timezone(timedelta(hours=1)), timezone(timedelta(hours=-1))
    late = period_containing(PeriodKind.DAILY, datetime(2026, 3, 19, 0, 30, tzinfo=plus_one))
    early = period_containing(PeriodKind.DAILY, datetime(2026, 3, 18, 23, 30, tzinfo=minus_one))
    unknown = period_containing("daily", utc(2026, 3, 18, 12))  # type: ignore[arg-type]

    assert (late.start, early.start) == (utc(2026, 3, 18), utc(2026, 3, 19))
    assert (unknown.start, unknown.end) == (EPOCH, None)
    assert period_containing(PeriodKind.DAILY, utc(2026, 3, 18, 12)).end == utc(2026, 3, 19)


def test_an_interval_over_two_boundaries_touches_three_periods() -> None:
    periods = periods_overlapping(PeriodKind.DAILY, utc(2026, 3, 1, 23), utc(2026, 3, 3, 1))

    assert [period.start.day for period in periods] == [1, 2, 3]


def test_the_charge_is_split_at_the_month_boundary() -> None:
    uncovered = [(utc(2026, 3, 31, 23, 50), utc(2026, 4, 1, 0, 20))]

    split = split_charge(Decimal("0.5"), uncovered, PeriodKind.MONTHLY)

    assert [(period.start.month, amount) for period, amount in split] == [(3, Decimal(5)), (4, Decimal(10))]


def test_pieces_of_one_period_are_summed_before_rounding() -> None:
    start = utc(2026, 3, 18, 10)
    uncovered = [
        (start, start + timedelta(seconds=1)),
        (start + timedelta(seconds=5), start + timedelta(seconds=6)),
    ]

    [(_, amount)] = split_charge(Decimal(1) / 3, uncovered, PeriodKind.DAILY)

    assert amount == Decimal("0.011111111")  # 1/3 x 2 s / 60, rounded once


def test_gpu_minutes_are_exact_to_the_microsecond() -> None:
    assert gpu_minutes(Decimal("0.125"), timedelta(minutes=8)) == Decimal(1)
    assert gpu_minutes(Decimal(7), timedelta(microseconds=60)) == Decimal("0.000007000")


@pytest.mark.parametrize(
    ("budget", "granted", "used", "state"),
    [
        (None, 0, 10**9, "unlimited"),
        (100, 0, 0, "in_budget"),
        (100, 0, 79.99, "in_budget"),
        (100, 0, 80, "warning"),
        (100, 0, 99.99, "warning"),
        (100, 0, 100, "exhausted"),
        (100, 50, 100, "in_budget"),
        (100, 50, 120, "warning"),
        (0, 0, 0, "exhausted"),
    ],
)
def test_budget_states(budget: int | None, granted: int, used: float, state: str) -> None:
    assert (
        budget_state(
            None if budget is None else Decimal(budget), Decimal(granted), Decimal(str(used)), Decimal("0.8")
        )
        == state
    )
