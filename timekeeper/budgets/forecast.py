"""The forecast rule: a namespace's burn rate over a recent window and when, at that rate, what remains
of its budget (grants included) runs out. Pure, so the rule is tested on its own (tests read as rules)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

RATE_PLACES = Decimal("1e-9")  # the ledger's scale
# An open-ended period's horizon: a forecast further out than any time the API takes is no forecast.
HORIZON = datetime(9000, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Forecast:
    window_minutes: int
    burn_rate_gpu_minutes_per_hour: Decimal
    exhausts_at: datetime | None  # None: not within this period at this rate


def forecast(
    now: datetime,
    window: timedelta,
    burned_gpu_minutes: Decimal,
    remaining_gpu_minutes: Decimal | None,
    period_end: datetime | None,
) -> Forecast:
    """`burned_gpu_minutes`: charged in [now - window, now). The rate is that amount per hour of the
    window; the namespace exhausts when `remaining` (budget + grants - used; None: unlimited) reaches
    zero at that rate. No exhaustion is forecast without burn, without a budget, when the period ends
    first (a new period brings a fresh budget), or when nothing remains already: the state says
    `exhausted` then, as it always has."""
    hours = Decimal(window.total_seconds()) / 3600
    rate = (burned_gpu_minutes / hours).quantize(RATE_PLACES)
    window_minutes = int(window.total_seconds() // 60)
    if remaining_gpu_minutes is None or remaining_gpu_minutes <= 0 or rate <= 0:
        return Forecast(window_minutes, rate, None)
    seconds_left = remaining_gpu_minutes / rate * 3600
    if seconds_left >= Decimal(((period_end or HORIZON) - now).total_seconds()):
        return Forecast(window_minutes, rate, None)
    exhausts_at = now + timedelta(seconds=float(seconds_left))
    return Forecast(window_minutes, rate, exhausts_at.replace(microsecond=0))
