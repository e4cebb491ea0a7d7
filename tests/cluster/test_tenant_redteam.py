"""A hostile tenant against the mechanisms issue 37 added (a red-team pass over the merged fixes): a member
of its namespace with only the built-in `edit` role, its budget exhausted, on the real API server 1.20.

- a ReplicaSet's template raised to more GPUs per pod once exhausted: the replacements kept the class its
  one-GPU pods ran at in budget, the size bound counting pods, not what each asks.
"""

from __future__ import annotations

import json
from typing import Any

from gpuaccounting import names
from tests.cluster.harness import Kubectl, Tenant, TimekeeperApi, gpu_probe
from tests.cluster.test_tenant_workloads import IN_BUDGET, REDUCED, exhaust, in_budget
from tests.cluster.test_workloads import classes, decision
from tests.support.processes import wait_until


def replica_set(namespace: str, name: str, replicas: int, gpus: int) -> dict[str, Any]:
    """A bare ReplicaSet (`edit` may make one) of `replicas` pods asking `gpus` GPUs each."""
    labels = {"app": name}
    spec = gpu_probe(namespace)["spec"]
    spec["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": spec},
        },
    }


def live_pods(kubectl: Kubectl, namespace: str, app: str, count: int) -> list[dict[str, Any]]:
    """The `count` pods of the app not being deleted, once there are that many."""
    found: list[dict[str, Any]] = []

    def created() -> bool:
        items = kubectl.json("get", "pods", "-n", namespace, "-l", f"app={app}")["items"]
        found[:] = [pod for pod in items if not pod["metadata"].get("deletionTimestamp")]
        return len(found) == count

    wait_until(created, timeout=60, what=f"{count} pods of {app}")
    return found


def test_a_template_raised_once_exhausted_keeps_no_class_for_its_larger_pods(
    kubectl: Kubectl, api: TimekeeperApi, tenant: Tenant, namespace: str
) -> None:
    """A ReplicaSet of three one-GPU pods runs in budget (size 3 recorded). Exhausted, the tenant edits the
    template to eight GPUs a pod (a ReplicaSet's template is mutable) and deletes a pod: the controller's
    replacement, within the size, kept the in-budget class for eight GPUs where the workload ran one. A
    workload's class passes on only to pods asking no more than a pod it passes from at that class: the
    first larger replacement, reduced, does not open the way for the next."""
    in_budget(kubectl, api, namespace)
    tenant.kubectl.create(replica_set(namespace, "grow", replicas=3, gpus=1))
    first = live_pods(kubectl, namespace, "grow", 3)
    assert classes(first) == {IN_BUDGET}
    exhaust(kubectl, api, namespace)

    eight = {"name": "main", "resources": {"limits": {"nvidia.com/gpu": "8"}}}
    raised = json.dumps({"spec": {"template": {"spec": {"containers": [eight]}}}})
    tenant.kubectl.run("patch", "replicaset", "grow", "-n", namespace, "--type=strategic", "-p", raised)
    replacements = []
    for gone in first[:2]:
        known = {pod["metadata"]["uid"] for pod in live_pods(kubectl, namespace, "grow", 3)}
        # No node: the pod is gone at once, and the ReplicaSet replaces it.
        tenant.kubectl.run("delete", "pod", gone["metadata"]["name"], "-n", namespace)
        (new,) = [p for p in live_pods(kubectl, namespace, "grow", 3) if p["metadata"]["uid"] not in known]
        replacements.append(new)

    assert {pod["metadata"]["annotations"][names.ANNOTATION_GPU_SHARE] for pod in replacements} == {"8"}
    assert classes(replacements) == {REDUCED}, [decision(pod) for pod in replacements]
    workload = first[0]["metadata"]["annotations"][names.ANNOTATION_WORKLOAD]
    refused = (
        f"exhausted: namespace exhausted; workload {workload} ran no pod asking a GPU share as large as 8"
    )
    assert decision(replacements[0]) == refused
    # The second is refused alike, or, once the watch shows the first, keeps that one's reduced class.
    assert decision(replacements[1]) in {
        refused,
        f"workload-class-kept: workload {workload} keeps class {REDUCED[0]}",
    }
