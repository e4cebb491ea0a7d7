"""The budget-state rule, in one place: a namespace's state from its figures, a pool's from its members',
and a member's the worse of its pool's and its cap's."""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal

from gpuaccounting.wire import BudgetState
from timekeeper.domain.figures import MemberFigures, NamespaceFigures, used_on

# Worst last: a member takes the worse of its pool's state and its cap's.
SEVERITY: tuple[BudgetState, ...] = ("unlimited", "in_budget", "warning", "exhausted")


def pool_state(budget: Decimal, warn_at_fraction: Decimal, members: Sequence[MemberFigures]) -> BudgetState:
    used = sum((member.used_gpu_minutes for member in members), Decimal(0))
    granted = sum((member.granted_gpu_minutes for member in members), Decimal(0))
    return budget_state(budget, granted, used, warn_at_fraction)


def member_state(pool: BudgetState, member: MemberFigures, warn_at_fraction: Decimal) -> BudgetState:
    if member.cap_gpu_minutes is None:
        return pool
    cap = budget_state(
        member.cap_gpu_minutes, member.granted_gpu_minutes, member.used_gpu_minutes, warn_at_fraction
    )
    return max(pool, cap, key=SEVERITY.index)


def budget_state(
    budget: Decimal | None, granted: Decimal, used: Decimal, warn_at_fraction: Decimal
) -> BudgetState:
    """Exhausted when nothing remains, warning from warn_at_fraction of budget + grants, unlimited
    without a budget."""
    if budget is None:
        return "unlimited"
    available = budget + granted
    if available - used <= 0:
        return "exhausted"
    if used >= warn_at_fraction * available:
        return "warning"
    return "in_budget"


def figures_state(figures: NamespaceFigures) -> BudgetState:
    config = figures.config
    return budget_state(
        config.budget_gpu_minutes,
        figures.granted_gpu_minutes,
        figures.used_gpu_minutes,
        config.warn_at_fraction,
    )


def model_states(figures: NamespaceFigures) -> dict[str, BudgetState]:
    """Each budgeted GPU model's state, by the same rule from its own figures (per-model budgets take no
    grants)."""
    config = figures.config
    return {
        model: budget_state(budget, Decimal(0), used_on(figures.model_used, model), config.warn_at_fraction)
        for model, budget in sorted(config.models.items())
    }


def exhausted_models(states: dict[str, BudgetState]) -> list[str]:
    """The models whose budget is exhausted, sorted (the admission snapshot's `exhausted_models`)."""
    return sorted(model for model, state in states.items() if state == "exhausted")
