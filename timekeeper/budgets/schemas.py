"""Budgets, defaults and grants as the API takes and answers them."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator

from gpuaccounting.admission_state import PriorityPolicy, UserClassRule
from gpuaccounting.names import DNS_SUBDOMAIN
from gpuaccounting.wire import BudgetState
from timekeeper.domain.figures import RunningPodAction
from timekeeper.domain.periods import PeriodKind
from timekeeper.schemas import (
    LARGEST_AMOUNT,
    Amount,
    DecimalIn,
    OptionalAmount,
    OptionalDecimalIn,
    PeriodOut,
    StoredText,
    Timestamp,
)

INT32_MAX = 2**31 - 1  # a PriorityClass value is an int32

PriorityClassName = Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)]
Source = Literal["namespace", "default"]


class PriorityPolicyBody(BaseModel):
    """How the webhook chooses a GPU pod's PriorityClass (gpuaccounting/admission_state.py). Every field
    is required: an enforcement policy is stated whole, never half-guessed."""

    model_config = ConfigDict(extra="forbid")

    exempt_classes: list[PriorityClassName] = Field(max_length=100)
    user_classes: UserClassRule
    ceiling: StrictInt | None = Field(ge=0, le=INT32_MAX)

    @field_validator("exempt_classes")
    @classmethod
    def _sorted_once(cls, value: list[str]) -> list[str]:
        return sorted(set(value))

    def as_policy(self) -> PriorityPolicy:
        return PriorityPolicy(
            exempt_classes=list(self.exempt_classes), user_classes=self.user_classes, ceiling=self.ceiling
        )


class BudgetIn(BaseModel):
    """PUT /namespaces/{ns}/budget and PUT /defaults: a full replacement of the v1 fields (omitted ones
    take their defaults; a null budget means unlimited). The enforcement fields are not v1: omitted, each
    keeps its current value, so a client that predates them changes nothing it does not know about; null
    makes a namespace follow the default's value (on /defaults: the shipped default)."""

    model_config = ConfigDict(extra="forbid")

    budget_gpu_minutes: OptionalDecimalIn = Field(ge=0, le=LARGEST_AMOUNT, allow_inf_nan=False)
    period: PeriodKind = PeriodKind.MONTHLY
    warn_at_fraction: DecimalIn = Field(default=Decimal("0.8"), gt=0, le=1, decimal_places=4)
    max_gpu_share_per_pod: OptionalDecimalIn = Field(default=None, gt=0, le=10_000, allow_inf_nan=False)
    concurrent_gpu_limit: OptionalDecimalIn = Field(default=None, gt=0, le=1_000_000, allow_inf_nan=False)
    priority_policy: PriorityPolicyBody | None = None
    running_pod_action: RunningPodAction | None = None


class BudgetConfigOut(BaseModel):
    budget_gpu_minutes: OptionalAmount
    period: PeriodKind
    warn_at_fraction: Amount
    max_gpu_share_per_pod: OptionalAmount
    concurrent_gpu_limit: OptionalAmount
    priority_policy: PriorityPolicyBody
    running_pod_action: RunningPodAction


class ForecastOut(BaseModel):
    """The burn rate over the last `window_minutes` and when, at that rate, nothing will remain (budget
    plus grants); null when that is not within this period: no burn, no budget, the period ends first, or
    nothing remains already (the state says `exhausted`)."""

    window_minutes: int
    burn_rate_gpu_minutes_per_hour: Amount
    exhausts_at: datetime | None


class NamespaceBudgetOut(BaseModel):
    namespace: str
    source: Source
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
    # Effective values, and whether the namespace sets each itself or follows the default.
    priority_policy: PriorityPolicyBody
    priority_policy_source: Source
    running_pod_action: RunningPodAction
    running_pod_action_source: Source
    # The pool the namespace is in (docs/timekeeper.md#pools): its state is then the pool's rule, its
    # period the pool's; null when in none.
    pool: str | None = None
    forecast: ForecastOut


class GrantIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # At most the ledger's scale: a finer amount would be stored as 0, which the table refuses.
    gpu_minutes: DecimalIn = Field(gt=0, le=LARGEST_AMOUNT, decimal_places=9, allow_inf_nan=False)
    reason: StoredText = Field(min_length=1, max_length=1000)
    # When the grant stops counting; after now and no later than the end of the current period (a
    # grant lapses with its period anyway). Omitted: it counts until the period ends.
    expires_at: Timestamp | None = None


# active: counts now; expired: its expires_at passed; revoked: an admin revoked it; lapsed: its period is
# over (grants count for the period they were granted in).
GrantStatus = Literal["active", "expired", "revoked", "lapsed"]


class GrantEntryOut(BaseModel):
    id: int
    namespace: str
    gpu_minutes: Amount
    reason: str
    granted_by: str
    granted_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    revoked_by: str | None
    ended_at: datetime | None  # when it stopped counting (revoked or expired)
    status: GrantStatus


class GrantOut(GrantEntryOut):
    period: PeriodOut
    budget: NamespaceBudgetOut
