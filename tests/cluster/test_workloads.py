"""One class per workload on a real API server with the real Job controller (issue 30's must-show): a Job
whose namespace becomes exhausted after its first pods were admitted keeps all its pods, the later and the
recreated ones included, at the class its first pods got; a Job created after that is a new workload and
gets the reduced class. The webhook learns the Job's pods through its own pod watch, as its own
ServiceAccount (the RBAC deployment/ ships), on by default. The reuse is bounded by the size the Job
declared when its first pod was admitted: a tenant's pods claiming the Job past it, or the pods of a
parallelism it raised after, are decided by the budget."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from gpuaccounting import names
from tests.cluster.harness import (
    Kubectl,
    KubectlError,
    Tenant,
    TimekeeperApi,
    gpu_probe,
    placed,
    set_status,
    stamp,
    terminated,
    wait_for_admission_state,
)
from tests.support.processes import wait_until


def job(namespace: str, name: str, parallelism: int, completions: int | None) -> dict[str, Any]:
    spec = gpu_probe(namespace)["spec"]
    template = {"metadata": {"labels": {"app": name}}, "spec": {**spec, "restartPolicy": "Never"}}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "parallelism": parallelism,
            "completions": completions,
            "backoffLimit": 10,
            "template": template,
        },
    }


def pods_of(kubectl: Kubectl, namespace: str, name: str) -> list[dict[str, Any]]:
    listed = kubectl.json("get", "pods", "-n", namespace, "-l", f"job-name={name}")
    return [pod for pod in listed["items"] if not pod["metadata"].get("deletionTimestamp")]


def wait_for_pods(kubectl: Kubectl, namespace: str, name: str, count: int) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    def created() -> bool:
        found[:] = pods_of(kubectl, namespace, name)
        return len(found) == count

    wait_until(created, timeout=60, what=f"{count} pods of job {name}")
    return found


def classes(pods: list[dict[str, Any]]) -> set[tuple[str, int]]:
    return {(pod["spec"]["priorityClassName"], pod["spec"]["priority"]) for pod in pods}


def decision(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["annotations"][names.ANNOTATION_PRIORITY_DECISION])


def in_budget_pods_quota(namespace: str, pods: int) -> dict[str, Any]:
    """At most `pods` pods at the in-budget class (a ResourceQuota scoped by PriorityClass)."""
    scope = {"scopeName": "PriorityClass", "operator": "In", "values": ["gpu-in-budget"]}
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "in-budget-pods", "namespace": namespace},
        "spec": {"hard": {"pods": str(pods)}, "scopeSelector": {"matchExpressions": [scope]}},
    }


def test_a_job_keeps_one_class_when_its_namespace_is_exhausted_between_its_pods(
    kubectl: Kubectl, api: TimekeeperApi, namespace: str
) -> None:
    """A Job of 4 (parallelism 4) whose controller creates 2 pods, then its namespace is exhausted, then
    the other 2: a quota on in-budget pods holds the controller at 2 until it is raised, after the
    exhaustion (the controller retries after its backoff)."""
    api.set_budget(namespace, 1000)
    wait_for_admission_state(kubectl, namespace, "in_budget")
    kubectl.create(in_budget_pods_quota(namespace, 2))
    wait_until(
        lambda: (
            "hard"
            in (kubectl.json("get", "resourcequota", "in-budget-pods", "-n", namespace).get("status") or {})
        ),
        timeout=30,
        what="the quota's usage to be counted",
    )
    kubectl.create(job(namespace, "train", parallelism=4, completions=4))
    first = wait_for_pods(kubectl, namespace, "train", 2)

    api.set_budget(namespace, 0)

    def exhausted() -> bool:  # until then the quota refuses an in-budget probe
        try:
            probe = kubectl.create(gpu_probe(namespace), "--dry-run=server")
        except KubectlError:
            return False
        return bool(probe["metadata"]["annotations"][names.ANNOTATION_BUDGET_STATE] == "exhausted")

    wait_until(exhausted, timeout=20, what="the webhook to see the namespace exhausted")
    kubectl.run(
        "patch",
        "resourcequota",
        "in-budget-pods",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec":{"hard":{"pods":"4"}}}',
    )
    grown = wait_for_pods(kubectl, namespace, "train", 4)
    # A pod of the gang goes away (preempted, evicted, its node lost): the Job controller recreates it.
    gone = first[0]["metadata"]["name"]
    kubectl.run("delete", "pod", gone, "-n", namespace, "--wait=true")

    def recreated() -> bool:
        return gone not in {pod["metadata"]["name"] for pod in wait_for_pods(kubectl, namespace, "train", 4)}

    wait_until(recreated, timeout=60, what="the Job controller to recreate the deleted pod")
    final = pods_of(kubectl, namespace, "train")
    later = [pod for pod in final if pod["metadata"]["uid"] not in {p["metadata"]["uid"] for p in first}]

    assert classes(first) == {("gpu-in-budget", 1000)}
    assert classes(grown) == classes(final) == {("gpu-in-budget", 1000)}, [decision(p) for p in grown + final]
    assert len(later) == 3  # two created once the quota allowed them, one recreated
    assert {pod["metadata"]["annotations"][names.ANNOTATION_WORKLOAD] for pod in final} == {"Job/train"}
    assert {decision(pod) for pod in later} == {
        "workload-class-kept: workload Job/train keeps class gpu-in-budget"
    }
    # The first pod was decided by the budget; its sibling, created a moment later, may already follow it.
    assert "in-budget: no class chosen; workload Job/train" in {decision(pod) for pod in first}
    # Each pod carries the size the Job declared at its first admission (its parallelism) and that time.
    assert {pod["metadata"]["annotations"][names.ANNOTATION_WORKLOAD_SIZE] for pod in final} == {"4"}
    assert len({pod["metadata"]["annotations"][names.ANNOTATION_WORKLOAD_SINCE] for pod in final}) == 1

    # The budget's change applies to the next workload.
    kubectl.create(job(namespace, "next", parallelism=2, completions=2))
    assert classes(wait_for_pods(kubectl, namespace, "next", 2)) == {("gpu-over-budget", 100)}


def in_budget_job(
    kubectl: Kubectl, api: TimekeeperApi, namespace: str, parallelism: int, completions: int | None = None
) -> dict[str, Any]:
    """A Job admitted in budget, its pods up; then the namespace exhausted."""
    api.set_budget(namespace, 1000)
    wait_for_admission_state(kubectl, namespace, "in_budget")
    created = kubectl.create(job(namespace, "train", parallelism=parallelism, completions=completions))
    assert classes(wait_for_pods(kubectl, namespace, "train", parallelism)) == {("gpu-in-budget", 1000)}
    api.set_budget(namespace, 0)
    wait_for_admission_state(kubectl, namespace, "exhausted")
    return created


def test_pods_claiming_a_workload_past_its_declared_size_get_the_reduced_class(
    kubectl: Kubectl, api: TimekeeperApi, tenant: Tenant, namespace: str
) -> None:
    """A tenant with `edit` writes a pod owned by the in-budget Job (its real uid, `controller: true`): the
    Job's 2 declared pods are up, so the claim is decided by the budget. Gang markers name another workload,
    new, decided by the budget as well."""
    train = in_budget_job(kubectl, api, namespace, parallelism=2)
    owner = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": "train",
        "uid": train["metadata"]["uid"],
        "controller": True,
    }
    claim = placed(gpu_probe(namespace), namespace, "claim")
    claim["metadata"]["ownerReferences"] = [owner]
    marked = placed(gpu_probe(namespace), namespace, "marked")
    marked["metadata"] |= {"ownerReferences": [owner], "labels": {"scheduling.x-k8s.io/pod-group": "train"}}

    stored = [tenant.kubectl.create(claim), tenant.kubectl.create(marked)]

    assert classes(stored) == {("gpu-over-budget", 100)}
    assert (
        decision(stored[0])
        == "exhausted: namespace exhausted; workload Job/train has as many pods as it declared (2)"
    )
    assert stored[1]["metadata"]["annotations"][names.ANNOTATION_WORKLOAD] == "PodGroup/train"
    assert decision(stored[1]) == "exhausted: namespace exhausted; workload PodGroup/train"


def test_a_parallelism_raised_after_the_first_admission_is_not_declared(
    kubectl: Kubectl, api: TimekeeperApi, tenant: Tenant, namespace: str
) -> None:
    """The tenant raises its in-budget Job's parallelism once its namespace is exhausted, up to the
    completions it declared: the size recorded at the first admission (the pods it ran at once) stands,
    and the real Job controller's new pods get the reduced class."""
    in_budget_job(kubectl, api, namespace, parallelism=2, completions=4)

    raised = '{"spec":{"parallelism":4}}'
    tenant.kubectl.run("patch", "job", "train", "-n", namespace, "--type=merge", "-p", raised)
    pods = wait_for_pods(kubectl, namespace, "train", 4)

    assert sorted(pod["spec"]["priorityClassName"] for pod in pods) == [
        "gpu-in-budget",
        "gpu-in-budget",
        "gpu-over-budget",
        "gpu-over-budget",
    ]
    reduced = [pod for pod in pods if pod["spec"]["priorityClassName"] == "gpu-over-budget"]
    assert {decision(pod) for pod in reduced} == {
        "exhausted: namespace exhausted; workload Job/train has as many pods as it declared (2)"
    }


def test_a_replacement_racing_an_eviction_keeps_no_class(
    kubectl: Kubectl, api: TimekeeperApi, namespace: str
) -> None:
    """From 1.26 the Eviction API writes a pod's DisruptionTarget condition before it deletes the pod (this
    1.20 API server does not: the test writes it as the eviction would). While a pod of the Job carries it,
    the replacement the real Job controller creates for a sibling keeps no class from the pod still up."""
    train = in_budget_job(kubectl, api, namespace, parallelism=3)
    originals = [pod["metadata"]["name"] for pod in pods_of(kubectl, namespace, "train")]
    evicting, other, _ = originals
    condition = {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "EvictionByEvictionAPI",
        "message": "Eviction API: evicting",
        "lastTransitionTime": stamp(datetime.now(UTC)),
    }
    set_status(kubectl, namespace, evicting, {"conditions": [condition]})
    probe = placed(gpu_probe(namespace), namespace, "probe")
    probe["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": train["metadata"]["uid"]}
        | {"controller": True}
    ]
    wait_until(
        lambda: "is being evicted" in decision(kubectl.create(probe, "--dry-run=server")),
        timeout=10,
        what="the webhook's watch to show the eviction",
    )

    kubectl.run("delete", "pod", other, "-n", namespace, "--wait=true")
    replaced = wait_for_pods(kubectl, namespace, "train", 3)

    replacement = next(pod for pod in replaced if pod["metadata"]["name"] not in originals)
    assert classes([replacement]) == {("gpu-over-budget", 100)}
    assert decision(replacement) == "exhausted: namespace exhausted; workload Job/train is being evicted"


def test_a_workloads_pods_may_not_rename_their_workload(
    kubectl: Kubectl, api: TimekeeperApi, namespace: str
) -> None:
    api.set_budget(namespace, 1000)
    wait_for_admission_state(kubectl, namespace, "in_budget")
    kubectl.create(job(namespace, "solo", parallelism=1, completions=1))
    pod = wait_for_pods(kubectl, namespace, "solo", 1)[0]
    patch = json.dumps({"metadata": {"annotations": {names.ANNOTATION_WORKLOAD: "Job/other"}}})

    with pytest.raises(KubectlError) as refused:
        kubectl.run("patch", "pod", pod["metadata"]["name"], "-n", namespace, "--type=merge", "-p", patch)

    assert f"annotation {names.ANNOTATION_WORKLOAD}" in refused.value.stderr


def usage(api: TimekeeperApi, namespace: str, group_by: str) -> dict[str, Decimal]:
    answer = api.request(
        "GET", f"/namespaces/{namespace}/usage?group_by={group_by}&since=2000-01-01T00:00:00Z"
    )
    assert answer.is_success, answer.text
    rows = json.loads(answer.text, parse_float=Decimal)["rows"]
    return {row["key"]: Decimal(row["gpu_minutes"]) for row in rows}


def test_usage_by_workload_is_exactly_the_sum_of_its_pods(
    kubectl: Kubectl, api: TimekeeperApi, namespace: str
) -> None:
    """The pod watch carries the webhook's workload annotation to the timekeeper: a Job's pods, which
    never reported (the pass charges their runs), add up to the Job's row exactly, each run a number of
    seconds whose GPU-minutes do not end at the ninth decimal; a bare pod is its own workload."""
    api.set_budget(namespace, 1000)
    wait_for_admission_state(kubectl, namespace, "in_budget")
    kubectl.create(job(namespace, "train", parallelism=3, completions=3))
    bare = kubectl.create(placed(gpu_probe(namespace), namespace, "scratch"))
    pods = [*wait_for_pods(kubectl, namespace, "train", 3), bare]
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=30)
    for pod, seconds in zip(pods, (61, 121, 181, 59), strict=True):
        status = {
            "phase": "Succeeded",
            "startTime": stamp(start),
            "containerStatuses": terminated(pod, start + timedelta(seconds=seconds)),
        }
        set_status(kubectl, namespace, pod["metadata"]["name"], status)
    names_ = [pod["metadata"]["name"] for pod in pods]

    def recorded() -> bool:
        return usage(api, namespace, "workload").keys() == {"Job/train", "Pod/scratch"}

    wait_until(recorded, timeout=30, what="the pass to charge the pods and record their workload")
    by_pod, by_workload = usage(api, namespace, "pod"), usage(api, namespace, "workload")

    assert by_pod.keys() == set(names_)
    assert by_workload == {
        "Job/train": sum(by_pod[name] for name in names_[:3]),
        "Pod/scratch": by_pod["scratch"],
    }
    # 1.016666667 + 2.016666667 + 3.016666667, each pod rounded as its own row; 363 s rounded once: 6.05.
    assert by_workload["Job/train"] == Decimal("6.050000001")
