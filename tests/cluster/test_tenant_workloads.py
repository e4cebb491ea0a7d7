"""A hostile tenant against the counting of a workload's pods (issue 37, points 1-3): a member of its
namespace with only the built-in `edit` role, its budget exhausted, replays each way it found to keep more
pods at its workload's in-budget class than the workload ran while in budget. Each ends with the extra pods
at the reduced class, decided by the budget:

- our counting label removed from the workload's running pods (the pod watch selects by it);
- the workload's pods deleted with a one-year grace period, still running while their replacements come;
- bare pods naming as their owner a Job whose declared size (parallelism 1024) has no pods behind it;
- a Deployment started with one pod in budget, scaled up once exhausted.

The honest pods of a workload, created by the real Job controller, keep one class
(tests/cluster/test_workloads.py). docs/webhook.md, "The bounds of reuse", maps each to its bound.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from gpuaccounting import names
from tests.cluster.harness import (
    Install,
    Kubectl,
    KubectlError,
    Tenant,
    TimekeeperApi,
    gpu_probe,
    placed,
    wait_for_admission_state,
)
from tests.cluster.test_tenant import sent_to_webhook
from tests.cluster.test_workloads import classes, decision, in_budget_job, job, pods_of, wait_for_pods
from tests.support.pods import review
from tests.support.processes import wait_until

IN_BUDGET = ("gpu-in-budget", 1000)
REDUCED = ("gpu-over-budget", 100)
A_YEAR = 31536000  # seconds: the tenant's terminationGracePeriodSeconds


def exhaust(kubectl: Kubectl, api: TimekeeperApi, namespace: str) -> None:
    api.set_budget(namespace, 0)
    wait_for_admission_state(kubectl, namespace, "exhausted")


def in_budget(kubectl: Kubectl, api: TimekeeperApi, namespace: str) -> None:
    api.set_budget(namespace, 1000)
    wait_for_admission_state(kubectl, namespace, "in_budget")


def test_our_counting_label_may_not_be_removed_so_the_extra_pods_end_reduced(
    kubectl: Kubectl, api: TimekeeperApi, tenant: Tenant, install: Install, namespace: str
) -> None:
    """Issue 37's first escape: the pod watch counts a workload's pods by our label, and `edit` could remove
    it from each running pod, so the workload seemed to have none and its controller's next pods kept its
    class. 1.20 sends every UPDATE to /validate; that 1.30+ sends this one is the shipped matchConditions'
    call (a GPU pod), evaluated with cel-python."""
    in_budget_job(kubectl, api, namespace, parallelism=2)
    first = pods_of(kubectl, namespace, "train")
    validating = install.configuration("ValidatingWebhookConfiguration")
    for stored in first:
        unlabelled = copy.deepcopy(stored)
        del unlabelled["metadata"]["labels"][names.LABEL_GPU_POD]
        request = review(unlabelled, operation="UPDATE", old=stored, username=tenant.username)
        assert sent_to_webhook(validating, request["request"])
        with pytest.raises(KubectlError) as refused:
            tenant.kubectl.run(
                "label", "pod", stored["metadata"]["name"], "-n", namespace, f"{names.LABEL_GPU_POD}-"
            )
        assert 'admission webhook "validate.gpu-timekeeper.io" denied the request' in refused.value.stderr
        assert f"label {names.LABEL_GPU_POD}=None" in refused.value.stderr

    tenant.kubectl.run(
        "patch", "job", "train", "-n", namespace, "--type=merge", "-p", '{"spec":{"parallelism":4}}'
    )
    grown = wait_for_pods(kubectl, namespace, "train", 4)

    extra = [pod for pod in grown if pod["metadata"]["uid"] not in {p["metadata"]["uid"] for p in first}]
    assert len(extra) == 2
    assert classes(extra) == {REDUCED}, [decision(pod) for pod in extra]
    assert all(pod["metadata"]["labels"][names.LABEL_GPU_POD] == "true" for pod in grown)


@pytest.fixture
def node(kubectl: Kubectl, namespace: str) -> Iterator[str]:
    """A Node object with no kubelet behind it: a pod bound to it is deleted gracefully (it has a node),
    and stays terminating for its grace period; the pod GC leaves pods on a node that exists alone."""
    name = f"node-{namespace}"[:63].rstrip("-")
    kubectl.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    yield name
    kubectl.run("delete", "jobs", "--all", "-n", namespace, "--cascade=orphan")
    kubectl.run("delete", "pods", "--all", "-n", namespace, "--grace-period=0", "--force")
    kubectl.run("delete", "node", name, "--wait=false")


def all_pods_of(kubectl: Kubectl, namespace: str, name: str) -> list[dict[str, Any]]:
    """The Job's pods, those being deleted included."""
    return list(kubectl.json("get", "pods", "-n", namespace, "-l", f"job-name={name}")["items"])


def test_pods_being_deleted_count_until_they_are_gone(
    kubectl: Kubectl, api: TimekeeperApi, tenant: Tenant, namespace: str, node: str
) -> None:
    """Issue 37's second escape: the Job's pods have a `nodeName` and a one-year grace period; the tenant
    deletes them with --wait=false one after another, and the Job controller replaces each at once (it
    counts a pod being deleted as gone). The deleted pods still run: the replacements get no class."""
    in_budget(kubectl, api, namespace)
    body = job(namespace, "hold", parallelism=2, completions=None)
    body["spec"]["template"]["spec"] |= {"nodeName": node, "terminationGracePeriodSeconds": A_YEAR}
    tenant.kubectl.create(body)
    first = wait_for_pods(kubectl, namespace, "hold", 2)
    assert classes(first) == {IN_BUDGET}
    exhaust(kubectl, api, namespace)

    for stored in first:
        tenant.kubectl.run("delete", "pod", stored["metadata"]["name"], "-n", namespace, "--wait=false")
        wait_for_pods(kubectl, namespace, "hold", 2)  # the Job controller's replacement
    everything = all_pods_of(kubectl, namespace, "hold")

    deleting = [pod for pod in everything if pod["metadata"].get("deletionTimestamp")]
    replacements = [pod for pod in everything if not pod["metadata"].get("deletionTimestamp")]
    assert {pod["metadata"]["uid"] for pod in deleting} == {pod["metadata"]["uid"] for pod in first}
    assert len(replacements) == 2
    assert classes(replacements) == {REDUCED}, [decision(pod) for pod in replacements]
    assert sum(classes([pod]) == {IN_BUDGET} for pod in everything) == 2  # the two it ran in budget


def test_a_declared_size_with_no_pods_behind_it_gives_a_tenants_pods_no_class(
    kubectl: Kubectl, api: TimekeeperApi, tenant: Tenant, namespace: str
) -> None:
    """Issue 37's third escape: a Job of parallelism 1024 whose template /validate refuses runs no pod, but
    its size was recorded by the tenant's bare pod naming it as owner while in budget; the tenant's next
    bare pods kept the class. Who created a pod is the API server's word, not the tenant's: the tenant's
    own pods are decided by the budget, whatever owner they name."""
    in_budget(kubectl, api, namespace)
    big = job(namespace, "big", parallelism=1024, completions=None)
    big["spec"]["template"]["spec"]["shareProcessNamespace"] = True  # refused: no pod of it ever runs
    created = tenant.kubectl.create(big)
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "big", "uid": created["metadata"]["uid"]}

    def bare(name: str) -> dict[str, Any]:
        body = placed(gpu_probe(namespace), namespace, name)
        body["metadata"]["ownerReferences"] = [owner | {"controller": True}]
        return body

    assert classes([tenant.kubectl.create(bare("bare-0"))]) == {IN_BUDGET}
    exhaust(kubectl, api, namespace)

    extra = [tenant.kubectl.create(bare(f"bare-{i}")) for i in range(1, 4)]

    assert classes(extra) == {REDUCED}, [decision(pod) for pod in extra]
    assert {decision(pod) for pod in extra} == {"exhausted: namespace exhausted; workload Job/big"}
    assert {pod["metadata"]["annotations"][names.ANNOTATION_CREATED_BY] for pod in extra} == {tenant.username}
    assert not all_pods_of(kubectl, namespace, "big")  # the Job itself ran none


def test_a_deployment_scaled_up_once_exhausted_gets_no_class_for_its_new_pods(
    kubectl: Kubectl, api: TimekeeperApi, tenant: Tenant, namespace: str
) -> None:
    """Found beside issue 37's: a ReplicaSet's size was not read, so a Deployment started with one pod in
    budget kept its class for the undeclared cap's pods when scaled up after exhaustion. Its replicas at the
    first admission are the size now, as a Job's parallelism is."""
    in_budget(kubectl, api, namespace)
    labels = {"app": "serve"}
    template = {"metadata": {"labels": labels}, "spec": gpu_probe(namespace)["spec"]}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "serve", "namespace": namespace},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": template},
    }
    tenant.kubectl.create(deployment)

    def serving(count: int) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []

        def created() -> bool:
            found[:] = kubectl.json("get", "pods", "-n", namespace, "-l", "app=serve")["items"]
            return len(found) == count

        wait_until(created, timeout=60, what=f"{count} pods of the Deployment")
        return found

    (first,) = serving(1)
    assert classes([first]) == {IN_BUDGET}
    exhaust(kubectl, api, namespace)

    tenant.kubectl.run("scale", "deployment", "serve", "-n", namespace, "--replicas=3")
    scaled = [pod for pod in serving(3) if pod["metadata"]["uid"] != first["metadata"]["uid"]]

    assert classes(scaled) == {REDUCED}, [decision(pod) for pod in scaled]
    workload = first["metadata"]["annotations"][names.ANNOTATION_WORKLOAD]
    assert {decision(pod) for pod in scaled} == {
        f"exhausted: namespace exhausted; workload {workload} has as many pods as it declared (1)"
    }
    assert first["metadata"]["annotations"][names.ANNOTATION_WORKLOAD_SIZE] == "1"
