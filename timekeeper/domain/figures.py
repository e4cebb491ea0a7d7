"""The figures a namespace's state is decided from: its budget's configuration, its use and grants in
the current period, and a pool member's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any, Literal

from gpuaccounting.admission_state import PriorityPolicy
from timekeeper.domain.periods import PeriodKind

# (namespace, period kind, period start): one running total, in the lock order.
TotalKey = tuple[str, str, datetime]
# (namespace, period kind, period start, GPU model): one per-model total, in the lock order.
ModelTotalKey = tuple[str, str, datetime, str]

# What the reconcile pass does to an exhausted namespace's running GPU pods (docs/kubernetes.md): nothing,
# evict them, or lower its Kueue Workloads' priority (reconcile/kueue.py).
RunningPodAction = Literal["none", "evict", "kueue"]
# What the webhook does with a pod that could land on a GPU model whose budget is exhausted: the reduced
# class, or a required node affinity that keeps it off those models (gpuaccounting/admission_state.py).
ModelPolicy = Literal["reduce", "steer"]
# usage_model_totals' model for the minutes of pods whose GPU model is not known.
UNKNOWN_MODEL = ""
SHIPPED_RUNNING_POD_ACTION: RunningPodAction = "none"

BUDGET_FIELDS = (
    "budget_gpu_minutes",
    "period",
    "warn_at_fraction",
    "max_gpu_share_per_pod",
    "concurrent_gpu_limit",
)


@dataclass(frozen=True, slots=True)
class BudgetConfig:
    budget_gpu_minutes: Decimal | None
    period: PeriodKind
    warn_at_fraction: Decimal
    max_gpu_share_per_pod: Decimal | None
    concurrent_gpu_limit: Decimal | None
    explicit: bool  # the namespace's own budget rather than the default
    # Resolved (the namespace's own, else the default's); `own_*`: set on the namespace itself.
    priority_policy: PriorityPolicy
    running_pod_action: RunningPodAction
    own_priority_policy: bool
    own_running_pod_action: bool
    pool: str | None = None  # the pool the namespace is in (its period is then the pool's)
    # Each GPU model's own budget for the period (model_key's spelling); empty: none.
    models: Mapping[str, Decimal] = field(default_factory=dict)
    model_policy: ModelPolicy = "reduce"

    @property
    def stored_priority_policy(self) -> PriorityPolicy | None:
        """As stored: None when it follows the default."""
        return self.priority_policy if self.own_priority_policy else None

    @property
    def stored_running_pod_action(self) -> RunningPodAction | None:
        return self.running_pod_action if self.own_running_pod_action else None

    def as_json(self) -> dict[str, Any]:
        """The audit log's view of a budget (null policy fields: following the default)."""

        def number(value: Decimal | None) -> str | None:
            return None if value is None else format(value.normalize(), "f")

        return {
            "budget_gpu_minutes": number(self.budget_gpu_minutes),
            "period": self.period.value,
            "warn_at_fraction": number(self.warn_at_fraction),
            "max_gpu_share_per_pod": number(self.max_gpu_share_per_pod),
            "concurrent_gpu_limit": number(self.concurrent_gpu_limit),
            "priority_policy": self.stored_priority_policy,
            "running_pod_action": self.stored_running_pod_action,
            "models": {model: number(amount) for model, amount in sorted(self.models.items())} or None,
            "model_policy": self.model_policy,
        }


def used_on(model_used: Mapping[str, Decimal], model: str) -> Decimal:
    """The raw GPU-minutes charged on `model`, a budget's key: the charged names that are it, case aside
    (a budget keyed `nvidia-h100-80gb-hbm3` counts the minutes charged on `NVIDIA-H100-80GB-HBM3`)."""
    wanted = model.casefold()
    return sum((amount for name, amount in model_used.items() if name.casefold() == wanted), Decimal(0))


@dataclass(frozen=True, slots=True)
class NamespaceFigures:
    namespace: str
    config: BudgetConfig
    used_gpu_minutes: Decimal
    granted_gpu_minutes: Decimal
    # Raw GPU-minutes (before weights) of the period per GPU model (UNKNOWN_MODEL: not known).
    model_used: Mapping[str, Decimal] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class MemberFigures:
    namespace: str
    cap_gpu_minutes: Decimal | None
    listed: bool  # else chosen by the pool's selector
    used_gpu_minutes: Decimal
    granted_gpu_minutes: Decimal
