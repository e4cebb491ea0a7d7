"""Enforcement a tenant cannot stall (issue 37, points 4, 7 and 9), replayed on the real API server 1.20 by a
member of the namespace with only the built-in `edit` role, its budget spent:

- its PodDisruptionBudget (`maxUnavailable: 0`) refuses the downgrade's eviction only for the timekeeper's
  patience (10 s here): then its pod is deleted, with the bounded grace, and comes back at the reduced class;
- a Kueue Workload it raises is lowered again within seconds by the Workload watch, not on the next pass
  (the passes here are 300 s apart);
- a GPU pod admitted at the reduced class carries at most the webhook's grace (30 s), so its preemption
  frees the GPU within it; a deletion of it is bounded by it.

There is no kubelet: pods are marked Running through the status subresource, and a pod bound to the test's
Node stays Terminating after its DELETE, its deletionGracePeriodSeconds showing the grace it was given.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.harness import Kubectl, Tenant, TimekeeperApi, gpu_probe, wait_for_admission_state
from tests.cluster.kueue_crds import CRDS
from tests.cluster.test_eviction import mark_running, pods, replica_set
from tests.cluster.test_kueue import HIGH, OVER_BUDGET, kueue_api, priority, stored, workload  # noqa: F401
from tests.support.processes import LOCAL_HTTP, TimekeeperProcess, wait_until

YEAR = 365 * 24 * 3600
MAX_GRACE = 30  # WEBHOOK_OVER_BUDGET_MAX_GRACE_SECONDS and TIMEKEEPER_OVER_BUDGET_MAX_GRACE_SECONDS defaults
PDB_PATIENCE = 10  # TIMEKEEPER_DOWNGRADE_PDB_PATIENCE_SECONDS in tests/cluster/conftest.py
SLOW_PASSES = "300"  # seconds between reconcile passes while the Kueue test runs
WATCH_SECONDS = 5  # "within a few seconds", on a loaded machine


@pytest.fixture
def node(kubectl: Kubectl, namespace: str) -> Iterator[str]:
    """A Node the tenant's pods are bound to (none runs them): deleting such a pod is graceful."""
    name = f"gpu-{namespace}"[:63]
    kubectl.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    yield name
    kubectl.run("delete", "node", name, "--wait=false")


def held(namespace: str, name: str, node: str) -> dict[str, Any]:
    """A ReplicaSet of one GPU pod with a year's grace, bound to `node` (a tenant may name the node)."""
    template = {"metadata": {"labels": {"app": name}}, "spec": gpu_probe(namespace)["spec"]}
    template["spec"] |= {"terminationGracePeriodSeconds": YEAR, "nodeName": node}
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}}, "template": template},
    }


def counter(api: TimekeeperApi, name: str, **labels: str) -> float:
    """One sample of the timekeeper's /metrics, as the admin reads it."""
    metrics = LOCAL_HTTP.get(
        f"{api.url}/metrics", headers={"Authorization": f"Bearer {api.admin_token}"}, timeout=10
    )
    assert metrics.status_code == 200, metrics.text
    selector = ",".join(f'{key}="{value}"' for key, value in labels.items())
    wanted = f"{name}{{{selector}}} " if selector else f"{name} "
    found = [line for line in metrics.text.splitlines() if line.startswith(wanted)]
    assert found, f"the timekeeper exports no {wanted}"
    return float(found[0].split()[-1])


def test_a_tenants_pdb_refuses_the_downgrade_only_for_the_patience(
    tenant: Tenant, kubectl: Kubectl, api: TimekeeperApi, node: str
) -> None:
    namespace = tenant.namespace
    api.set_budget(namespace, 1000)
    wait_for_admission_state(kubectl, namespace, "in_budget")
    tenant.kubectl.create(held(namespace, "held", node))
    tenant.kubectl.create(
        {
            "apiVersion": "policy/v1beta1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "veto", "namespace": namespace},
            "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "held"}}},
        }
    )
    wait_until(lambda: pods(kubectl, namespace, "held"), timeout=30, what="the ReplicaSet's pod")
    [first] = pods(kubectl, namespace, "held")
    assert first["spec"]["priorityClassName"] == "gpu-in-budget"
    assert first["spec"]["terminationGracePeriodSeconds"] == YEAR  # in budget: the tenant's own grace
    mark_running(kubectl, namespace, first["metadata"]["name"])

    api.set_budget(namespace, 0)
    wait_for_admission_state(kubectl, namespace, "exhausted")
    api.set_budget(namespace, 0, running_pod_action="evict")
    due = time.monotonic()

    def terminating() -> dict[str, Any] | None:
        found = kubectl.json("get", "pod", first["metadata"]["name"], "-n", namespace)
        return found if found["metadata"].get("deletionTimestamp") else None

    wait_until(terminating, timeout=PDB_PATIENCE + 40, what="the PDB-protected pod deleted past the patience")
    assert time.monotonic() - due >= PDB_PATIENCE - 2  # refused at first (the passes run every second)
    gone = terminating()
    assert gone is not None
    assert gone["metadata"]["deletionGracePeriodSeconds"] == MAX_GRACE  # not the year it asked for

    def replacement() -> list[dict[str, Any]]:
        return [
            p for p in pods(kubectl, namespace, "held") if p["metadata"]["uid"] != first["metadata"]["uid"]
        ]

    wait_until(replacement, timeout=30, what="the ReplicaSet's replacement")
    [new] = replacement()
    assert (new["spec"]["priorityClassName"], new["spec"]["terminationGracePeriodSeconds"]) == (
        "gpu-over-budget",
        MAX_GRACE,
    )
    assert counter(api, "timekeeper_downgraded_pods_total", outcome="deleted_past_pdb") >= 1
    events = kubectl.json("get", "events", "-n", namespace)["items"]
    assert any(
        e["reason"] == "GPUBudgetDowngrade"
        and e["involvedObject"]["name"] == first["metadata"]["name"]
        and "PodDisruptionBudget" in e["message"]
        for e in events
    )


def test_a_reduced_gpu_pod_frees_its_gpu_within_the_bounded_grace(
    tenant: Tenant, kubectl: Kubectl, api: TimekeeperApi, node: str
) -> None:
    """What preemption waits for is the victim's grace: the stored pod carries the cap, and a DELETE
    without options (as the scheduler's preemption sends) gives it no more."""
    namespace = tenant.namespace
    api.set_budget(namespace, 0)
    wait_for_admission_state(kubectl, namespace, "exhausted")
    body = gpu_probe(namespace)
    body["metadata"]["name"] = "squatter"
    body["spec"] |= {"terminationGracePeriodSeconds": YEAR, "nodeName": node}

    created = tenant.kubectl.create(body)

    assert (created["spec"]["priorityClassName"], created["spec"]["terminationGracePeriodSeconds"]) == (
        "gpu-over-budget",
        MAX_GRACE,
    )
    kubectl.run("delete", "pod", "squatter", "-n", namespace, "--wait=false")
    deleting = kubectl.json("get", "pod", "squatter", "-n", namespace)
    assert deleting["metadata"]["deletionGracePeriodSeconds"] == MAX_GRACE


def test_a_tenants_own_long_deletion_of_a_reduced_pod_is_shortened(
    tenant: Tenant, kubectl: Kubectl, api: TimekeeperApi, node: str
) -> None:
    """`kubectl delete --grace-period=31536000`: the DELETE's grace overrides the pod's capped one, and
    the scheduler waits for a terminating pod rather than preempt around it."""
    namespace = tenant.namespace
    api.set_budget(namespace, 0)
    wait_for_admission_state(kubectl, namespace, "exhausted")
    body = gpu_probe(namespace)
    body["metadata"]["name"] = "lingering"
    body["spec"]["nodeName"] = node
    tenant.kubectl.create(body)
    mark_running(kubectl, namespace, "lingering")

    tenant.kubectl.run(
        "delete", "pod", "lingering", "-n", namespace, f"--grace-period={YEAR}", "--wait=false"
    )

    def grace() -> int:
        found = kubectl.json("get", "pod", "lingering", "-n", namespace)
        return int(found["metadata"]["deletionGracePeriodSeconds"])

    wait_until(lambda: grace() == MAX_GRACE, timeout=30, what="the tenant's year of grace shortened")


def test_a_pod_its_controller_released_is_still_downgraded(
    tenant: Tenant, kubectl: Kubectl, api: TimekeeperApi
) -> None:
    """The tenant relabels a running pod of its ReplicaSet: the controller releases it (drops its
    ownerReference) and makes another; the released pod was a bare pod to the pass, never evicted."""
    namespace = tenant.namespace
    api.set_budget(namespace, 1000)
    wait_for_admission_state(kubectl, namespace, "in_budget")
    tenant.kubectl.create(replica_set(namespace, "web"))
    wait_until(lambda: pods(kubectl, namespace, "web"), timeout=30, what="the ReplicaSet's pod")
    [first] = pods(kubectl, namespace, "web")
    name = first["metadata"]["name"]
    mark_running(kubectl, namespace, name)
    api.set_budget(namespace, 0)
    wait_for_admission_state(kubectl, namespace, "exhausted")

    tenant.kubectl.run("label", "pod", name, "-n", namespace, "app=released", "--overwrite")
    wait_until(
        lambda: not kubectl.json("get", "pod", name, "-n", namespace)["metadata"].get("ownerReferences"),
        timeout=30,
        what="the ReplicaSet releasing the pod",
    )
    api.set_budget(namespace, 0, running_pod_action="evict")

    wait_until(lambda: not pods(kubectl, namespace, "released"), timeout=30, what="the released pod evicted")


@pytest.fixture
def slow_passes(timekeeper: TimekeeperProcess) -> Iterator[None]:
    """The package's timekeeper again, its reconcile passes 300 s apart (the same database and port),
    so only the Workload watch can lower a Workload within seconds; restored afterwards."""
    usual = dict(timekeeper.env)
    timekeeper.stop()
    timekeeper.env = {**usual, "TIMEKEEPER_RECONCILE_INTERVAL_SECONDS": SLOW_PASSES}
    try:
        timekeeper.start()
        yield
    finally:
        timekeeper.stop()
        timekeeper.env = usual
        timekeeper.start()


@pytest.fixture(scope="module")
def earlier_kueue_gone(kubectl: Kubectl) -> None:
    """tests/cluster/test_kueue.py's CRDs, deleted without waiting, gone before `kueue_api` makes them."""
    names = [f"crd/{definition['metadata']['name']}" for definition in CRDS]
    wait_until(
        lambda: not kubectl.run("get", "--ignore-not-found", "-o", "name", *names).strip(),
        timeout=60,
        what="the Kueue CRDs of an earlier module deleted",
    )


@pytest.mark.usefixtures("earlier_kueue_gone", "kueue_api", "slow_passes")
def test_a_workload_the_tenant_raises_is_lowered_within_seconds(
    tenant: Tenant, kubectl: Kubectl, api: TimekeeperApi
) -> None:
    namespace = tenant.namespace
    kubectl.run(
        "create",
        "rolebinding",
        "tenant-workloads",
        "--clusterrole=kueue-workload-editor-role",
        f"--serviceaccount={namespace}:tenant",
        "-n",
        namespace,
    )
    api.set_budget(namespace, 0, running_pod_action="kueue")
    wait_until(lambda: api.budget(namespace)["state"] == "exhausted", timeout=30, what="the state exhausted")

    # Made anew at its high class: lowered as it arrives.
    tenant.kubectl.create(workload(namespace, "train", {"nvidia.com/gpu": "1"}, "urgent", HIGH))
    wait_until(
        lambda: priority(kubectl, namespace, "train") == OVER_BUDGET,
        timeout=WATCH_SECONDS,
        what="the new Workload lowered by the watch",
    )
    # Raised again and again: lowered each time.
    for _ in range(3):
        raised = {"spec": {"priority": HIGH}}
        tenant.kubectl.run(
            "patch", "workload", "train", "-n", namespace, "--type=merge", "-p", json.dumps(raised)
        )
        wait_until(
            lambda: priority(kubectl, namespace, "train") == OVER_BUDGET,
            timeout=WATCH_SECONDS,
            what="the raised Workload lowered by the watch",
        )
    assert stored(kubectl, namespace, "train")["spec"]["priorityClassName"] == "urgent"
    assert counter(api, "timekeeper_kueue_workloads_lowered_total", trigger="watch") >= 4
