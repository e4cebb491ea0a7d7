"""The admission-state snapshot: what the timekeeper publishes and every webhook replica caches.

Served at `GET /api/v1/admission-state` with `ETag: "<version>"`; a poll with `If-None-Match` answers 304
while nothing changed, so polling is cheap. The version only grows.

The TypedDicts below are its one schema: the timekeeper builds the document with them, the webhook
validates a poll's answer against them (webhook/state.py), `compact` builds it for stand-ins. Shape (JSON):
    {
      "version": 42,
      "generated_at": "2026-11-22T00:00:00Z",
      "priority_classes": {"in_budget": "gpu-in-budget", "over_budget": "gpu-over-budget"},
      "priority_policies": [
        {"exempt_classes": ["system-cluster-critical", "system-node-critical"],
         "user_classes": "keep_up_to_ceiling", "ceiling": null},
        {"exempt_classes": [], "user_classes": "replace", "ceiling": null}
      ],
      "default": {"state": "in_budget", "max_gpu_share_per_pod": null, "priority_policy": 0},
      "namespaces": {
        "team-a": {"state": "exhausted", "max_gpu_share_per_pod": 2.0, "priority_policy": 1},
        ...
      }
    }
Each entry's `priority_policy` is an index into `priority_policies`, the distinct *resolved* policies (a
namespace's own, else the cluster default's; the default's own is index 0), so a webhook never merges
policies itself and a policy shared by 10,000 namespaces is sent once. A namespace absent from
`namespaces` is governed by `default`: the timekeeper leaves out every namespace whose entry would equal
the default's (same state, per-pod cap and resolved policy), so the snapshot lists only the namespaces
that differ. `resolve` turns a snapshot into each namespace's resolved `NamespaceAdmission`, refusing
one whose index names no policy.

The priority policy (how a GPU pod's PriorityClass is chosen; the webhook applies it):
- a class in `exempt_classes` is kept in every state, but only in the namespaces an admin lists for it
  (`exempt_namespaces`, a setting of the webhook and of the timekeeper: `is_exempt`); elsewhere it is
  governed like any class a user chose;
- in an exhausted namespace every other GPU pod gets the reduced class, whatever class it arrived with
  (chosen by its user, or filled in by the Priority plugin from a `globalDefault` PriorityClass);
- in budget, a pod that arrived with no class of its own (none, or the `globalDefault` one) gets the
  in-budget class; a class its user chose is replaced by the in-budget class under `replace`, and kept under
  `keep_up_to_ceiling` only while its value is at most `ceiling` (null: the in-budget class's own value),
  so a user may lower a pod's priority but never lift it above what policy permits.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Final, Literal, TypedDict

from gpuaccounting.wire import BudgetState

UserClassRule = Literal["replace", "keep_up_to_ceiling"]
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


class NamespaceEntry(TypedDict):
    """One namespace's entry as the snapshot carries it: the policy by its index."""

    state: BudgetState
    max_gpu_share_per_pod: float | None
    priority_policy: int


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
        return NamespaceEntry(
            state=admission["state"],
            max_gpu_share_per_pod=admission["max_gpu_share_per_pod"],
            priority_policy=policies.index(policy),
        )

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
