"""What one reconcile pass did: each part of the pass adds its own lines to one PassResult."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from gpuaccounting.wire import BudgetState
from timekeeper.kube import QuotaChange


@dataclass
class PassResult:
    """What one pass did (for logs, tests and the job's `detail` in job_runs)."""

    charged: dict[str, Decimal] = field(default_factory=dict)  # pod uid -> GPU-minutes
    claims_charged: dict[str, Decimal] = field(default_factory=dict)  # claim part key -> GPU-minutes
    closed: list[str] = field(default_factory=list)
    transitions: dict[str, tuple[BudgetState | None, BudgetState]] = field(default_factory=dict)
    evicted: list[tuple[str, str]] = field(default_factory=list)
    blocked: list[tuple[str, str]] = field(default_factory=list)  # by a PodDisruptionBudget
    deleted: list[tuple[str, str]] = field(default_factory=list)  # past the PDB patience
    shortened: list[tuple[str, str]] = field(default_factory=list)  # terminating with too long a grace
    deferred: list[tuple[str, str]] = field(default_factory=list)  # past the pass's eviction limit
    kueue_lowered: list[tuple[str, str]] = field(default_factory=list)  # Workloads (reconcile/kueue.py)
    kueue_restored: list[tuple[str, str]] = field(default_factory=list)
    quotas: dict[str, QuotaChange] = field(default_factory=dict)
    silent: list[tuple[str, str]] = field(default_factory=list)  # running pods whose sidecar is silent
    modelled: int = 0  # pods whose GPU model this pass recorded (or found recorded)
    pool_moves: list[str] = field(default_factory=list)  # namespaces a label change moved between pools

    def as_detail(self) -> dict[str, Any]:
        return {
            "charged": {uid: str(minutes) for uid, minutes in self.charged.items()},
            "claims_charged": {key: str(minutes) for key, minutes in self.claims_charged.items()},
            "closed": self.closed,
            "transitions": {ns: list(change) for ns, change in self.transitions.items()},
            "evicted": [list(pod) for pod in self.evicted],
            "blocked": [list(pod) for pod in self.blocked],
            "deleted": [list(pod) for pod in self.deleted],
            "shortened": [list(pod) for pod in self.shortened],
            "deferred": [list(pod) for pod in self.deferred],
            "kueue_lowered": [list(workload) for workload in self.kueue_lowered],
            "kueue_restored": [list(workload) for workload in self.kueue_restored],
            "quotas": {ns: change.value for ns, change in self.quotas.items()},
            "silent": [list(pod) for pod in self.silent],
            "modelled": self.modelled,
            "pool_moves": self.pool_moves,
        }
