"""Downgrading running pods on a real API server (1.20: it serves Eviction in policy/v1beta1 only, and the
controller manager's ReplicaSet and disruption controllers run). A namespace whose budget is spent and
says `running_pod_action: evict` loses its running GPU pod, and the ReplicaSet's replacement is admitted
at the reduced class; a pod its PodDisruptionBudget protects and a bare pod stay.

There is no kubelet: the test marks pods Running through the status subresource, as a kubelet would.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

from tests.cluster.harness import (
    Kubectl,
    TimekeeperApi,
    gpu_probe,
    set_status,
    stamp,
    wait_for_admission_state,
)
from tests.support.processes import wait_until


def replica_set(namespace: str, name: str) -> dict[str, Any]:
    template = {"metadata": {"labels": {"app": name}}, "spec": gpu_probe(namespace)["spec"]}
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}}, "template": template},
    }


def pods(kubectl: Kubectl, namespace: str, app: str) -> list[dict[str, Any]]:
    listed = kubectl.json("get", "pods", "-n", namespace, "-l", f"app={app}")["items"]
    return [p for p in listed if not p["metadata"].get("deletionTimestamp")]


def mark_running(kubectl: Kubectl, namespace: str, name: str) -> None:
    set_status(kubectl, namespace, name, {"phase": "Running", "startTime": stamp(datetime.now(UTC))})


def test_an_exhausted_namespace_that_says_evict_has_its_running_pods_recreated_at_the_reduced_class(
    kubectl: Kubectl, api: TimekeeperApi, namespace: str
) -> None:
    api.set_budget(namespace, 1000)
    wait_for_admission_state(kubectl, namespace, "in_budget")
    for app in ("worker", "guarded"):
        kubectl.create(replica_set(namespace, app))
    kubectl.create(
        {
            "apiVersion": "policy/v1beta1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "guarded", "namespace": namespace},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}},
        }
    )
    bare = copy.deepcopy(gpu_probe(namespace))
    bare["metadata"] |= {"name": "bare", "labels": {"app": "bare"}}
    kubectl.create(bare)
    wait_until(
        lambda: all(pods(kubectl, namespace, app) for app in ("worker", "guarded")),
        timeout=30,
        what="the ReplicaSets' pods",
    )
    [worker] = pods(kubectl, namespace, "worker")
    [guarded] = pods(kubectl, namespace, "guarded")
    assert worker["spec"]["priorityClassName"] == "gpu-in-budget"
    for name in (worker["metadata"]["name"], guarded["metadata"]["name"], "bare"):
        mark_running(kubectl, namespace, name)

    # Exhausted first, so the webhook knows before the replacement arrives; then the action.
    api.set_budget(namespace, 0)
    wait_for_admission_state(kubectl, namespace, "exhausted")
    api.set_budget(namespace, 0, running_pod_action="evict")

    def replaced() -> list[dict[str, Any]]:
        return [
            p for p in pods(kubectl, namespace, "worker") if p["metadata"]["uid"] != worker["metadata"]["uid"]
        ]

    wait_until(replaced, timeout=30, what="the ReplicaSet's replacement of the evicted pod")
    [replacement] = replaced()
    assert replacement["spec"]["priorityClassName"] == "gpu-over-budget"
    assert [p["metadata"]["uid"] for p in pods(kubectl, namespace, "guarded")] == [guarded["metadata"]["uid"]]
    assert pods(kubectl, namespace, "bare")[0]["metadata"]["name"] == "bare"
    events = kubectl.json("get", "events", "-n", namespace)["items"]
    downgraded = [
        e["involvedObject"]["name"]
        for e in events
        if e["reason"] == "GPUBudgetDowngrade" and e["involvedObject"]["kind"] == "Pod"
    ]
    assert downgraded == [worker["metadata"]["name"]]


def test_a_jobs_pods_are_evicted_together_and_all_recreated_at_the_reduced_class(
    kubectl: Kubectl, api: TimekeeperApi, namespace: str
) -> None:
    """Whole-workload eviction with the real Job controller: the 3 running pods of a Job go in one pass
    (a dry-run eviction first asks the real API server whether any PDB refuses). A replacement the Job
    controller creates before its siblings' evictions may still keep their class, but passes it on to
    no one: the Job ends with all its pods at the reduced class."""
    api.set_budget(namespace, 1000)
    wait_for_admission_state(kubectl, namespace, "in_budget")
    template = {"metadata": {"labels": {"app": "train"}}, "spec": gpu_probe(namespace)["spec"]}
    template["spec"]["restartPolicy"] = "Never"
    kubectl.create(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "train", "namespace": namespace},
            "spec": {"parallelism": 3, "completions": 3, "backoffLimit": 10, "template": template},
        }
    )
    wait_until(lambda: len(pods(kubectl, namespace, "train")) == 3, timeout=30, what="the Job's pods")
    first = pods(kubectl, namespace, "train")
    for pod in first:
        mark_running(kubectl, namespace, pod["metadata"]["name"])

    api.set_budget(namespace, 0)
    wait_for_admission_state(kubectl, namespace, "exhausted")
    api.set_budget(namespace, 0, running_pod_action="evict")
    old = {pod["metadata"]["uid"] for pod in first}

    def reduced() -> bool:
        now = pods(kubectl, namespace, "train")
        for pod in now:  # what a kubelet would report, so the reconciler sees the replacements run
            if pod["metadata"]["uid"] not in old and (pod.get("status") or {}).get("phase") != "Running":
                mark_running(kubectl, namespace, pod["metadata"]["name"])
        return len(now) == 3 and {p["spec"]["priorityClassName"] for p in now} == {"gpu-over-budget"}

    wait_until(reduced, timeout=60, what="the Job's pods all recreated at the reduced class")
    events = kubectl.json("get", "events", "-n", namespace)["items"]
    downgraded = {
        e["involvedObject"]["name"]
        for e in events
        if e["reason"] == "GPUBudgetDowngrade" and e["involvedObject"]["kind"] == "Pod"
    }
    assert {pod["metadata"]["name"] for pod in first} <= downgraded
