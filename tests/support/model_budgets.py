"""Recorded v1 answers of a namespace with budgets per GPU model (issue #41), for the faces (the CLI, the
dashboard) tested against a stand-in timekeeper at the HTTP boundary.

`team-a` is the issue's case: 100,000 GPU-minutes in total and 10 on the H100, with 10 charged on an H100:
the H100 exhausted, the A100 in budget, the total in budget. Amounts are JSON numbers, as every amount of a
budget answer is (timekeeper/schemas.py `Amount`)."""

from __future__ import annotations

import copy
from typing import Any

H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-80GB"
NOW = "2026-03-18T12:00:00Z"

_TEAM_A: dict[str, Any] = {
    "namespace": "team-a",
    "source": "namespace",
    "period": {"kind": "monthly", "start": "2026-03-01T00:00:00Z", "end": "2026-04-01T00:00:00Z"},
    "budget_gpu_minutes": 100000.0,
    "granted_gpu_minutes": 0.0,
    "used_gpu_minutes": 130.0,
    "remaining_gpu_minutes": 99870.0,
    "state": "in_budget",
    "priority_class": "gpu-in-budget",
    "warn_at_fraction": 0.8,
    "max_gpu_share_per_pod": None,
    "concurrent_gpu_limit": None,
    "priority_policy": {"exempt_classes": [], "user_classes": "keep_up_to_ceiling", "ceiling": None},
    "priority_policy_source": "default",
    "running_pod_action": "none",
    "running_pod_action_source": "default",
    "pool": None,
    "forecast": {"window_minutes": 360, "burn_rate_gpu_minutes_per_hour": 0.0, "exhausts_at": None},
    "models": {
        H100: {
            "budget_gpu_minutes": 10.0,
            "used_gpu_minutes": 10.0,
            "remaining_gpu_minutes": 0.0,
            "state": "exhausted",
            "forecast": {"window_minutes": 360, "burn_rate_gpu_minutes_per_hour": 0.0, "exhausts_at": None},
        },
        A100: {
            "budget_gpu_minutes": 500.0,
            "used_gpu_minutes": 120.0,
            "remaining_gpu_minutes": 380.0,
            "state": "in_budget",
            "forecast": {
                "window_minutes": 360,
                "burn_rate_gpu_minutes_per_hour": 12.0,
                "exhausts_at": "2026-03-25T08:00:00Z",
            },
        },
    },
    "model_policy": "reduce",
    "unknown_model_used_gpu_minutes": 2.5,
}


def team_a() -> dict[str, Any]:
    """`GET /namespaces/team-a/budget`."""
    return copy.deepcopy(_TEAM_A)


def team_b() -> dict[str, Any]:
    """A namespace without model budgets, as an answer that predates them reads: no `models` at all."""
    answer = team_a()
    for key in ("models", "model_policy", "unknown_model_used_gpu_minutes"):
        del answer[key]
    answer |= {"namespace": "team-b", "used_gpu_minutes": 40.0, "remaining_gpu_minutes": 99960.0}
    return answer


def team_c() -> dict[str, Any]:
    """Model budgets all in budget, the map empty: `models: {}` shows nothing new either."""
    answer = team_a() | {"namespace": "team-c", "models": {}, "unknown_model_used_gpu_minutes": 0.0}
    return answer


def namespaces() -> list[dict[str, Any]]:
    """`GET /namespaces`."""
    return [team_a(), team_b(), team_c()]


def usage(namespace: str, group_by: str) -> dict[str, Any]:
    """`GET /namespaces/{ns}/usage?group_by=...`: nothing this period (these tests are about budgets)."""
    return {
        "namespace": namespace,
        "since": "2026-03-01T00:00:00Z",
        "until": NOW,
        "group_by": group_by,
        "total_gpu_minutes": 0.0,
        "total_raw_gpu_minutes": 0.0,
        "total_mean_sm_util_pct": None,
        "total_peak_sm_util_pct": None,
        "total_mean_mem_used_bytes": None,
        "total_peak_mem_used_bytes": None,
        "total_energy_joules": None,
        "total_gpu_statuses": [],
        "rows": [],
    }


def whoami(namespace: str | None) -> dict[str, Any]:
    """`GET /whoami`: a cluster-wide reader."""
    return {
        "name": "reader",
        "anonymous": False,
        "auth_mode": "static",
        "cluster": None,
        "now": NOW,
        "may_read_all": True,
        "may_administer": False,
        "namespaces": None,
        "namespace": None
        if namespace is None
        else {"namespace": namespace, "may_read": True, "may_administer": False},
    }
