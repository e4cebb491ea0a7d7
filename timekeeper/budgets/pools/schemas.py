"""Pools as the API takes and answers them."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Annotated, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpuaccounting.wire import BudgetState
from timekeeper.budgets.schemas import ModelBudgetOut, ModelsIn
from timekeeper.domain.figures import ModelPolicy
from timekeeper.domain.periods import PeriodKind
from timekeeper.schemas import (
    LARGEST_AMOUNT,
    Amount,
    DecimalIn,
    NamespaceKeyName,
    OptionalAmount,
    OptionalDecimalIn,
    PeriodOut,
)

# Kubernetes label keys (an optional DNS-subdomain prefix and a name) and values.
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LabelKey = Annotated[
    str,
    Field(
        max_length=317,
        pattern=rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_LABEL_NAME}$",
    ),
]
LabelValue = Annotated[str, Field(max_length=63, pattern=rf"^({_LABEL_NAME})?$")]
# Unlike the namespaces of other answers (bare, with a `cluster` beside them), a pool's members are keys:
# what an admin lists, and a pool may span clusters.
MEMBER_KEY = (
    "a namespace key: the bare namespace for the local cluster, `<cluster>/<namespace>` for a member "
    "cluster's (docs/fleet.md)"
)
PoolName = Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]

UPDATED_BY_CLUSTER = "the member cluster whose API server authenticated `updated_by`; null: the hub's own"


class NamespaceSelectorBody(BaseModel):
    """Namespaces whose labels hold every one of these (Kubernetes' matchLabels)."""

    model_config = ConfigDict(extra="forbid")

    matchLabels: dict[LabelKey, LabelValue] = Field(min_length=1, max_length=64)


class PoolMemberIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # A namespace of the hub's own cluster, or a key `<cluster>/<namespace>` naming a member cluster's: a
    # pool may span clusters, and only the hub's own principals write pools (docs/fleet.md).
    namespace: Annotated[NamespaceKeyName, Field(description=MEMBER_KEY)]
    # The most this member may use of the pool in a period (plus its own grants); null: no cap.
    cap_gpu_minutes: OptionalDecimalIn = Field(
        default=None, ge=0, le=LARGEST_AMOUNT, decimal_places=9, allow_inf_nan=False
    )


class PoolIn(BaseModel):
    """PUT /pools/{name}: the whole pool (a full replacement, its listed members included)."""

    model_config = ConfigDict(extra="forbid")

    budget_gpu_minutes: DecimalIn = Field(ge=0, le=LARGEST_AMOUNT, decimal_places=9, allow_inf_nan=False)
    period: PeriodKind = PeriodKind.MONTHLY
    warn_at_fraction: DecimalIn = Field(default=Decimal("0.8"), gt=0, le=1, decimal_places=4)
    members: list[PoolMemberIn] = Field(default_factory=list, max_length=1000)
    namespace_selector: NamespaceSelectorBody | None = None
    # Each GPU model's own budget for the pool (its members' use together), as a namespace's budget has.
    models: ModelsIn = None
    model_policy: ModelPolicy = "reduce"

    @model_validator(mode="after")
    def _each_member_once(self) -> Self:
        names = [member.namespace for member in self.members]
        if len(names) != len(set(names)):
            raise ValueError("a namespace is listed twice")
        return self


class PoolMemberOut(BaseModel):
    namespace: Annotated[str, Field(description=MEMBER_KEY)]  # as listed: admin input, unlike other answers
    listed: bool  # else chosen by the selector
    cap_gpu_minutes: OptionalAmount
    used_gpu_minutes: Amount
    granted_gpu_minutes: Amount
    state: BudgetState  # the pool's, or its cap's where that is worse


class PoolOut(BaseModel):
    """A pool as answered. Its members are named by namespace key, as an admin lists them (a pool may span
    clusters), not by bare namespace with a `cluster` beside it as other answers name namespaces."""

    name: str
    period: PeriodOut
    budget_gpu_minutes: Amount
    granted_gpu_minutes: Amount  # the members' grants of the period
    used_gpu_minutes: Amount
    remaining_gpu_minutes: Amount
    state: BudgetState
    warn_at_fraction: Amount
    namespace_selector: NamespaceSelectorBody | None
    members: list[PoolMemberOut]
    # Per-model budgets: every member's raw GPU-minutes on the model together (forecast: the members' burn).
    models: dict[str, ModelBudgetOut] = {}
    model_policy: ModelPolicy = "reduce"
    updated_at: datetime
    updated_by: str
    updated_by_cluster: Annotated[str | None, Field(description=UPDATED_BY_CLUSTER)]
