"""The admission-state snapshot: what the timekeeper publishes and every webhook replica caches.

Served at `GET /api/v1/admission-state` with `ETag: "<version>"`; a poll with `If-None-Match` answers 304
while nothing changed, so polling is cheap. The version only grows.

Shape (JSON):
    {
      "version": 42,
      "generated_at": "2026-11-22T00:00:00Z",
      "priority_classes": {"in_budget": "gpu-in-budget", "over_budget": "gpu-over-budget"},
      "default": {"state": "in_budget", "max_gpu_share_per_pod": null,
                  "priority_policy": {"exempt_classes": ["system-cluster-critical", "system-node-critical"],
                                      "user_classes": "keep_up_to_ceiling", "ceiling": null}},
      "namespaces": {
        "team-a": {"state": "exhausted", "max_gpu_share_per_pod": 2.0, "priority_policy": {...}},
        ...
      }
    }
A namespace absent from `namespaces` is governed by `default`. Every entry carries its *resolved* priority
policy (the namespace's own, else the cluster default), so a webhook never merges policies itself.

The priority policy (how a GPU pod's PriorityClass is chosen; the webhook applies it):
- a class in `exempt_classes` is kept in every state;
- in an exhausted namespace every other GPU pod gets the reduced class, whatever class it arrived with
  (chosen by its user, or filled in by the Priority plugin from a `globalDefault` PriorityClass);
- in budget, a pod that arrived with no class of its own (none, or the `globalDefault` one) gets the
  in-budget class; a class its user chose is replaced by the in-budget class under `replace`, and kept under
  `keep_up_to_ceiling` only while its value is at most `ceiling` (null: the in-budget class's own value),
  so a user may lower a pod's priority but never lift it above what policy permits.
"""

from __future__ import annotations

from typing import Literal, TypedDict

from gpuaccounting.wire import BudgetState

UserClassRule = Literal["replace", "keep_up_to_ceiling"]
USER_CLASS_RULES: tuple[UserClassRule, ...] = ("replace", "keep_up_to_ceiling")
DEFAULT_EXEMPT_PRIORITY_CLASSES: tuple[str, ...] = ("system-cluster-critical", "system-node-critical")


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
    state: BudgetState
    max_gpu_share_per_pod: float | None
    priority_policy: PriorityPolicy


class PriorityClassNames(TypedDict):
    in_budget: str
    over_budget: str


class AdmissionState(TypedDict):
    version: int
    generated_at: str
    priority_classes: PriorityClassNames
    default: NamespaceAdmission
    namespaces: dict[str, NamespaceAdmission]


def is_over_budget(state: BudgetState) -> bool:
    """Only an exhausted namespace gets the reduced class; a warning is a warning."""
    return state == "exhausted"
