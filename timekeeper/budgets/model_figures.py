"""The per-model budgets' answer: each GPU model's budget, raw use, state and forecast."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from decimal import Decimal

from gpuaccounting.wire import BudgetState
from timekeeper.budgets.forecast import forecast
from timekeeper.budgets.schemas import ModelBudgetOut, ModelForecastOut
from timekeeper.domain.figures import used_on
from timekeeper.settings import Settings


def forecast_window(settings: Settings) -> timedelta:
    return timedelta(minutes=settings.forecast_window_minutes)


def models_out(
    budgets: Mapping[str, Decimal],
    model_used: Mapping[str, Decimal],
    now: datetime,
    states: Mapping[str, BudgetState],
    burned: Mapping[str, Decimal],
    settings: Settings,
    period_end: datetime | None,
) -> dict[str, ModelBudgetOut]:
    """Each budgeted model's figures: its budget, the raw GPU-minutes used on it, its state (decided
    elsewhere: a pool member's is its pool's) and its forecast from its own burn."""
    answer: dict[str, ModelBudgetOut] = {}
    for model, budget in sorted(budgets.items()):
        used = used_on(model_used, model)
        remaining = budget - used
        outlook = forecast(now, forecast_window(settings), used_on(burned, model), remaining, period_end)
        answer[model] = ModelBudgetOut(
            budget_gpu_minutes=budget,
            used_gpu_minutes=used,
            remaining_gpu_minutes=remaining,
            state=states[model],
            forecast=ModelForecastOut(
                window_minutes=outlook.window_minutes,
                burn_rate_gpu_minutes_per_hour=outlook.burn_rate_gpu_minutes_per_hour,
                exhausts_at=outlook.exhausts_at,
            ),
        )
    return answer
