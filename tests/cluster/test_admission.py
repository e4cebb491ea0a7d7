"""Admission through a real API server: pods created with kubectl pass the shipped webhook configurations,
the API server applies our JSONPatch, the Priority plugin and the Pod validation judge the result, and
what is stored is what a user gets back.

On 1.20 the sidecar is a plain container (WEBHOOK_SIDECAR_MODE=container): this API server drops
`restartPolicy: Always` on init containers, so the native sidecar is judged only by the stand-in tests
(tests/webhook/test_mutate.py validates it against the 1.33+ Pod schema).
"""

from __future__ import annotations

from typing import Any

import pytest

from gpuaccounting import names
from tests.cluster.harness import Kubectl, TimekeeperApi, gpu_probe, placed, wait_for_admission_state
from tests.support.pods import GPU_PODS, container, pod

IN_BUDGET = ("gpu-in-budget", 1000, "PreemptLowerPriority")
OVER_BUDGET = ("gpu-over-budget", 100, "Never")


def as_stored(resources: dict[str, dict[str, Any]]) -> dict[str, dict[str, str]]:
    """Quantities as the API server returns them: strings (these are already canonical)."""
    return {kind: {name: str(value) for name, value in values.items()} for kind, values in resources.items()}


def priority_of(stored: dict[str, Any]) -> tuple[str, int, str]:
    spec = stored["spec"]
    return spec["priorityClassName"], spec["priority"], spec["preemptionPolicy"]


def sidecar_of(stored: dict[str, Any]) -> dict[str, Any]:
    (sidecar,) = [c for c in stored["spec"]["containers"] if c["name"] == names.SIDECAR_CONTAINER_NAME]
    return sidecar


@pytest.mark.parametrize("system", sorted(GPU_PODS))
def test_a_gpu_pod_of_each_sharing_system_is_stored_as_the_webhook_made_it(
    kubectl: Kubectl, api: TimekeeperApi, namespace: str, system: str
) -> None:
    original, share = GPU_PODS[system]
    api.set_budget(namespace, 1000)
    wait_for_admission_state(kubectl, namespace, "in_budget")

    kubectl.create(placed(original, namespace, "work"))
    stored = kubectl.json("get", "pod", "work", "-n", namespace)

    assert priority_of(stored) == IN_BUDGET
    annotations = stored["metadata"]["annotations"]
    assert annotations[names.ANNOTATION_GPU_SHARE] == share
    assert annotations[names.ANNOTATION_SHARING_SYSTEM] == system
    assert annotations[names.ANNOTATION_BUDGET_STATE] == "in_budget"
    assert annotations[names.ANNOTATION_INJECTED] == sidecar_of(stored)["image"]
    # Container mode: the sidecar is the last app container; the user's containers come first, unchanged.
    containers = stored["spec"]["containers"]
    assert [c["name"] for c in containers] == ["main", names.SIDECAR_CONTAINER_NAME]
    assert containers[0]["resources"] == as_stored(original["spec"]["containers"][0].get("resources", {}))
    assert "initContainers" not in stored["spec"]
    env = {item["name"]: item for item in sidecar_of(stored)["env"]}
    assert env["SIDECAR_GPU_SHARE"]["value"] == share
    assert env["POD_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"

    volumes = {volume["name"]: volume for volume in stored["spec"]["volumes"]}
    sources = volumes[names.SIDECAR_TOKEN_VOLUME]["projected"]["sources"]
    audiences = {source["serviceAccountToken"]["audience"] for source in sources}
    assert names.TOKEN_AUDIENCE in audiences
    assert "emptyDir" in volumes[names.SIDECAR_BUFFER_VOLUME]
    assert "downwardAPI" in volumes[names.SIDECAR_PODINFO_VOLUME]
    mounted = {mount["name"] for mount in sidecar_of(stored)["volumeMounts"]}
    assert {names.SIDECAR_TOKEN_VOLUME, names.SIDECAR_BUFFER_VOLUME, names.SIDECAR_PODINFO_VOLUME} <= mounted


def test_an_exhausted_namespaces_pod_gets_the_reduced_class(
    kubectl: Kubectl, api: TimekeeperApi, namespace: str
) -> None:
    api.set_budget(namespace, 0)
    wait_for_admission_state(kubectl, namespace, "exhausted")

    stored = kubectl.create(placed(gpu_probe(namespace), namespace, "late"))

    assert priority_of(stored) == OVER_BUDGET
    assert (
        stored["metadata"]["annotations"][names.ANNOTATION_PRIORITY_DECISION]
        == "exhausted: namespace exhausted"
    )


def test_the_priority_plugin_judges_the_class_and_value_together(kubectl: Kubectl, namespace: str) -> None:
    """Why the webhook sets `priority` and `preemptionPolicy` with the class: the Priority plugin refuses
    a pod whose value disagrees with its class (here a non-GPU pod, which the webhook leaves alone)."""
    mismatched = pod(container("web"), name="web", namespace=namespace)
    mismatched["spec"] |= {"priorityClassName": "gpu-in-budget", "priority": 5}

    refusal = kubectl.refusal(mismatched)

    assert "the integer value of priority (5) must not be provided in pod spec" in refusal
    assert "computed 1000 from the given PriorityClass name" in refusal


def test_a_governance_denial_reaches_kubectl_with_our_message(kubectl: Kubectl, namespace: str) -> None:
    bad = pod(
        container("train", {"tencent.com/vcuda-core": 150, "tencent.com/vcuda-memory": 8}),
        name="bad",
        namespace=namespace,
    )

    refusal = kubectl.refusal(bad)

    assert 'admission webhook "validate.gpu-timekeeper.io" denied the request' in refusal
    for fragment in (
        'container "train"',
        "tencent.com/vcuda-core=150",
        "multiple of 100",
        "vcuda-core-range",
    ):
        assert fragment in refusal
