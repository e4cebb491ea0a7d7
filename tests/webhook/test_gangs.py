"""Where gang schedulers read a class (webhook/decisions/gangs.py), over real HTTPS: a Volcano PodGroup's
`spec.priorityClassName` is decided as a GPU pod's class; KAI's label `priorityClassName` is removed from a
GPU owner and refused on a GPU pod where it names a higher class; what asks for no GPU is left alone."""

from __future__ import annotations

from typing import Any

import jsonpatch

from gpuaccounting import names
from tests.support.admission_state_server import entry
from tests.support.pods import container, pod, review
from tests.webhook.conftest import Publish, Webhook

VOLCANO = ("scheduling.volcano.sh", "v1beta1", "PodGroup")
JOB = ("batch", "v1", "Job")
VOLCANO_JOB = ("batch.volcano.sh", "v1alpha1", "Job")
GPU = {"nvidia.com/gpu": 1}


def podgroup(
    name: str = "gang", class_name: str | None = None, resources: dict[str, Any] | None = GPU
) -> dict[str, Any]:
    spec: dict[str, Any] = {"minMember": 4}
    if class_name:
        spec["priorityClassName"] = class_name
    if resources:
        spec["minResources"] = resources
    metadata = {"name": name, "namespace": "team-a"}
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": metadata,
        "spec": spec,
    }


def job(label: str | None, requests: dict[str, Any] | None = GPU) -> dict[str, Any]:
    template = pod(container("train", requests), name=None)
    template.pop("apiVersion"), template.pop("kind")
    labels = {"app": "train", **({"priorityClassName": label} if label else {})}
    metadata = {"name": "train", "namespace": "team-a", "labels": labels}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": {"template": template}}


def mutated(
    webhook: Webhook, obj: dict[str, Any], kind: tuple[str, str, str], **kwargs: Any
) -> dict[str, Any]:
    answer = webhook.post("/mutate", review(obj, kind=kind, **kwargs))
    assert answer.status_code == 200 and answer.allowed, answer.body
    return jsonpatch.apply_patch(obj, answer.patch)


def test_a_gpu_podgroups_class_is_decided_as_a_gpu_pods(webhook: Webhook, publish: Publish) -> None:
    in_budget = mutated(webhook, podgroup(class_name="high"), VOLCANO)
    publish(namespaces={"team-a": entry("exhausted")})
    exhausted = mutated(webhook, podgroup(), VOLCANO)
    raised = mutated(webhook, podgroup(class_name="high"), VOLCANO, operation="UPDATE", old=exhausted)

    assert in_budget["spec"]["priorityClassName"] == "gpu-in-budget"  # above the ceiling: replaced
    assert exhausted["spec"]["priorityClassName"] == raised["spec"]["priorityClassName"] == "gpu-over-budget"
    assert exhausted["metadata"]["annotations"][names.ANNOTATION_PRIORITY_DECISION] == (
        "exhausted: namespace exhausted; workload PodGroup/gang"
    )
    assert mutated(webhook, raised, VOLCANO, operation="UPDATE", old=raised) == raised  # idempotent


def volcano_job(class_name: str, requests: dict[str, Any]) -> dict[str, Any]:
    template = {"spec": {"containers": [container("train", requests)], "restartPolicy": "Never"}}
    tasks = [{"name": "worker", "replicas": 2, "template": template}]
    metadata = {"name": "train", "namespace": "team-a"}
    spec = {"minAvailable": 2, "priorityClassName": class_name, "tasks": tasks}
    return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": metadata, "spec": spec}


def test_a_gpu_volcano_jobs_class_is_decided_alike_for_its_controller_to_copy(
    webhook: Webhook, publish: Publish
) -> None:
    publish(namespaces={"team-a": entry("exhausted")})
    gpu = mutated(webhook, volcano_job("high", GPU), VOLCANO_JOB)

    assert gpu["spec"]["priorityClassName"] == "gpu-over-budget"
    assert mutated(webhook, volcano_job("high", {"cpu": "1"}), VOLCANO_JOB) == volcano_job(
        "high", {"cpu": "1"}
    )


def test_a_podgroup_asking_for_no_gpu_is_left_alone(webhook: Webhook, publish: Publish) -> None:
    publish(namespaces={"team-a": entry("exhausted")})
    cpu = podgroup(class_name="high", resources={"cpu": "4"})
    unsized = podgroup(class_name="high", resources=None)

    assert mutated(webhook, cpu, VOLCANO) == cpu
    assert mutated(webhook, unsized, VOLCANO) == unsized


def test_a_gpu_owners_kai_label_above_the_reduced_class_is_removed(webhook: Webhook) -> None:
    answer = webhook.post("/mutate", review(job("high"), kind=JOB))
    stripped = jsonpatch.apply_patch(job("high"), answer.patch)

    assert "priorityClassName" not in stripped["metadata"]["labels"]
    (warning,) = answer.response["warnings"]
    assert warning.startswith("label priorityClassName (high) removed by gpu-timekeeper")
    # Never above what the pods get: the reduced class itself; a CPU owner's label is its own.
    assert mutated(webhook, job("gpu-over-budget"), JOB) == job("gpu-over-budget")
    assert mutated(webhook, job("high", {"cpu": "1"}), JOB) == job("high", {"cpu": "1"})


def test_a_gpu_pods_kai_label_may_not_name_a_class_above_its_own(webhook: Webhook, publish: Publish) -> None:
    publish(namespaces={"team-a": entry("exhausted")})
    labelled = webhook.admit(pod(container("main", GPU), labels={"priorityClassName": "high"}))
    admitted = webhook.admit(pod(container("main", GPU)))
    labels = admitted["metadata"]["labels"]
    raised = {
        **admitted,
        "metadata": {**admitted["metadata"], "labels": {**labels, "priorityClassName": "high"}},
    }
    same = {
        **admitted,
        "metadata": {**admitted["metadata"], "labels": {**labels, "priorityClassName": "gpu-over-budget"}},
    }

    assert labelled["metadata"]["labels"]["priorityClassName"] == "high"  # labels are never changed
    refused = webhook.validate(labelled)
    assert not refused.allowed and "label priorityClassName" in refused.message
    assert not webhook.validate(raised, operation="UPDATE", old=admitted).allowed
    assert webhook.validate(same, operation="UPDATE", old=admitted).allowed
    assert webhook.validate(admitted, operation="UPDATE", old=admitted).allowed
