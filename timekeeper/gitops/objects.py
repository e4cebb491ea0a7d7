"""GPUBudget and GPUBudgetDefault objects (deployment/base/crds) as the budget API sees them: a spec becomes
the BudgetIn a PUT would take, and a namespace's budget status becomes the object's status. Pure: no
database, no cluster, so every rule here is tested on its own (tests/timekeeper/test_gitops_objects.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any, Literal

from pydantic import ValidationError

from gpuaccounting.admission_state import default_priority_policy
from gpuaccounting.names import DNS_LABEL, DNS_SUBDOMAIN, DOMAIN
from timekeeper.budgets.managed.repository import ObjectRef
from timekeeper.budgets.schemas import BudgetIn, NamespaceBudgetOut, model_amounts
from timekeeper.domain.clusters import namespace_key
from timekeeper.domain.figures import SHIPPED_RUNNING_POD_ACTION

GROUP = DOMAIN
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
BUDGETS = "gpubudgets"  # plural of GPUBudget (namespaced)
DEFAULTS = "gpubudgetdefaults"  # plural of GPUBudgetDefault (cluster-scoped, one named `default`)
BUDGET_KIND = "GPUBudget"
DEFAULT_KIND = "GPUBudgetDefault"
DEFAULT_NAME = "default"
NAME_LENGTH = 253  # an object's name: a DNS subdomain
LABEL_LENGTH = 63  # a namespace's: a DNS label
# The figures in status are for people and `kubectl get`: rounded; the API answers them exactly.
STATUS_STEP = Decimal("0.01")
# Status fields that move with every charge (the conditions' messages quote them too).
FIGURES = frozenset({"usedGPUMinutes", "remainingGPUMinutes", "grantedGPUMinutes", "forecast", "models"})

# spec field -> BudgetIn field. Every other spec field is refused (the schema prunes unknown ones).
SPEC_FIELDS = {
    "budgetGPUMinutes": "budget_gpu_minutes",
    "period": "period",
    "warnAtFraction": "warn_at_fraction",
    "maxGPUSharePerPod": "max_gpu_share_per_pod",
    "concurrentGPULimit": "concurrent_gpu_limit",
    "priorityPolicy": "priority_policy",
    "runningPodAction": "running_pod_action",
    "models": "models",
    "modelPolicy": "model_policy",
}
MODEL_FIELDS = {"budgetGPUMinutes": "budget_gpu_minutes"}
POLICY_FIELDS = {"exemptClasses": "exempt_classes", "userClasses": "user_classes", "ceiling": "ceiling"}

ConditionStatus = Literal["True", "False", "Unknown"]


class SpecError(ValueError):
    """A spec the budget API would refuse: reported in the object's Ready condition, nothing applied."""


def object_ref(kind: str, obj: dict[str, Any], cluster: str | None = None) -> ObjectRef:
    """The object of `cluster` (None: the hub's own) as what it governs: its namespace's key there."""
    meta = obj["metadata"]
    namespace = meta.get("namespace")
    return ObjectRef(
        kind,
        None if namespace is None else namespace_key(cluster, namespace),
        meta["name"],
        meta.get("uid", ""),
        meta.get("generation", 0),
    )


def well_formed(obj: Any, namespaced: bool) -> bool:
    """Whether a listed object can be synced at all: a name an API server could have given it, a uid,
    and (namespaced) a namespace that is one DNS label. A member's API server is input (docs/fleet.md):
    a namespace such as `a/team-x`, or none, would make a key that is not of that member's namespaces."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return False
    name, uid, namespace = meta.get("name"), meta.get("uid"), meta.get("namespace")
    named = isinstance(name, str) and len(name) <= NAME_LENGTH and re.fullmatch(DNS_SUBDOMAIN, name)
    placed = (
        isinstance(namespace, str) and len(namespace) <= LABEL_LENGTH and re.fullmatch(DNS_LABEL, namespace)
        if namespaced
        else namespace is None
    )
    return bool(named and placed and isinstance(uid, str) and uid)


def budget_in(spec: Any) -> BudgetIn:
    """The full budget a spec states. Unlike a REST PUT, where an omitted enforcement field keeps its
    current value, the object is the whole truth: an omitted priorityPolicy or runningPodAction follows
    the default (on the cluster default: the shipped one). Raises SpecError saying what is wrong."""
    spec = spec or {}
    if not isinstance(spec, dict):
        raise SpecError("spec is not an object")
    unknown = sorted(set(spec) - set(SPEC_FIELDS))
    if unknown:
        raise SpecError(f"unknown spec fields: {', '.join(unknown)}")
    body: dict[str, Any] = {"budget_gpu_minutes": None, "priority_policy": None, "running_pod_action": None}
    for field, target in SPEC_FIELDS.items():
        if field in spec:
            body[target] = spec[field]
    policy = body["priority_policy"]
    if isinstance(policy, dict):
        unknown = sorted(set(policy) - set(POLICY_FIELDS))
        if unknown:
            raise SpecError(f"unknown spec.priorityPolicy fields: {', '.join(unknown)}")
        body["priority_policy"] = {"ceiling": None} | {POLICY_FIELDS[k]: v for k, v in policy.items()}
    models = body.get("models")
    if isinstance(models, dict):
        body["models"] = {name: _model_budget(name, budget) for name, budget in models.items()}
    try:
        return BudgetIn.model_validate(body)
    except ValidationError as error:
        raise SpecError(_spec_errors(error)) from None


def _model_budget(name: str, budget: Any) -> Any:
    """spec.models.<model> in the API's field names (anything else is left for BudgetIn to refuse)."""
    if not isinstance(budget, dict):
        return budget
    unknown = sorted(set(budget) - set(MODEL_FIELDS))
    if unknown:
        raise SpecError(f"unknown spec.models.{name} fields: {', '.join(unknown)}")
    return {MODEL_FIELDS[k]: v for k, v in budget.items()}


def _spec_errors(error: ValidationError) -> str:
    """pydantic's complaints in the object's own field names: `spec.warnAtFraction: ...`,
    `spec.models.<model>.budgetGPUMinutes: ...`."""
    fields = {v: k for k, v in SPEC_FIELDS.items()} | {v: k for k, v in POLICY_FIELDS.items()}
    model_fields = {v: k for k, v in MODEL_FIELDS.items()}
    parts = []
    for problem in error.errors():
        steps = [str(step) for step in problem["loc"]]
        names = fields if steps[:1] != ["models"] else {}
        path = ".".join(
            model_fields.get(step, step) if steps[:1] == ["models"] and i >= 2 else names.get(step, step)
            for i, step in enumerate(steps)
        )
        parts.append(f"spec.{path}: {problem['msg']}")
    return "; ".join(parts)


def _number(value: Decimal | None) -> str | None:
    return None if value is None else format(value.normalize(), "f")


def stored_json(body: BudgetIn, *, cluster_default: bool) -> dict[str, Any]:
    """What the database holds once `body` is applied, in the form BudgetConfig.as_json() answers (the
    audit log's), so the sync changes (and audits) a budget only when the object says something else."""
    policy = None if body.priority_policy is None else dict(body.priority_policy.as_policy())
    action = body.running_pod_action
    if cluster_default:
        policy = policy or dict(default_priority_policy())
        action = action or SHIPPED_RUNNING_POD_ACTION
    return {
        "budget_gpu_minutes": _number(body.budget_gpu_minutes),
        "period": body.period.value,
        "warn_at_fraction": _number(body.warn_at_fraction),
        "max_gpu_share_per_pod": _number(body.max_gpu_share_per_pod),
        "concurrent_gpu_limit": _number(body.concurrent_gpu_limit),
        "priority_policy": policy,
        "running_pod_action": action,
        "models": {model: _number(amount) for model, amount in model_amounts(body.models).items()} or None,
        "model_policy": body.model_policy,
    }


# ---- status --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Readiness:
    """Whether the object's spec is the budget in force, and why not."""

    ready: bool
    reason: str
    message: str


def applied(ref: ObjectRef) -> Readiness:
    return Readiness(True, "Applied", f"generation {ref.generation} is the budget in force")


def stamp(moment: datetime) -> str:
    """A time as Kubernetes writes one: RFC 3339 in UTC, whole seconds."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def figure(value: Decimal | None) -> str | None:
    """An amount for status: to the hundredth, no exponent, no trailing zeros ("1500", "12.5")."""
    if value is None:
        return None
    rounded = value.quantize(STATUS_STEP, rounding=ROUND_HALF_EVEN)
    text = format(rounded, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def condition(
    type_: str,
    status: bool,
    reason: str,
    message: str,
    generation: int,
    previous: list[dict[str, Any]],
    now: datetime,
) -> dict[str, Any]:
    """A metav1.Condition; its lastTransitionTime moves only when its status does, so a status that says
    the same thing is the same status (and the sync writes nothing)."""
    value: ConditionStatus = "True" if status else "False"
    before = next((c for c in previous if c.get("type") == type_), None)
    since = (
        before["lastTransitionTime"]
        if before and before.get("status") == value and before.get("lastTransitionTime")
        else stamp(now)
    )
    return {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
        "observedGeneration": generation,
    }


def _usage_message(budget: NamespaceBudgetOut) -> str:
    if budget.budget_gpu_minutes is None:
        return f"{figure(budget.used_gpu_minutes)} GPU-minutes used; no budget (unlimited)"
    available = budget.budget_gpu_minutes + budget.granted_gpu_minutes
    return f"{figure(budget.used_gpu_minutes)} of {figure(available)} GPU-minutes used this period"


def _forecast(budget: NamespaceBudgetOut) -> dict[str, Any]:
    """The budget API's forecast: the burn rate over its window and, at that rate, when nothing will
    remain (absent when not within this period)."""
    forecast = budget.forecast
    out: dict[str, Any] = {
        "windowMinutes": forecast.window_minutes,
        "burnRateGPUMinutesPerHour": figure(forecast.burn_rate_gpu_minutes_per_hour),
    }
    if forecast.exhausts_at is not None:
        out["exhaustsAt"] = stamp(forecast.exhausts_at)
    return out


def budget_status(
    budget: NamespaceBudgetOut,
    readiness: Readiness,
    generation: int,
    previous: dict[str, Any] | None,
    now: datetime,
) -> dict[str, Any]:
    """A GPUBudget's status from its namespace's budget status (the budget in force, which is the last
    valid spec's when the current one is not ready)."""
    conditions = (previous or {}).get("conditions") or []
    state = budget.state
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "period": {
            key: value
            for key, value in {
                "kind": budget.period.kind.value,
                "start": None if budget.period.start is None else stamp(budget.period.start),
                "end": None if budget.period.end is None else stamp(budget.period.end),
            }.items()
            if value is not None
        },
        "budgetGPUMinutes": figure(budget.budget_gpu_minutes),
        "grantedGPUMinutes": figure(budget.granted_gpu_minutes),
        "usedGPUMinutes": figure(budget.used_gpu_minutes),
        "remainingGPUMinutes": figure(budget.remaining_gpu_minutes),
        "state": state,
        "priorityClass": budget.priority_class,
        "forecast": _forecast(budget),
        # Per-model budgets (absent without any): the exhausted ones, and each one's figures.
        "exhaustedModels": sorted(m for m, figures in budget.models.items() if figures.state == "exhausted")
        if budget.models
        else None,
        "models": {
            model: {
                "budgetGPUMinutes": figure(figures.budget_gpu_minutes),
                "usedGPUMinutes": figure(figures.used_gpu_minutes),
                "remainingGPUMinutes": figure(figures.remaining_gpu_minutes),
                "state": figures.state,
            }
            for model, figures in budget.models.items()
        }
        or None,
        "conditions": [
            condition(
                "Ready", readiness.ready, readiness.reason, readiness.message, generation, conditions, now
            ),
            condition(
                "Warning",
                state == "warning",
                "WarnFractionReached" if state == "warning" else "BelowWarnFraction",
                f"{_usage_message(budget)} (warning from {figure(budget.warn_at_fraction * 100)} %)",
                generation,
                conditions,
                now,
            ),
            condition(
                "Exhausted",
                state == "exhausted",
                "BudgetExhausted" if state == "exhausted" else "BudgetRemaining",
                _usage_message(budget),
                generation,
                conditions,
                now,
            ),
        ],
    }
    return {key: value for key, value in status.items() if value is not None}


def default_status(
    readiness: Readiness, generation: int, previous: dict[str, Any] | None, now: datetime
) -> dict[str, Any]:
    """A GPUBudgetDefault's status: whether its spec is the default in force."""
    conditions = (previous or {}).get("conditions") or []
    return {
        "observedGeneration": generation,
        "conditions": [
            condition(
                "Ready", readiness.ready, readiness.reason, readiness.message, generation, conditions, now
            )
        ],
    }


def substance(status: dict[str, Any]) -> dict[str, Any]:
    """A status less what moves with every charge (the figures, and the conditions' messages quoting
    them): two statuses of the same substance differ only in how much was used."""
    kept = {key: value for key, value in status.items() if key not in FIGURES}
    kept["conditions"] = [
        {key: value for key, value in c.items() if key != "message"} for c in status.get("conditions") or []
    ]
    return kept


def owner_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """Of several GPUBudgets in one namespace, the one that governs it: the oldest (then by name), so a
    second object can never take over a namespace by being created."""
    return min(objects, key=lambda o: (o["metadata"].get("creationTimestamp", ""), o["metadata"]["name"]))
