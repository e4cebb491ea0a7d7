"""Budgets, defaults and grants as the API takes and answers them."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, field_validator

from gpuaccounting.admission_state import PriorityPolicy, UserClassRule
from gpuaccounting.names import DNS_SUBDOMAIN
from gpuaccounting.wire import BudgetState
from timekeeper.domain.figures import ModelPolicy, RunningPodAction
from timekeeper.domain.periods import PeriodKind
from timekeeper.domain.weights import model_key
from timekeeper.schemas import (
    LARGEST_AMOUNT,
    Amount,
    ClusterField,
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


class ModelBudgetIn(BaseModel):
    """One GPU model's own budget for the period (grants add to the total only)."""

    model_config = ConfigDict(extra="forbid")

    budget_gpu_minutes: DecimalIn = Field(ge=0, le=LARGEST_AMOUNT, decimal_places=9, allow_inf_nan=False)


def _one_spelling(models: dict[str, ModelBudgetIn] | None) -> dict[str, ModelBudgetIn] | None:
    """Keys as model_key spells them (billing weights' spelling), so a charge's model finds its budget;
    two keys naming one model (after model_key, ignoring case) are refused rather than one dropped."""
    if models is None:
        return None
    keyed: dict[str, ModelBudgetIn] = {}
    seen: dict[str, str] = {}
    for name, budget in models.items():
        key = model_key(name)
        if not key:
            raise ValueError(f"{name!r} names no GPU model")
        if key.casefold() in seen:
            raise ValueError(f"{name!r} and {seen[key.casefold()]!r} name the same GPU model")
        seen[key.casefold()] = name
        keyed[key] = budget
    return dict(sorted(keyed.items()))


ModelName = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[^\x00]*$")]
# A budget's per-model map; None: no model has a budget of its own.
ModelsIn = Annotated[
    dict[ModelName, ModelBudgetIn] | None, Field(max_length=100), AfterValidator(_one_spelling)
]


def model_amounts(models: dict[str, ModelBudgetIn] | None) -> dict[str, Decimal]:
    return {} if models is None else {key: body.budget_gpu_minutes for key, body in models.items()}


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
    # Each GPU model's own budget beside the total (which may be null), and what admission does with a
    # pod that could land on an exhausted one. Stated whole on each PUT, as the v1 fields are.
    models: ModelsIn = None
    model_policy: ModelPolicy = "reduce"


class ModelBudgetConfigOut(BaseModel):
    budget_gpu_minutes: Amount


class BudgetConfigOut(BaseModel):
    budget_gpu_minutes: OptionalAmount
    period: PeriodKind
    warn_at_fraction: Amount
    max_gpu_share_per_pod: OptionalAmount
    concurrent_gpu_limit: OptionalAmount
    priority_policy: PriorityPolicyBody
    running_pod_action: RunningPodAction
    models: dict[str, ModelBudgetConfigOut]
    model_policy: ModelPolicy


class ForecastOut(BaseModel):
    """The burn rate over the last `window_minutes` and when, at that rate, nothing will remain (budget
    plus grants); null when that is not within this period: no burn, no budget, the period ends first, or
    nothing remains already (the state says `exhausted`)."""

    window_minutes: int
    burn_rate_gpu_minutes_per_hour: Amount
    exhausts_at: datetime | None


class ModelForecastOut(BaseModel):
    """As ForecastOut, from the model's own burn (raw GPU-minutes) and remaining minutes."""

    window_minutes: int
    burn_rate_gpu_minutes_per_hour: Amount
    exhausts_at: datetime | None


class ModelBudgetOut(BaseModel):
    """One GPU model's budget of the period: raw GPU-minutes (before weights) of pods on that model."""

    budget_gpu_minutes: Amount
    used_gpu_minutes: Amount
    remaining_gpu_minutes: Amount
    state: BudgetState
    forecast: ModelForecastOut


class NamespaceBudgetOut(BaseModel):
    namespace: str  # bare; the cluster beside it (timekeeper/schemas.py ClusterField)
    cluster: ClusterField = None
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
    # Per-model budgets (the pool's for a member), by model_key's spelling.
    models: dict[str, ModelBudgetOut] = Field(default_factory=dict)
    model_policy: ModelPolicy = "reduce"
    # Raw GPU-minutes of the period of pods whose GPU model is not known: counted against the total only.
    unknown_model_used_gpu_minutes: Amount = Decimal(0)


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
    namespace: str  # bare, as NamespaceBudgetOut's
    cluster: ClusterField = None
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
