"""The reconciler's decisions without an API server or a database (timekeeper/reconcile/decisions.py):
which pods are due for downgrade and in what order their workloads go, the grace a downgrade gives, the
PDB patience, terminations that run too long, and which budget states are news. The passes that act on
them are proven against the stand-in in tests/kube/."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from gpuaccounting.names import DEFAULT_TERMINATION_GRACE_SECONDS
from gpuaccounting.wire import BudgetState
from timekeeper.kube.types import pod_info
from timekeeper.reconcile.decisions import (
    above_reduced,
    downgrade_grace,
    due_workloads,
    eviction_order,
    patience_spent,
    state_changes,
    termination_too_long,
)
from timekeeper.reconcile.pods import TrackedPod
from timekeeper.settings import Settings

T0 = datetime(2026, 3, 18, 12, 0, tzinfo=UTC)
EVICTING = {"team-a": frozenset({"critical"})}


def pod(
    name: str,
    *,
    namespace: str = "team-a",
    started: datetime = T0,
    share: str = "1",
    priority_class: str | None = None,
    owner: str | None = "ReplicaSet/train",
    grace: Any = None,
    deleting_since: datetime | None = None,
) -> TrackedPod:
    meta: dict[str, Any] = {"namespace": namespace, "name": name, "uid": f"uid-{name}"}
    if owner is not None:
        kind, owner_name = owner.split("/")
        meta["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": kind, "name": owner_name, "uid": "o", "controller": True}
        ]
    if deleting_since is not None:
        meta["deletionTimestamp"] = deleting_since.isoformat()
    spec: dict[str, Any] = {"containers": [{"name": "main"}]}
    if priority_class is not None:
        spec["priorityClassName"] = priority_class
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    raw = {"metadata": meta, "spec": spec, "status": {"phase": "Running", "startTime": started.isoformat()}}
    return TrackedPod(pod_info(raw), Decimal(share))


def test_a_new_namespace_in_budget_is_no_news_and_changes_come_in_order(settings: Settings):
    last: dict[str, BudgetState] = {"b": "in_budget", "c": "warning"}
    states: dict[str, BudgetState] = {"a": "in_budget", "b": "exhausted", "c": "warning", "d": "exhausted"}
    assert state_changes(last, states) == [("b", "in_budget", "exhausted"), ("d", None, "exhausted")]


def test_the_grace_is_the_pods_own_at_most_the_bound(settings: Settings):
    bounded = settings.model_copy(update={"over_budget_max_grace_seconds": 30})
    assert downgrade_grace(pod("p", grace=10).info, bounded) == 10
    assert downgrade_grace(pod("p", grace=3600).info, bounded) == 30
    default = min(DEFAULT_TERMINATION_GRACE_SECONDS, 30)
    assert downgrade_grace(pod("p").info, bounded) == default
    assert downgrade_grace(pod("p", grace=True).info, bounded) == default  # not a number of seconds
    assert downgrade_grace(pod("p", grace=-1).info, bounded) == default


def test_only_gpu_pods_above_the_reduced_class_of_evicting_namespaces_are_due(settings: Settings):
    reduced = settings.over_budget_priority_class
    exempting = settings.model_copy(update={"exempt_namespaces": {"critical": frozenset({"team-a"})}})
    assert above_reduced(pod("p"), EVICTING, set(), exempting)
    assert not above_reduced(pod("p", namespace="team-b"), EVICTING, set(), exempting)  # does not evict
    assert not above_reduced(pod("p", priority_class=reduced), EVICTING, set(), exempting)
    assert not above_reduced(pod("p", priority_class="critical"), EVICTING, set(), exempting)
    assert not above_reduced(pod("p", share="0"), EVICTING, set(), exempting)  # no GPU
    assert above_reduced(pod("p", share="0"), EVICTING, {"uid-p"}, exempting)  # a GPU claim's


def test_workloads_go_whole_longest_running_first_and_bare_pods_only_when_asked(settings: Settings):
    pods = [
        pod("late", owner="ReplicaSet/late", started=T0 + timedelta(hours=1)),
        pod("early-2", owner="ReplicaSet/early", started=T0 + timedelta(minutes=5)),
        pod("early-1", owner="ReplicaSet/early"),
        pod("bare", owner=None, started=T0 - timedelta(hours=1)),
        pod("leaving", owner="ReplicaSet/leaving", deleting_since=T0 + timedelta(hours=2)),
    ]
    due = due_workloads(pods, EVICTING, set(), settings.model_copy(update={"evict_bare_pods": False}))
    order = [[p.info.name for p in workload] for workload in eviction_order(due, T0)]
    assert order == [["early-1", "early-2"], ["late"]]
    due = due_workloads(pods, EVICTING, set(), settings.model_copy(update={"evict_bare_pods": True}))
    order = [[p.info.name for p in workload] for workload in eviction_order(due, T0)]
    assert order == [["bare"], ["early-1", "early-2"], ["late"]]


def test_the_pdb_patience_runs_from_when_any_pod_was_first_due(settings: Settings):
    patient = settings.model_copy(update={"downgrade_pdb_patience_seconds": 600})
    pods = [pod("a"), pod("b")]
    since = {"uid-a": T0, "uid-b": T0 + timedelta(minutes=5)}
    assert not patience_spent(pods, since, T0 + timedelta(minutes=9), patient)
    assert patience_spent(pods, since, T0 + timedelta(minutes=10), patient)
    assert not patience_spent(pods, {}, T0 + timedelta(days=1), patient)  # not due before: from now


def test_a_reduced_pods_long_deletion_is_too_long_and_a_bounded_one_is_not(settings: Settings):
    bounded = settings.model_copy(update={"over_budget_max_grace_seconds": 30})
    reduced = bounded.over_budget_priority_class
    far = pod("far", priority_class=reduced, deleting_since=T0 + timedelta(days=365))
    near = pod("near", priority_class=reduced, deleting_since=T0 + timedelta(seconds=80))
    due = pod("due", deleting_since=T0 + timedelta(days=365))
    elsewhere = pod("elsewhere", namespace="team-b", deleting_since=T0 + timedelta(days=365))
    assert termination_too_long(far, {}, set(), bounded, T0)  # reduced: whatever the namespace does
    assert not termination_too_long(near, {}, set(), bounded, T0)  # within the bound and the slack
    assert termination_too_long(due, EVICTING, set(), bounded, T0)
    assert not termination_too_long(elsewhere, EVICTING, set(), bounded, T0)
