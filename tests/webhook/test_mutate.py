"""`/mutate` over real HTTPS: each sharing system's pod gets its share, priority and sidecar, the patched
pod is a valid Kubernetes Pod, and a second invocation changes nothing."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest

from gpuaccounting import names
from tests.support.admission_state_server import entry
from tests.support.pods import GPU_PODS, container, pod
from tests.webhook.conftest import Publish, Tls, Webhook, serve_webhook

# The oldest and newest Kubernetes schemas this kubernetes-validate ships at or after native sidecars (1.29).
SCHEMA_VERSIONS = ("1.33", kubernetes_validate.utils.latest_version())


def sidecar_of(patched: dict[str, Any]) -> dict[str, Any]:
    spec = patched["spec"]
    found = [
        c
        for c in (*spec.get("initContainers", ()), *spec["containers"])
        if c["name"] == "gpu-timekeeper-sidecar"
    ]
    assert len(found) == 1
    return found[0]


def env_of(sidecar: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in sidecar["env"]}


@pytest.mark.parametrize("system", sorted(GPU_PODS))
def test_gpu_pod_gets_share_priority_and_a_native_sidecar(webhook: Webhook, system: str) -> None:
    original, share = GPU_PODS[system]
    patched = webhook.admit(copy.deepcopy(original))
    for version in SCHEMA_VERSIONS:
        kubernetes_validate.validate(patched, version, strict=True)
    annotations = patched["metadata"]["annotations"]
    assert annotations[names.ANNOTATION_GPU_SHARE] == share
    assert annotations[names.ANNOTATION_SHARING_SYSTEM] == system
    assert annotations[names.ANNOTATION_BUDGET_STATE] == "in_budget"
    assert (patched["spec"]["priorityClassName"], patched["spec"]["priority"]) == ("gpu-in-budget", 1000)
    assert patched["spec"]["preemptionPolicy"] == "PreemptLowerPriority"
    sidecar = patched["spec"]["initContainers"][0]
    assert sidecar["name"] == "gpu-timekeeper-sidecar" and sidecar["restartPolicy"] == "Always"
    assert env_of(sidecar)["SIDECAR_GPU_SHARE"] == share
    assert annotations[names.ANNOTATION_WORKLOAD] == f"Pod/{original['metadata']['name']}"
    # The user's own containers and labels are untouched; ours marks the pod for the workload watch.
    assert patched["spec"]["containers"] == original["spec"]["containers"]
    assert patched["metadata"]["labels"] == {
        **(original["metadata"].get("labels") or {}),
        names.LABEL_GPU_POD: "true",
    }
    # Re-invocation (reinvocationPolicy: IfNeeded) changes nothing, and the final object validates.
    assert webhook.mutate(patched).patch == []
    assert webhook.validate(patched).allowed


def test_sidecar_env_and_volumes_follow_the_contract(webhook: Webhook) -> None:
    patched = webhook.admit(pod(container("main", {"nvidia.com/gpu": 1})))
    sidecar = sidecar_of(patched)
    env = env_of(sidecar)
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_UID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert env["SIDECAR_TIMEKEEPER_URL"] == webhook.settings.timekeeper_url
    assert env["SIDECAR_TOKEN_FILE"] == "/var/run/secrets/gpu-timekeeper/token"
    assert env["SIDECAR_REPORT_INTERVAL_SECONDS"] == "30"
    assert env["SIDECAR_NVML_BACKEND"] == "pynvml"
    mounts = {mount["name"]: mount["mountPath"] for mount in sidecar["volumeMounts"]}
    assert env["SIDECAR_BUFFER_DIR"] == mounts[names.SIDECAR_BUFFER_VOLUME]
    assert env["SIDECAR_PODINFO_DIR"] == mounts[names.SIDECAR_PODINFO_VOLUME]
    assert env["SIDECAR_TOKEN_FILE"].startswith(mounts[names.SIDECAR_TOKEN_VOLUME] + "/")
    assert not sidecar["image"].endswith(":latest") and ":" in sidecar["image"]
    assert sidecar["resources"]["requests"] == {"cpu": "10m", "memory": "32Mi"}
    volumes = {volume["name"]: volume for volume in patched["spec"]["volumes"]}
    token = volumes[names.SIDECAR_TOKEN_VOLUME]["projected"]["sources"][0]["serviceAccountToken"]
    assert token["audience"] == "gpu-timekeeper"
    assert "emptyDir" in volumes[names.SIDECAR_BUFFER_VOLUME]
    files = {
        item["path"]: item["fieldRef"]["fieldPath"]
        for item in volumes[names.SIDECAR_PODINFO_VOLUME]["downwardAPI"]["items"]
    }
    assert files == {"annotations": "metadata.annotations", "labels": "metadata.labels"}


def test_the_sidecar_is_pointed_at_its_nodes_agent_with_a_token_of_its_own_audience(webhook: Webhook) -> None:
    patched = webhook.admit(pod(container("main", {"nvidia.com/gpu": 1})))
    sidecar = sidecar_of(patched)
    names_in_order = [item["name"] for item in sidecar["env"]]
    env = env_of(sidecar)

    assert env["HOST_IP"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    assert env["SIDECAR_NODEAGENT_URL"] == "http://$(HOST_IP):9402"
    # The kubelet expands $(HOST_IP) only from a variable defined earlier in the list.
    assert names_in_order.index("HOST_IP") < names_in_order.index("SIDECAR_NODEAGENT_URL")
    assert env["SIDECAR_NODEAGENT_TOKEN_FILE"] == "/var/run/secrets/gpu-timekeeper/nodeagent-token"
    volumes = {volume["name"]: volume for volume in patched["spec"]["volumes"]}
    tokens = [s["serviceAccountToken"] for s in volumes[names.SIDECAR_TOKEN_VOLUME]["projected"]["sources"]]
    assert [(t["audience"], t["path"]) for t in tokens] == [
        ("gpu-timekeeper", "token"),
        ("gpu-timekeeper-nodeagent", "nodeagent-token"),
    ]
    assert webhook.validate(patched).allowed


def test_sidecar_goes_before_existing_init_containers_and_user_volumes_stay(webhook: Webhook) -> None:
    original = pod(
        container("main", {"nvidia.com/gpu": 1}),
        init=(container("fetch"),),
        volumes=[{"name": "data", "emptyDir": {}}],
    )
    patched = webhook.admit(original)
    assert [c["name"] for c in patched["spec"]["initContainers"]] == ["gpu-timekeeper-sidecar", "fetch"]
    assert patched["spec"]["volumes"][0] == {"name": "data", "emptyDir": {}}
    assert webhook.mutate(patched).patch == []


def test_reinvocation_after_another_mutator_changed_the_requests_updates_the_share(webhook: Webhook) -> None:
    patched = webhook.admit(pod(container("main", {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 50})))
    # A later mutator (e.g. a device plugin's own webhook) rewrites the request; we are re-invoked.
    patched["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpucores"] = 25
    patched["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpucores"] = 25
    repatched = webhook.admit(patched)
    assert repatched["metadata"]["annotations"][names.ANNOTATION_GPU_SHARE] == "0.25"
    assert env_of(sidecar_of(repatched))["SIDECAR_GPU_SHARE"] == "0.25"
    assert len(repatched["spec"]["initContainers"]) == 1
    assert webhook.validate(repatched).allowed
    assert webhook.mutate(repatched).patch == []


def test_pod_with_only_generate_name_is_admitted(webhook: Webhook) -> None:
    patched = webhook.admit(pod(container("main", {"nvidia.com/gpu": 1}), name=None))
    kubernetes_validate.validate(patched, SCHEMA_VERSIONS[-1], strict=True)
    assert patched["metadata"]["generateName"] == "work-"
    assert patched["metadata"]["annotations"][names.ANNOTATION_GPU_SHARE] == "1"


def test_annotation_keys_are_escaped_in_patch_paths(webhook: Webhook) -> None:
    patch = webhook.mutate(pod(container("main", {"nvidia.com/gpu": 1}), annotations={"team": "a"})).patch
    paths = {operation["path"] for operation in patch}
    assert "/metadata/annotations/gpu-timekeeper.io~1gpu-share" in paths


def test_non_gpu_pod_is_answered_unchanged(webhook: Webhook) -> None:
    answer = webhook.mutate(pod(container("web", {"cpu": "100m", "memory": "64Mi"})))
    assert answer.allowed and answer.patch == [] and "patchType" not in answer.response


def test_user_supplied_share_annotation_is_overwritten(webhook: Webhook) -> None:
    patched = webhook.admit(
        pod(container("main", {"nvidia.com/gpu": 1}), annotations={names.ANNOTATION_GPU_SHARE: "0.01"})
    )
    assert patched["metadata"]["annotations"][names.ANNOTATION_GPU_SHARE] == "1"


def test_user_supplied_workload_bounds_are_dropped(webhook: Webhook) -> None:
    """The bounds of a workload's class reuse are the webhook's record alone; without its pod watch (as
    here) it records none."""
    planted = {names.ANNOTATION_WORKLOAD_SIZE: "1000", names.ANNOTATION_WORKLOAD_SINCE: "2999-01-01T00:00:00"}
    job_pod = pod(container("main", {"nvidia.com/gpu": 1}), annotations=planted)
    job_pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "u", "controller": True}
    ]

    annotations = webhook.admit(job_pod)["metadata"]["annotations"]

    assert annotations[names.ANNOTATION_WORKLOAD] == "Job/train"
    assert not set(planted) & set(annotations)


def test_exhausted_namespace_gets_the_reduced_class(webhook: Webhook, publish: Publish) -> None:
    publish(namespaces={"team-a": entry("exhausted")})
    patched = webhook.admit(pod(container("main", {"nvidia.com/gpu": 1})))
    spec = patched["spec"]
    assert (spec["priorityClassName"], spec["priority"], spec["preemptionPolicy"]) == (
        "gpu-over-budget",
        100,
        "Never",
    )
    annotations = patched["metadata"]["annotations"]
    assert annotations[names.ANNOTATION_BUDGET_STATE] == "exhausted"
    assert annotations[names.ANNOTATION_PRIORITY_DECISION] == "exhausted: namespace exhausted"
    other = webhook.admit(pod(container("main", {"nvidia.com/gpu": 1}), namespace="team-b"))
    assert other["spec"]["priorityClassName"] == "gpu-in-budget"


def test_priority_set_by_the_priority_plugin_is_replaced_consistently(webhook: Webhook) -> None:
    original = pod(
        container("main", {"nvidia.com/gpu": 1}), priority=0, preemptionPolicy="PreemptLowerPriority"
    )
    patched = webhook.admit(original)
    assert (patched["spec"]["priorityClassName"], patched["spec"]["priority"]) == ("gpu-in-budget", 1000)


def test_container_mode_injects_a_plain_container_for_older_clusters(tls: Tls, state: Any) -> None:
    with serve_webhook(tls, state, sidecar_mode="container") as legacy:
        original = pod(container("main", {"nvidia.com/gpu": 1}))
        patched = legacy.admit(original)
        assert legacy.mutate(patched).patch == []
    kubernetes_validate.validate(patched, SCHEMA_VERSIONS[0], strict=True)
    assert "initContainers" not in patched["spec"]
    assert [c["name"] for c in patched["spec"]["containers"]] == ["main", "gpu-timekeeper-sidecar"]
    assert "restartPolicy" not in patched["spec"]["containers"][1]


def test_dry_run_answers_alike_and_leaves_no_trace(tls: Tls) -> None:
    from tests.support.admission_state_server import run_state_server

    with run_state_server(None) as never_loaded, serve_webhook(tls, never_loaded) as served:
        gpu_pod = pod(container("main", {"nvidia.com/gpu": 1}))
        patched = {"endpoint": "mutate", "operation": "CREATE", "result": "patched"}
        dry = served.mutate(gpu_pod, dry_run=True)
        assert served.metric("webhook_state_missing_decisions_total") == 0
        assert served.metric("webhook_admissions_total", **patched) == 0
        real = served.mutate(gpu_pod)
        assert served.metric("webhook_state_missing_decisions_total") == 1
        assert served.metric("webhook_admissions_total", **patched) == 1
        denied = {"endpoint": "validate", "operation": "CREATE", "result": "denied"}
        assert not served.validate(gpu_pod, dry_run=True).allowed  # no sidecar: denied
        assert served.metric("webhook_admissions_total", **denied) == 0
    assert dry.patch == real.patch != []


def test_mirror_pods_of_static_pods_are_left_alone(webhook: Webhook) -> None:
    # The API server refuses ServiceAccount token volumes in mirror pods; the static pod runs regardless.
    mirror = pod(container("main", {"nvidia.com/gpu": 1}), annotations={"kubernetes.io/config.mirror": "abc"})
    assert webhook.mutate(mirror, username="system:node:gpu-1").patch == []
    assert webhook.validate(mirror, username="system:node:gpu-1").allowed


def test_a_mirror_annotation_from_anyone_but_a_node_is_a_pod_like_any_other(webhook: Webhook) -> None:
    """The annotation is the tenant's to write (issue 37's inventory): its pod is mutated and judged."""
    marked = pod(container("main", {"nvidia.com/gpu": 1}), annotations={"kubernetes.io/config.mirror": "abc"})
    assert webhook.mutate(marked).patch != []
    assert not webhook.validate(marked).allowed  # no sidecar: denied


def test_updates_deletes_and_subresources_are_not_mutated(webhook: Webhook) -> None:
    gpu_pod = pod(container("main", {"nvidia.com/gpu": 1}))
    assert webhook.mutate(gpu_pod, operation="UPDATE", old=gpu_pod).patch == []
    assert webhook.mutate(None, operation="DELETE", old=gpu_pod).allowed
    assert webhook.mutate(gpu_pod, operation="UPDATE", old=gpu_pod, subresource="status").patch == []
    assert (
        webhook.mutate(gpu_pod, operation="UPDATE", old=gpu_pod, subresource="ephemeralcontainers").patch
        == []
    )


def test_other_kinds_and_v1beta1_reviews_are_answered(webhook: Webhook) -> None:
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": "team-a"},
    }
    answer = webhook.mutate(deployment, kind=("apps", "v1", "Deployment"))
    assert answer.allowed and answer.patch == []
    # Only a Pod is read, so only a Pod's shape is checked: another kind is answered whatever it holds.
    odd = {**deployment, "spec": {"containers": 3, "template": {"spec": {"containers": []}}}}
    assert webhook.validate(odd, kind=("apps", "v1", "Deployment")).allowed
    beta = webhook.mutate(
        pod(container("main", {"nvidia.com/gpu": 1})), api_version="admission.k8s.io/v1beta1"
    )
    assert beta.body["apiVersion"] == "admission.k8s.io/v1beta1" and beta.patch != []
