"""A downgrade the tenant cannot stall (issue 37): its PodDisruptionBudget refuses the eviction for the
patience only, then the pod is deleted; either way the pod is given at most the bounded grace, whatever
terminationGracePeriodSeconds it was admitted with in budget."""

# ruff: noqa: F811 (the fixtures imported from test_reconcile are this module's parameters)

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tests.kube.factories import gpu_pod, pdb
from tests.kube.test_reconcile import _exhaust, deleting, reconciler, sessionmaker, sync  # noqa: F401
from tests.support.kube_apiserver import KubeApiServer
from timekeeper.clock import ManualClock
from timekeeper.reconcile.service import Reconciler

pytestmark = pytest.mark.asyncio(loop_scope="session")

YEAR = 365 * 24 * 3600
PATIENCE = timedelta(minutes=10)  # the setting's default


def long_grace(apiserver: KubeApiServer, name: str, seconds: int = YEAR) -> None:
    """The pod as admitted in budget with a long grace (immutable once created)."""
    pod = apiserver.get("v1", "Pod", "team-a", name)
    assert pod is not None
    pod["spec"]["terminationGracePeriodSeconds"] = seconds
    apiserver.put(pod)


def grace(apiserver: KubeApiServer, name: str) -> int:
    pod = apiserver.get("v1", "Pod", "team-a", name)
    assert pod is not None
    value: int = pod["metadata"]["deletionGracePeriodSeconds"]
    return value


def downgrades(reconciler: Reconciler, outcome: str) -> float:
    registry = CollectorRegistry()
    registry.register(reconciler.downgrade_metrics)
    value = registry.get_sample_value("timekeeper_downgraded_pods_total", {"outcome": outcome})
    assert value is not None, generate_latest(registry).decode()
    return value


async def test_a_pdb_refuses_the_downgrade_for_the_patience_then_the_pod_is_deleted_with_bounded_grace(
    apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker, clock: ManualClock
):
    gpu_pod(apiserver, "team-a", "guarded", labels={"app": "guarded"})
    long_grace(apiserver, "guarded")
    pdb(apiserver, "team-a", "veto", {"app": "guarded"}, allowed=0)
    await _exhaust(apiserver, reconciler, sessionmaker, "team-a", running_pod_action="evict")

    first = await reconciler.run_pass()
    clock.advance(PATIENCE - timedelta(seconds=1))
    await sync(reconciler)
    patient = await reconciler.run_pass()
    clock.advance(timedelta(seconds=1))
    await sync(reconciler)
    spent = await reconciler.run_pass()

    assert first.blocked == patient.blocked == [("team-a", "guarded")]
    assert spent.deleted == [("team-a", "guarded")] and spent.blocked == []
    assert deleting(apiserver, "team-a", "guarded")
    assert grace(apiserver, "guarded") == reconciler.settings.over_budget_max_grace_seconds == 30
    assert (downgrades(reconciler, "blocked_by_pdb"), downgrades(reconciler, "deleted_past_pdb")) == (2, 1)
    [event] = [
        e
        for e in apiserver.list("v1", "Event", "team-a")
        if e["involvedObject"]["kind"] == "Pod" and e["involvedObject"]["name"] == "guarded"
    ]
    assert "PodDisruptionBudget refused eviction for 600 s" in event["message"]


async def test_the_patience_runs_from_when_the_pod_was_first_due_whichever_pod_the_pdb_names(
    apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker, clock: ManualClock
):
    """The tenant moves its PDB from pod to pod: the workload's clock does not start again."""
    for name in ("a", "b"):
        gpu_pod(apiserver, "team-a", name, labels={"app": "pair", "pick": name}, workload="Job/pair")
    pdb(apiserver, "team-a", "veto", {"pick": "a"}, allowed=0)
    await _exhaust(apiserver, reconciler, sessionmaker, "team-a", running_pod_action="evict")
    await reconciler.run_pass()
    apiserver.remove("policy/v1", "PodDisruptionBudget", "team-a", "veto")
    pdb(apiserver, "team-a", "veto", {"pick": "b"}, allowed=0)
    clock.advance(PATIENCE)
    await sync(reconciler)

    result = await reconciler.run_pass()

    assert sorted(result.deleted) == [("team-a", "a"), ("team-a", "b")]


async def test_an_eviction_gives_at_most_the_bounded_grace(
    apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker
):
    gpu_pod(apiserver, "team-a", "squatter", labels={"app": "squatter"})
    long_grace(apiserver, "squatter")
    gpu_pod(apiserver, "team-a", "quick", labels={"app": "quick"})
    long_grace(apiserver, "quick", seconds=5)
    await _exhaust(apiserver, reconciler, sessionmaker, "team-a", running_pod_action="evict")

    result = await reconciler.run_pass()

    assert {("team-a", "squatter"), ("team-a", "quick")} <= set(result.evicted)
    assert (grace(apiserver, "squatter"), grace(apiserver, "quick")) == (30, 5)
    assert downgrades(reconciler, "evicted") == len(result.evicted)


async def test_a_pod_made_anew_under_the_name_is_not_deleted_in_its_place(
    apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker, clock: ManualClock
):
    """The DELETE is preconditioned on the uid the pass saw."""
    gpu_pod(apiserver, "team-a", "guarded", labels={"app": "guarded"})
    pdb(apiserver, "team-a", "veto", {"app": "guarded"}, allowed=0)
    await _exhaust(apiserver, reconciler, sessionmaker, "team-a", running_pod_action="evict")
    await reconciler.run_pass()
    clock.advance(PATIENCE)
    await sync(reconciler)
    apiserver.remove("v1", "Pod", "team-a", "guarded")
    anew = gpu_pod(apiserver, "team-a", "guarded", labels={"app": "guarded"})

    result = await reconciler.run_pass()

    assert result.deleted == []
    assert apiserver.get("v1", "Pod", "team-a", "guarded")["metadata"]["uid"] == anew["metadata"]["uid"]
    assert not deleting(apiserver, "team-a", "guarded")


async def test_a_pod_its_tenant_orphans_is_downgraded_with_its_workload(
    apiserver: KubeApiServer, reconciler: Reconciler, sessionmaker
):
    """The tenant drops a running pod's ownerReferences (or has its ReplicaSet release it by a label):
    what it was admitted as, the webhook's protected annotation, still says it is no bare pod."""
    gpu_pod(apiserver, "team-a", "orphan", controlled=False, workload="ReplicaSet/web")
    gpu_pod(apiserver, "team-a", "bare", controlled=False, workload="Pod/bare")
    await _exhaust(apiserver, reconciler, sessionmaker, "team-a", running_pod_action="evict")

    result = await reconciler.run_pass()

    assert ("team-a", "orphan") in result.evicted
    assert ("team-a", "bare") not in result.evicted


@pytest.mark.parametrize(
    ("priority_class", "action", "shortened"),
    [
        ("gpu-over-budget", "none", True),  # a reduced pod, whatever the action
        ("gpu-in-budget", "evict", True),  # due for downgrade
        ("gpu-in-budget", "none", False),  # in its class by the namespace's own policy
    ],
)
async def test_a_tenants_own_long_deletion_is_shortened_to_the_bounded_grace(
    apiserver: KubeApiServer,
    reconciler: Reconciler,
    sessionmaker,
    clock: ManualClock,
    priority_class: str,
    action: str,
    shortened: bool,
):
    """`kubectl delete --grace-period=31536000 --wait=false`: the pod would run on, terminating, for a
    year; the scheduler does not preempt around a terminating pod."""
    gpu_pod(apiserver, "team-a", "lingering", labels={"app": "lingering"}, priority_class=priority_class)
    await _exhaust(apiserver, reconciler, sessionmaker, "team-a", running_pod_action=action)
    apiserver.remove("v1", "Pod", "team-a", "spender")
    apiserver.delete_pod("team-a", "lingering", YEAR)
    clock.set(datetime.now(UTC))  # the API server's clock: a deletion's end is its own time
    await sync(reconciler)

    result = await reconciler.run_pass()

    assert (result.shortened == [("team-a", "lingering")]) is shortened
    assert grace(apiserver, "lingering") == (30 if shortened else YEAR)
