"""The reconciler's decisions, apart from the writes that carry them out: which pods hold GPUs, which are
due for downgrade and in what order their workloads go, what grace a downgrade gives, when the PDB
patience is spent, which terminations run too long, and which budget states changed. Pure functions of
the pods and settings, so they read like the rules they are."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

from gpuaccounting.admission_state import is_exempt
from gpuaccounting.names import DEFAULT_TERMINATION_GRACE_SECONDS
from gpuaccounting.wire import BudgetState
from timekeeper.kube import PodInfo
from timekeeper.reconcile.pods import TrackedPod
from timekeeper.reconcile.workloads import workload_key
from timekeeper.settings import Settings

# How far the API server's clock may run ahead of ours before a deletion's end looks too late.
TERMINATION_SLACK = timedelta(minutes=1)


def holds_gpus(pod: TrackedPod, claim_holders: set[str]) -> bool:
    """GPUs outside claims, or a GPU claim (a pod whose claims are all NICs, say, is no GPU pod)."""
    return pod.share > 0 or pod.info.uid in claim_holders


def reduced(info: PodInfo, settings: Settings) -> bool:
    """Whether the pod runs at the reduced class already."""
    return (info.raw.get("spec") or {}).get("priorityClassName") == settings.over_budget_priority_class


def above_reduced(
    pod: TrackedPod, evicting: Mapping[str, frozenset[str]], claim_holders: set[str], settings: Settings
) -> bool:
    """A GPU pod not ended, of a namespace that evicts, neither at the reduced class nor at a class
    its priority policy exempts there."""
    info = pod.info
    exempt = evicting.get(info.namespace)
    if exempt is None or pod.ended_at is not None or info.ended or not holds_gpus(pod, claim_holders):
        return False
    priority_class = (info.raw.get("spec") or {}).get("priorityClassName")
    return priority_class != settings.over_budget_priority_class and not is_exempt(
        priority_class, info.namespace, exempt, settings.exempt_namespaces
    )


def due_workloads(
    pods: Iterable[TrackedPod],
    evicting: Mapping[str, frozenset[str]],
    claim_holders: set[str],
    settings: Settings,
) -> dict[tuple[str, str], list[TrackedPod]]:
    """The workloads due for downgrade, each with all its pods still above the reduced class and not
    being deleted; bare pods only when `evict_bare_pods` is set."""
    workloads: dict[tuple[str, str], list[TrackedPod]] = {}
    for pod in pods:
        info = pod.info
        if info.deleting_since is not None or not above_reduced(pod, evicting, claim_holders, settings):
            continue
        key = workload_key(info)
        if not key[1].startswith("Pod/") or settings.evict_bare_pods:
            workloads.setdefault(key, []).append(pod)
    return workloads


def eviction_order(
    workloads: Mapping[tuple[str, str], list[TrackedPod]], now: datetime
) -> list[list[TrackedPod]]:
    """The workloads with a running pod, the longest-running first, each's pods in order of start."""
    return sorted(
        (
            sorted(pods, key=lambda pod: (pod.info.started_at or now, pod.info.uid))
            for pods in workloads.values()
            if any(pod.running for pod in pods)
        ),
        key=lambda pods: (pods[0].info.started_at or now, pods[0].info.uid),
    )


def downgrade_grace(info: PodInfo, settings: Settings) -> int:
    """The grace a downgrade gives the pod: its own terminationGracePeriodSeconds, at most
    `over_budget_max_grace_seconds` (a pod admitted in budget may carry any, and it is immutable)."""
    own = (info.raw.get("spec") or {}).get("terminationGracePeriodSeconds")
    if not isinstance(own, int) or isinstance(own, bool) or own < 0:
        own = DEFAULT_TERMINATION_GRACE_SECONDS
    return min(own, settings.over_budget_max_grace_seconds)


def patience_spent(
    pods: Iterable[TrackedPod], due_since: Mapping[str, datetime], now: datetime, settings: Settings
) -> bool:
    """Whether any of the workload's pods has been due for `downgrade_pdb_patience_seconds`."""
    patience = timedelta(seconds=settings.downgrade_pdb_patience_seconds)
    return any(now - due_since.get(pod.info.uid, now) >= patience for pod in pods)


def termination_too_long(
    pod: TrackedPod,
    evicting: Mapping[str, frozenset[str]],
    claim_holders: set[str],
    settings: Settings,
    now: datetime,
) -> bool:
    """A GPU pod being deleted, at the reduced class or due for downgrade, whose deletion ends more than
    `over_budget_max_grace_seconds` (and a minute's slack for clocks) from now."""
    info = pod.info
    limit = now + timedelta(seconds=settings.over_budget_max_grace_seconds) + TERMINATION_SLACK
    ends = info.deleting_since  # the deletionTimestamp: when the grace ends
    if ends is None or ends <= limit or pod.ended_at is not None or info.ended:
        return False
    if reduced(info, settings) and holds_gpus(pod, claim_holders):
        return True
    return above_reduced(pod, evicting, claim_holders, settings)


def state_changes(
    last: Mapping[str, BudgetState], states: Mapping[str, BudgetState]
) -> list[tuple[str, BudgetState | None, BudgetState]]:
    """Each namespace whose state changed since the last pass, in order of name (a new namespace in
    budget, or unlimited, is no news)."""
    changes: list[tuple[str, BudgetState | None, BudgetState]] = []
    for namespace, state in sorted(states.items()):
        before = last.get(namespace)
        if before == state or (before is None and state in ("in_budget", "unlimited")):
            continue
        changes.append((namespace, before, state))
    return changes
