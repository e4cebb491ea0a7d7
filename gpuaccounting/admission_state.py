"""The admission-state snapshot: what the timekeeper publishes and every webhook replica caches.

Served at `GET /api/v1/admission-state` with `ETag: "<version>"`; a poll with `If-None-Match` answers 304
while nothing changed, so polling is cheap. The version only grows.

Shape (JSON):
    {
      "version": 42,
      "generated_at": "2026-11-22T00:00:00Z",
      "priority_classes": {"in_budget": "gpu-in-budget", "over_budget": "gpu-over-budget"},
      "default": {"state": "in_budget", "max_gpu_share_per_pod": null},
      "namespaces": {
        "team-a": {"state": "exhausted", "max_gpu_share_per_pod": 2.0},
        ...
      }
    }
A namespace absent from `namespaces` is governed by `default`.
"""

from __future__ import annotations

from typing import TypedDict

from gpuaccounting.wire import BudgetState


class NamespaceAdmission(TypedDict):
    state: BudgetState
    max_gpu_share_per_pod: float | None


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
