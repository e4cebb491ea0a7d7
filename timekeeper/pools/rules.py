"""The pool rule, decided without the database: a member is exhausted when its pool or its cap is (a
warning likewise), the pool counting every member's use and grants in the pool's period, the cap the
member's own."""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal

from gpuaccounting.wire import BudgetState
from timekeeper.budgets.periods import budget_state
from timekeeper.pools.repository import MemberFigures

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
