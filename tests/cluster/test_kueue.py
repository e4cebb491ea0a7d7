"""`running_pod_action: kueue` on a real API server, Kueue's Workload and WorkloadPriorityClass served from
CRDs written from its v1beta1 types (tests/cluster/kueue_crds.py). The test plays Kueue's part: it creates
the Workloads and admits one through the status subresource. The timekeeper, as its shipped
ServiceAccount, lowers an exhausted namespace's GPU Workloads to the reduced WorkloadPriorityClass's value
and gives the in-budget one back after a grant, audited, with Events on the Workload; a tenant with `edit`
and Kueue's Workload editor role, writing the priority and the record of it, wins nothing back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.cluster.harness import Kubectl, Tenant, TimekeeperApi, stamp
from tests.cluster.kueue_crds import CRDS, GROUP, workload_priority_class
from tests.support.processes import wait_until
from timekeeper.reconcile.kueue import LOWERED_LABEL, ORIGINAL_ANNOTATION

IN_BUDGET, OVER_BUDGET, HIGH = 1000, 10, 5000  # the shipped class names' values here, and a higher one
PASS_SECONDS = 30  # a pass every second; generous on a loaded machine


@pytest.fixture(scope="module")
def kueue_api(kubectl: Kubectl) -> Iterator[None]:
    """kueue.x-k8s.io/v1beta1 served, with the WorkloadPriorityClasses the timekeeper is configured with
    (its defaults: the PriorityClasses' names) and one above them; Kueue's Workload editor role."""
    for definition in CRDS:
        kubectl.create(definition)
    names = [f"crd/{definition['metadata']['name']}" for definition in CRDS]
    kubectl.run("wait", "--for=condition=established", "--timeout=60s", *names)
    for name, value in (("gpu-in-budget", IN_BUDGET), ("gpu-over-budget", OVER_BUDGET), ("urgent", HIGH)):
        kubectl.create(workload_priority_class(name, value))
    kubectl.create(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "kueue-workload-editor-role"},
            "rules": [
                {
                    "apiGroups": [GROUP],
                    "resources": ["workloads"],
                    "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
                },
                {"apiGroups": [GROUP], "resources": ["workloads/status"], "verbs": ["get"]},
            ],
        }
    )
    yield
    kubectl.run("delete", "clusterrole", "kueue-workload-editor-role", "--wait=false")
    kubectl.run("delete", *names, "--wait=false")


def workload(namespace: str, name: str, resources: dict[str, str], priority_class: str, value: int) -> dict:
    """A Workload as Kueue's Job integration makes one from a Job labelled with a WorkloadPriorityClass."""
    return {
        "apiVersion": f"{GROUP}/v1beta1",
        "kind": "Workload",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "queueName": "user-queue",
            "priorityClassSource": "kueue.x-k8s.io/workloadpriorityclass",
            "priorityClassName": priority_class,
            "priority": value,
            "podSets": [
                {
                    "name": "main",
                    "count": 4,
                    "template": {
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [
                                {"name": "train", "image": "busybox:1.36", "resources": {"limits": resources}}
                            ],
                        }
                    },
                }
            ],
        },
    }


def admit(kubectl: Kubectl, namespace: str, name: str) -> None:
    """What Kueue's scheduler writes when it admits the Workload: quota reserved, admitted."""
    now = stamp(datetime.now(UTC))
    conditions = [
        {"type": kind, "status": "True", "reason": reason, "message": "", "lastTransitionTime": now}
        for kind, reason in (("QuotaReserved", "QuotaReserved"), ("Admitted", "Admitted"))
    ]
    status = {
        "admission": {
            "clusterQueue": "cluster-queue",
            "podSetAssignments": [{"name": "main", "flavors": {"nvidia.com/gpu": "default"}, "count": 4}],
        },
        "conditions": conditions,
    }
    patch = json.dumps({"status": status})
    kubectl.run(
        "patch", "workload", name, "-n", namespace, "--subresource=status", "--type=merge", "-p", patch
    )


def stored(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = kubectl.json("get", f"workloads.{GROUP}", name, "-n", namespace)
    return found


def priority(kubectl: Kubectl, namespace: str, name: str) -> int:
    value: int = stored(kubectl, namespace, name)["spec"]["priority"]
    return value


def wait_for_priority(kubectl: Kubectl, namespace: str, name: str, value: int, what: str) -> None:
    wait_until(lambda: priority(kubectl, namespace, name) == value, timeout=PASS_SECONDS, what=what)


def workload_events(kubectl: Kubectl, namespace: str, name: str) -> list[str]:
    events = kubectl.json("get", "events", "-n", namespace)["items"]
    return [
        e["reason"]
        for e in events
        if e["involvedObject"]["kind"] == "Workload"
        and e["involvedObject"]["name"] == name
        and e["involvedObject"].get("apiVersion") == f"{GROUP}/v1beta1"
    ]


def kueue_audit(api: TimekeeperApi, namespace: str) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = api.ok("GET", f"/audit?namespace={namespace}")
    return [e for e in entries if e["action"].startswith("kueue.")]


@pytest.mark.usefixtures("kueue_api")
def test_an_exhausted_namespaces_workloads_are_lowered_and_given_back_after_a_grant(
    kubectl: Kubectl, api: TimekeeperApi, namespace: str, tenant: Tenant
) -> None:
    kubectl.run(
        "create",
        "rolebinding",
        "tenant-workloads",
        "--clusterrole=kueue-workload-editor-role",
        f"--serviceaccount={namespace}:tenant",
        "-n",
        namespace,
    )
    api.set_budget(namespace, 1000, running_pod_action="kueue")
    kubectl.create(workload(namespace, "train", {"nvidia.com/gpu": "1"}, "gpu-in-budget", IN_BUDGET))
    kubectl.create(workload(namespace, "queued", {"nvidia.com/gpu": "2"}, "urgent", HIGH))
    kubectl.create(workload(namespace, "etl", {"cpu": "2"}, "gpu-in-budget", IN_BUDGET))
    admit(kubectl, namespace, "train")

    api.set_budget(namespace, 0, running_pod_action="kueue")
    wait_for_priority(kubectl, namespace, "train", OVER_BUDGET, "the admitted Workload lowered")
    wait_for_priority(kubectl, namespace, "queued", OVER_BUDGET, "the queued Workload lowered")
    train = stored(kubectl, namespace, "train")
    assert train["metadata"]["labels"][LOWERED_LABEL] == "true"
    assert train["metadata"]["annotations"][ORIGINAL_ANNOTATION] == str(IN_BUDGET)
    assert train["spec"]["priorityClassName"] == "gpu-in-budget"  # immutable while quota is reserved
    assert priority(kubectl, namespace, "etl") == IN_BUDGET  # no GPU: not the budget's business
    assert "GPUBudgetPriorityLowered" in workload_events(kubectl, namespace, "train")
    lowered = {
        e["old_value"]["workload"]: e for e in kueue_audit(api, namespace) if e["action"] == "kueue.lower"
    }
    assert lowered.keys() == {"train", "queued"}
    assert lowered["train"]["actor"] == "gpu-timekeeper:reconcile"
    assert (lowered["train"]["old_value"]["priority"], lowered["train"]["new_value"]["priority"]) == (
        IN_BUDGET,
        OVER_BUDGET,
    )

    # The tenant raises its Workload and rewrites the record of what it had: lowered again, the record
    # kept as written (it is bounded when given back, never believed).
    forged = {"metadata": {"annotations": {ORIGINAL_ANNOTATION: str(2**31 - 1)}}, "spec": {"priority": HIGH}}
    tenant.kubectl.run(
        "patch", "workload", "train", "-n", namespace, "--type=merge", "-p", json.dumps(forged)
    )
    stripped = {"metadata": {"labels": {LOWERED_LABEL: None}}, "spec": {"priority": HIGH}}
    tenant.kubectl.run(
        "patch", "workload", "queued", "-n", namespace, "--type=merge", "-p", json.dumps(stripped)
    )
    wait_for_priority(kubectl, namespace, "train", OVER_BUDGET, "the raised Workload lowered again")
    wait_for_priority(kubectl, namespace, "queued", OVER_BUDGET, "the unlabelled Workload lowered again")
    assert stored(kubectl, namespace, "queued")["metadata"]["annotations"][ORIGINAL_ANNOTATION] == str(HIGH)

    api.ok("POST", f"/namespaces/{namespace}/grants", body={"gpu_minutes": 60, "reason": "deadline"})
    wait_for_priority(kubectl, namespace, "train", IN_BUDGET, "the in-budget priority given back")
    # The default policy (keep_up_to_ceiling, no ceiling) allows at most the in-budget class's value:
    # neither the forged record nor the class the Workload was queued at is given more.
    wait_for_priority(kubectl, namespace, "queued", IN_BUDGET, "the queued Workload given back")
    train = stored(kubectl, namespace, "train")
    assert LOWERED_LABEL not in train["metadata"].get("labels", {})
    assert ORIGINAL_ANNOTATION not in train["metadata"].get("annotations", {})
    assert "GPUBudgetPriorityRestored" in workload_events(kubectl, namespace, "train")
    restored = [e for e in kueue_audit(api, namespace) if e["action"] == "kueue.restore"]
    assert sorted((e["old_value"]["workload"], e["new_value"]["priority"]) for e in restored) == [
        ("queued", IN_BUDGET),
        ("train", IN_BUDGET),
    ]
    assert priority(kubectl, namespace, "etl") == IN_BUDGET
