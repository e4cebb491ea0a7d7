"""Budget periods, anchored in UTC: days from midnight, ISO weeks from Monday, calendar months; `none`
is one open-ended period."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from enum import StrEnum
from functools import lru_cache

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MICROSECOND = timedelta(microseconds=1)  # datetime's resolution: [start, end) ends at end - 1 µs
Interval = tuple[datetime, datetime]


class PeriodKind(StrEnum):
    DAILY = "daily"
    WEEKLY = "weekly"
    MONTHLY = "monthly"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class Period:
    kind: PeriodKind
    start: datetime
    end: datetime | None  # None: open-ended (`none`)


def period_containing(kind: PeriodKind, moment: datetime) -> Period:
    return _period_containing_day(kind, moment.astimezone(UTC).date())


# A period depends on the UTC day alone, and every budget read asks for five (the current one of each
# kind and the namespace's): cached, they are a dictionary lookup instead of ~5 datetime calls each.
@lru_cache(maxsize=64, typed=True)  # typed: a plain "daily" is no PeriodKind.DAILY here
def _period_containing_day(kind: PeriodKind, day: date) -> Period:
    midnight = datetime(day.year, day.month, day.day, tzinfo=UTC)
    if kind is PeriodKind.DAILY:
        return Period(kind, midnight, midnight + timedelta(days=1))
    if kind is PeriodKind.WEEKLY:
        monday = midnight - timedelta(days=midnight.weekday())
        return Period(kind, monday, monday + timedelta(days=7))
    if kind is PeriodKind.MONTHLY:
        first = midnight.replace(day=1)
        following = (
            first.replace(year=first.year + 1, month=1)
            if first.month == 12
            else first.replace(month=first.month + 1)
        )
        return Period(kind, first, following)
    return Period(kind, EPOCH, None)


def periods_overlapping(kind: PeriodKind, start: datetime, end: datetime) -> list[Period]:
    """The periods that [start, end) touches, in order: size the range with `count_periods` first."""
    periods = [period_containing(kind, start)]
    while periods[-1].end is not None and periods[-1].end < end:
        periods.append(period_containing(kind, periods[-1].end))
    return periods


def count_periods(kind: PeriodKind, start: datetime, end: datetime) -> int:
    """How many periods [start, end) touches (start < end): what periods_overlapping would list, counted
    by arithmetic on the first and last day, so that a request's range is sized before any is built."""
    return (
        _ordinal(kind, (end - _ONE_MICROSECOND).astimezone(UTC).date())
        - _ordinal(kind, start.astimezone(UTC).date())
        + 1
    )


def _ordinal(kind: PeriodKind, day: date) -> int:
    """The number of the period of `kind` that holds `day`, counted from year 1's first."""
    if kind is PeriodKind.DAILY:
        return day.toordinal()
    if kind is PeriodKind.WEEKLY:
        return (day.toordinal() - 1) // 7  # 0001-01-01 was a Monday
    if kind is PeriodKind.MONTHLY:
        return day.year * 12 + day.month
    return 0


def current_period_starts(moment: datetime) -> dict[PeriodKind, datetime]:
    """The start of the current period of every kind, for queries over many namespaces at once."""
    return {kind: period_containing(kind, moment).start for kind in PeriodKind}
