"""The admission-state snapshot the timekeeper publishes and every webhook replica caches: these TypedDicts
are its one schema (the timekeeper builds it, the webhook validates a poll's answer, `compact` builds it for
stand-ins). Its JSON shape and the priority policy it carries: docs/timekeeper.md#admission-state."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Final, Literal, NotRequired, TypedDict

from gpuaccounting.wire import BudgetState

UserClassRule = Literal["replace", "keep_up_to_ceiling"]
# What a pod that could land on a GPU model whose own budget is exhausted gets: the reduced class, or steering
# off those models at the in-budget class where another model is left (docs/webhook.md#model-budgets).
ModelPolicy = Literal["reduce", "steer"]
MODEL_POLICIES: tuple[ModelPolicy, ...] = ("reduce", "steer")
DEFAULT_MODEL_POLICY: Final[ModelPolicy] = "reduce"
USER_CLASS_RULES: tuple[UserClassRule, ...] = ("replace", "keep_up_to_ceiling")
DEFAULT_EXEMPT_PRIORITY_CLASSES: tuple[str, ...] = ("system-cluster-critical", "system-node-critical")
# Where exempt classes are exempt: class name -> namespaces, `*` for every class not named. The default:
# the control plane's namespace and the product's own (deployment/ sets the installed namespace).
ANY_CLASS: Final = "*"
DEFAULT_EXEMPT_NAMESPACES: Final = {ANY_CLASS: frozenset({"kube-system", "gpu-timekeeper"})}


class PriorityPolicy(TypedDict):
    exempt_classes: list[str]
    user_classes: UserClassRule
    ceiling: int | None


def default_priority_policy() -> PriorityPolicy:
    """The cluster default until an admin sets another (`PUT /api/v1/defaults`)."""
    return {
        "exempt_classes": list(DEFAULT_EXEMPT_PRIORITY_CLASSES),
        "user_classes": "keep_up_to_ceiling",
        "ceiling": None,
    }


class NamespaceAdmission(TypedDict):
    """One namespace's entry, resolved: what the webhook decides with."""

    state: BudgetState
    max_gpu_share_per_pod: float | None
    priority_policy: PriorityPolicy
    # The models (gpuaccounting.gpumodels.model_key) whose own budget is exhausted this period.
    exhausted_models: list[str]
    model_policy: ModelPolicy


class NamespaceEntry(TypedDict):
    """One namespace's entry as the snapshot carries it: the policy by its index. The two model keys are
    absent from an older timekeeper's snapshot (and left out where they hold their defaults): no exhausted
    model, `reduce`."""

    state: BudgetState
    max_gpu_share_per_pod: float | None
    priority_policy: int
    exhausted_models: NotRequired[list[str]]
    model_policy: NotRequired[ModelPolicy]


class PriorityClassNames(TypedDict):
    in_budget: str
    over_budget: str


class AdmissionSnapshot(TypedDict):
    version: int
    generated_at: str
    priority_classes: PriorityClassNames
    priority_policies: list[PriorityPolicy]
    default: NamespaceEntry
    namespaces: dict[str, NamespaceEntry]


def resolve(state: AdmissionSnapshot) -> tuple[NamespaceAdmission, dict[str, NamespaceAdmission]]:
    """The default's and every listed namespace's resolved entry (ValueError: an index names no
    policy). Entries with the same policy share one PriorityPolicy object."""
    policies = state["priority_policies"]

    def resolved(entry: NamespaceEntry) -> NamespaceAdmission:
        index = entry["priority_policy"]
        if not 0 <= index < len(policies):
            raise ValueError(f"priority_policy {index} is not an index into {len(policies)} policies")
        return NamespaceAdmission(
            state=entry["state"],
            max_gpu_share_per_pod=entry["max_gpu_share_per_pod"],
            priority_policy=policies[index],
            exhausted_models=list(entry.get("exhausted_models", ())),
            model_policy=entry.get("model_policy", DEFAULT_MODEL_POLICY),
        )

    return resolved(state["default"]), {name: resolved(e) for name, e in state["namespaces"].items()}


def compact(
    version: int,
    generated_at: str,
    priority_classes: PriorityClassNames,
    default: NamespaceAdmission,
    namespaces: dict[str, NamespaceAdmission],
) -> AdmissionSnapshot:
    """The snapshot of resolved entries, in the published form: distinct policies listed once (the
    default's first) and the entries that equal the default's left out. (The timekeeper builds the same
    form in SQL; this is the reference for stand-ins and tests.)"""
    policies: list[PriorityPolicy] = [default["priority_policy"]]

    def entry(admission: NamespaceAdmission) -> NamespaceEntry:
        policy = admission["priority_policy"]
        if policy not in policies:
            policies.append(policy)
        found = NamespaceEntry(
            state=admission["state"],
            max_gpu_share_per_pod=admission["max_gpu_share_per_pod"],
            priority_policy=policies.index(policy),
        )
        if exhausted := admission.get("exhausted_models"):
            found["exhausted_models"] = list(exhausted)
        if (model_policy := admission.get("model_policy", DEFAULT_MODEL_POLICY)) != DEFAULT_MODEL_POLICY:
            found["model_policy"] = model_policy
        return found

    return AdmissionSnapshot(
        version=version,
        generated_at=generated_at,
        priority_classes=priority_classes,
        priority_policies=policies,  # filled in as the entries below are made
        default=entry(default),
        namespaces={name: entry(a) for name, a in sorted(namespaces.items()) if a != default},
    )


def is_exempt(
    class_name: str | None,
    namespace: str,
    exempt_classes: Collection[str],
    exempt_namespaces: Mapping[str, Collection[str]],
) -> bool:
    """Whether a pod of `class_name` in `namespace` keeps its class whatever the budget: its policy exempts
    the class and an admin listed the namespace for it. The webhook and the reconciler both ask this."""
    if class_name is None or class_name not in exempt_classes:
        return False
    return namespace in exempt_namespaces.get(class_name, exempt_namespaces.get(ANY_CLASS, ()))


def is_over_budget(state: BudgetState) -> bool:
    """Only an exhausted namespace gets the reduced class; a warning is a warning."""
    return state == "exhausted"
