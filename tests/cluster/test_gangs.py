"""Gang schedulers read a workload's class where the webhook writes it (issue 30's must-show), on the real
API server with the shipped webhook configurations: a Volcano gang's PodGroup and a KAI-style gang's top
owner (a PyTorchJob) and pods, in an exhausted namespace whose tenant sets a higher class everywhere it
can. The test plays each scheduler's part by reading where it reads: Volcano the PodGroup's
`spec.priorityClassName`; KAI's podgrouper the top owner's `priorityClassName` label, then the pod's,
then the pod's class."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from gpuaccounting import names
from tests.cluster.gang_crds import CRDS
from tests.cluster.harness import (
    Kubectl,
    KubectlError,
    Tenant,
    TimekeeperApi,
    gpu_probe,
    serve_crds,
    wait_for_admission_state,
)

HIGH = "gang-high"  # the class the tenant wants for its gang
REDUCED = "gpu-over-budget"
GPU = {"nvidia.com/gpu": "1"}


@pytest.fixture(scope="module")
def gang_api(kubectl: Kubectl) -> Iterator[None]:
    """Volcano's PodGroup and Kubeflow's PyTorchJob served, and a PriorityClass above ours to ask for."""
    crds = serve_crds(kubectl, CRDS)
    kubectl.create(
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": HIGH},
            "value": 100000,
        }
    )
    yield
    kubectl.run("delete", *crds, f"priorityclass/{HIGH}", "--wait=false")


@pytest.fixture
def exhausted_tenant(
    kubectl: Kubectl, api: TimekeeperApi, namespace: str, tenant: Tenant, gang_api: None
) -> Tenant:
    """The namespace's tenant, allowed its gang objects (as Volcano's and Kubeflow's roles allow), with
    the namespace's budget spent."""
    rules = [
        {
            "apiGroups": ["scheduling.volcano.sh", "kubeflow.org"],
            "resources": ["podgroups", "pytorchjobs"],
            "verbs": ["create", "get", "patch", "update"],
        }
    ]
    kubectl.create(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "gangs", "namespace": namespace},
            "rules": rules,
        }
    )
    subject = {"kind": "ServiceAccount", "name": "tenant", "namespace": namespace}
    role = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "gangs"}
    kubectl.create(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "gangs", "namespace": namespace},
            "roleRef": role,
            "subjects": [subject],
        }
    )
    api.set_budget(namespace, 0)
    wait_for_admission_state(kubectl, namespace, "exhausted")
    return tenant


def merge(tenant: Tenant, resource: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
    changed: dict[str, Any] = tenant.kubectl.json(
        "patch", resource, name, "-n", tenant.namespace, "--type=merge", "-p", json.dumps(patch)
    )
    return changed


def gang_pod(namespace: str, name: str, **metadata: Any) -> dict[str, Any]:
    probe = gpu_probe(namespace)
    probe["metadata"] = {**probe["metadata"], "name": name, **metadata}
    return probe


def test_a_volcano_gang_runs_at_the_class_its_podgroup_is_given(
    kubectl: Kubectl, exhausted_tenant: Tenant
) -> None:
    tenant, namespace = exhausted_tenant, exhausted_tenant.namespace
    group = {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": "gang", "namespace": namespace},
        "spec": {"minMember": 2, "priorityClassName": HIGH, "minResources": {"nvidia.com/gpu": "2"}},
    }

    created = tenant.kubectl.create(group)
    raised = merge(tenant, "podgroups.scheduling.volcano.sh", "gang", {"spec": {"priorityClassName": HIGH}})
    member = {"annotations": {"scheduling.k8s.io/group-name": "gang"}}
    pods = [tenant.kubectl.create(gang_pod(namespace, f"worker-{i}", **member)) for i in range(2)]
    stored = kubectl.json("get", "podgroups.scheduling.volcano.sh", "gang", "-n", namespace)

    # Volcano's reading: the PodGroup's class is the gang's, the same as each of its pods'.
    assert created["spec"]["priorityClassName"] == raised["spec"]["priorityClassName"] == REDUCED
    assert stored["spec"]["priorityClassName"] == REDUCED
    assert {pod["spec"]["priorityClassName"] for pod in pods} == {REDUCED}
    assert stored["metadata"]["annotations"][names.ANNOTATION_PRIORITY_DECISION] == (
        "exhausted: namespace exhausted; class gang-high replaced; workload PodGroup/gang"
    )
    assert {pod["metadata"]["annotations"][names.ANNOTATION_WORKLOAD] for pod in pods} == {"PodGroup/gang"}


def kai_priority_class(owner: dict[str, Any], pod: dict[str, Any]) -> str:
    """KAI-Scheduler's podgrouper (defaultgrouper.calcPodGroupPriorityClass): the top owner's label, then
    the pod's label, then the pod's class."""
    for labels in (owner["metadata"].get("labels") or {}, pod["metadata"].get("labels") or {}):
        if "priorityClassName" in labels:
            return str(labels["priorityClassName"])
    return str(pod["spec"]["priorityClassName"])


def test_a_kai_gang_runs_at_its_pods_class_whatever_its_owner_and_pods_are_labelled(
    kubectl: Kubectl, exhausted_tenant: Tenant
) -> None:
    tenant, namespace = exhausted_tenant, exhausted_tenant.namespace
    worker = {"metadata": {"labels": {"app": "train"}}, "spec": gpu_probe(namespace)["spec"]}
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "train", "namespace": namespace, "labels": {"priorityClassName": HIGH}},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 2, "template": worker}}},
    }

    created = tenant.kubectl.create(job)
    relabelled = merge(
        tenant, "pytorchjobs.kubeflow.org", "train", {"metadata": {"labels": {"priorityClassName": HIGH}}}
    )
    # The pods as Kubeflow's operator makes them: the template's labels, the job as controller.
    owner = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "name": "train",
        "uid": created["metadata"]["uid"],
        "controller": True,
    }
    labelled = gang_pod(
        namespace, "train-worker-x", labels={"priorityClassName": HIGH}, ownerReferences=[owner]
    )
    refused_pod = tenant.kubectl.refusal(labelled)
    members = [
        gang_pod(namespace, f"train-worker-{i}", labels={"app": "train"}, ownerReferences=[owner])
        for i in range(2)
    ]
    pods = [tenant.kubectl.create(member) for member in members]
    stored = kubectl.json("get", "pytorchjobs.kubeflow.org", "train", "-n", namespace)

    assert "priorityClassName" not in created["metadata"].get("labels", {})
    assert "priorityClassName" not in relabelled["metadata"].get("labels", {})
    assert "label priorityClassName" in refused_pod
    assert {kai_priority_class(stored, pod) for pod in pods} == {REDUCED}
    assert {pod["metadata"]["annotations"][names.ANNOTATION_WORKLOAD] for pod in pods} == {"PyTorchJob/train"}
    with pytest.raises(KubectlError) as refused:
        merge(
            tenant, "pod", pods[0]["metadata"]["name"], {"metadata": {"labels": {"priorityClassName": HIGH}}}
        )
    assert "label priorityClassName" in refused.value.stderr


def test_a_cpu_owners_kai_label_is_its_own(kubectl: Kubectl, exhausted_tenant: Tenant) -> None:
    tenant, namespace = exhausted_tenant, exhausted_tenant.namespace
    template = {"spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]}}
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "cpu", "namespace": namespace, "labels": {"priorityClassName": HIGH}},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 1, "template": template}}},
    }

    assert tenant.kubectl.create(job)["metadata"]["labels"]["priorityClassName"] == HIGH
