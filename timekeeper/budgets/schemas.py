"""Budgets, defaults and grants as the API takes and answers them."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gpuaccounting.wire import BudgetState
from timekeeper.budgets.periods import PeriodKind
from timekeeper.schemas import Amount, OptionalAmount, StoredText

LARGEST_AMOUNT = Decimal("1e12")  # a trillion GPU-minutes: anything above is a typo


class BudgetIn(BaseModel):
    """PUT /namespaces/{ns}/budget and PUT /defaults. A null budget means unlimited."""

    model_config = ConfigDict(extra="forbid")

    budget_gpu_minutes: Decimal | None = Field(ge=0, le=LARGEST_AMOUNT, allow_inf_nan=False)
    period: PeriodKind = PeriodKind.MONTHLY
    warn_at_fraction: Decimal = Field(default=Decimal("0.8"), gt=0, le=1, decimal_places=4)
    max_gpu_share_per_pod: Decimal | None = Field(default=None, gt=0, le=10_000, allow_inf_nan=False)
    concurrent_gpu_limit: Decimal | None = Field(default=None, gt=0, le=1_000_000, allow_inf_nan=False)


class BudgetConfigOut(BaseModel):
    budget_gpu_minutes: OptionalAmount
    period: PeriodKind
    warn_at_fraction: Amount
    max_gpu_share_per_pod: OptionalAmount
    concurrent_gpu_limit: OptionalAmount


class PeriodOut(BaseModel):
    kind: PeriodKind
    start: datetime | None  # None for `none`: one open-ended period
    end: datetime | None


class NamespaceBudgetOut(BaseModel):
    namespace: str
    source: Literal["namespace", "default"]
    period: PeriodOut
    budget_gpu_minutes: OptionalAmount
    granted_gpu_minutes: Amount
    used_gpu_minutes: Amount
    remaining_gpu_minutes: OptionalAmount
    state: BudgetState
    priority_class: str
    warn_at_fraction: Amount
    max_gpu_share_per_pod: OptionalAmount
    concurrent_gpu_limit: OptionalAmount


class GrantIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # At most the ledger's scale: a finer amount would be stored as 0, which the table refuses.
    gpu_minutes: Decimal = Field(gt=0, le=LARGEST_AMOUNT, decimal_places=9, allow_inf_nan=False)
    reason: StoredText = Field(min_length=1, max_length=1000)


class GrantOut(BaseModel):
    id: int
    namespace: str
    gpu_minutes: Amount
    reason: str
    granted_by: str
    granted_at: datetime
    period: PeriodOut
    budget: NamespaceBudgetOut
