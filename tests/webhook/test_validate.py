"""`/validate` over real HTTPS: governance on the final object, with denials a user can act on."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpuaccounting import names
from tests.support.admission_state_server import entry
from tests.support.pods import connect_review, container, pod
from tests.webhook.conftest import Publish, Tls, Webhook, serve_webhook

# (pod, what the denial must say): container, resource, value and rule, for each system's invalid variants.
INVALID: dict[str, tuple[dict[str, Any], list[str]]] = {
    "nvidia-fraction": (
        pod(container("train", {"nvidia.com/gpu": "500m"})),
        ['container "train"', "nvidia.com/gpu=500m", "positive whole number", "rule positive-integer"],
    ),
    "mig-unknown-profile": (
        pod(container("train", {"nvidia.com/mig-8g.80gb": 1})),
        ['container "train"', "nvidia.com/mig-8g.80gb=1", "7 compute slices", "rule mig-profile"],
    ),
    "vcuda-core-150": (
        pod(container("train", {"tencent.com/vcuda-core": 150, "tencent.com/vcuda-memory": 8})),
        [
            'container "train"',
            "tencent.com/vcuda-core=150",
            "1-99",
            "multiple of 100",
            "rule vcuda-core-range",
        ],
    ),
    "vcuda-core-alone": (
        pod(container("train", {"tencent.com/vcuda-core": 50})),
        ['container "train"', "tencent.com/vcuda-memory is missing", "rule vcuda-pairing"],
    ),
    "vcuda-memory-fraction": (
        pod(container("train", {"tencent.com/vcuda-core": 50, "tencent.com/vcuda-memory": "0.5"})),
        ["tencent.com/vcuda-memory=0.5", "rule positive-integer"],
    ),
    "metagpu-fraction": (
        pod(container("train", {"cnvrg.io/metagpu": "2.5"})),
        ['container "train"', "cnvrg.io/metagpu=2.5", "rule positive-integer"],
    ),
    "gpushare-count-alone": (
        pod(container("train", {"aliyun.com/gpu-count": 1})),
        [
            'container "train"',
            "aliyun.com/gpu-count=1",
            "needs aliyun.com/gpu-mem",
            "rule device-count-required",
        ],
    ),
    "gpushare-too-much-memory": (
        pod(container("train", {"aliyun.com/gpu-mem": 100})),
        ["aliyun.com/gpu-mem=100", "81920 MiB", "rule memory-within-gpu"],
    ),
    "hami-cores-150": (
        pod(container("train", {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 150})),
        ["nvidia.com/gpucores=150", "1-100", "rule percentage-range"],
    ),
    "hami-cores-alone": (
        pod(container("train", {"nvidia.com/gpucores": 50})),
        ["nvidia.com/gpucores=50", "needs nvidia.com/gpu", "rule device-count-required"],
    ),
    "clearml-0.3": (
        pod(container("train"), labels={"clearml-injector/fraction": "0.3"}),
        ["label clearml-injector/fraction=0.3", "1/16", "7/8", "rule clearml-fraction"],
    ),
    "kai-1.5": (
        pod(container("train"), annotations={"gpu-fraction": "1.5"}),
        ["annotation gpu-fraction=1.5", "at most 1", "rule kai-fraction"],
    ),
    "kai-unknown-container": (
        pod(container("train"), annotations={"gpu-fraction": "0.5", "gpu-fraction-container-name": "trian"}),
        ["annotation gpu-fraction-container-name=trian", "names no container", "rule kai-container"],
    ),
    # Issue 25: a share that rounds to nothing, or runs a GPU for ~nothing, is below its system's floor.
    "kai-a-ten-millionth": (
        pod(container("train"), annotations={"gpu-fraction": "0.0000001"}),
        ["GPU share 1e-07 is below", "for kai, 0.01 (hardware file: minimum_shares)", "rule minimum-share"],
    ),
    "kai-one-mib": (
        pod(container("train"), annotations={"gpu-memory": "1"}),
        ["GPU share 1.2207e-05 is below", "for kai, 0.01", "rule minimum-share"],
    ),
    "hami-one-mib": (
        pod(container("train", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1})),
        ["for hami, 0.01", "rule minimum-share"],
    ),
    "volcano-cores-alone": (
        pod(container("train", {"volcano.sh/vgpu-cores": 50})),
        ["volcano.sh/vgpu-cores=50", "needs volcano.sh/vgpu-number", "rule device-count-required"],
    ),
    "two-systems": (
        pod(container("a", {"cnvrg.io/metagpu": 10}), container("b", {"nvidia.com/gpu": 1})),
        ["one GPU-sharing system", "metagpu, nvidia", "rule single-system"],
    ),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_requests_are_denied_with_an_actionable_message(webhook: Webhook, case: str) -> None:
    bad, expected = INVALID[case]
    answer = webhook.validate(webhook.admit(copy.deepcopy(bad)))
    assert not answer.allowed
    assert answer.response["status"]["code"] == 403
    assert answer.message.startswith("pod work in namespace team-a: ")
    for fragment in expected:
        assert fragment in answer.message


def test_non_gpu_pod_is_allowed(webhook: Webhook) -> None:
    assert webhook.validate(pod(container("web", {"cpu": "1"}))).allowed


def test_share_above_the_namespace_cap_is_denied(webhook: Webhook, publish: Publish) -> None:
    publish(namespaces={"team-a": entry("in_budget", 1.5)})
    big = webhook.admit(pod(container("train", {"nvidia.com/gpu": 2})))
    small = webhook.admit(pod(container("train", {"nvidia.com/gpu": 1})))
    answer = webhook.validate(big)
    assert not answer.allowed
    assert "GPU share 2 is above this namespace's per-pod cap of 1.5" in answer.message
    assert "rule namespace-cap" in answer.message
    assert webhook.validate(small).allowed
    assert webhook.validate(big | {"metadata": {**big["metadata"], "namespace": "team-b"}}).allowed


def test_user_set_share_annotation_that_disagrees_is_denied(webhook: Webhook) -> None:
    # As the final object looks when our mutation did not run (failurePolicy: Ignore) and a user wrote it.
    forged = pod(container("train", {"nvidia.com/gpu": 2}), annotations={names.ANNOTATION_GPU_SHARE: "0.1"})
    answer = webhook.validate(forged)
    assert not answer.allowed
    assert "annotation gpu-timekeeper.io/gpu-share=0.1" in answer.message
    assert "the requests give 2" in answer.message and "rule protected-annotations" in answer.message


def test_a_workload_annotation_other_than_the_pods_own_is_denied(webhook: Webhook) -> None:
    """A pod names its workload only through its markers and owner: a forged name would borrow another
    workload's class, and a non-GPU pod carrying one would speak for a workload it is not part of."""
    gang = webhook.admit(pod(container("train", {"nvidia.com/gpu": 1}), annotations={"pod-group-name": "pg"}))
    assert gang["metadata"]["annotations"][names.ANNOTATION_WORKLOAD] == "PodGroup/pg"
    assert webhook.validate(gang).allowed
    forged = copy.deepcopy(gang)
    forged["metadata"]["annotations"][names.ANNOTATION_WORKLOAD] = "PodGroup/in-budget-gang"
    cpu_only = pod(container("web", {"cpu": "1"}), annotations={names.ANNOTATION_WORKLOAD: "PodGroup/pg"})

    for answer in (webhook.validate(forged), webhook.validate(cpu_only)):
        assert not answer.allowed
        assert "annotation gpu-timekeeper.io/workload" in answer.message
        assert "rule protected-annotations" in answer.message


def test_gpu_pod_the_mutation_missed_is_denied(webhook: Webhook) -> None:
    answer = webhook.validate(pod(container("train", {"nvidia.com/gpu": 1})))
    assert not answer.allowed
    assert "has no gpu-timekeeper-sidecar" in answer.message and "rule sidecar-required" in answer.message


def test_another_container_mounting_the_token_volume_is_denied(webhook: Webhook) -> None:
    thief = container("thief")
    thief["volumeMounts"] = [{"name": names.SIDECAR_TOKEN_VOLUME, "mountPath": "/token"}]
    patched = webhook.admit(pod(container("train", {"nvidia.com/gpu": 1}), thief))
    answer = webhook.validate(patched)
    assert not answer.allowed
    assert 'container "thief": volumeMount=gpu-timekeeper-token' in answer.message
    assert "rule token-volume-mount" in answer.message


def test_a_second_volume_with_a_timekeeper_token_is_denied(webhook: Webhook) -> None:
    smuggled = {
        "name": "my-token",
        "projected": {"sources": [{"serviceAccountToken": {"audience": "gpu-timekeeper", "path": "t"}}]},
    }
    other_audience = {
        "name": "vault-token",
        "projected": {"sources": [{"serviceAccountToken": {"audience": "vault", "path": "t"}}]},
    }
    denied = webhook.validate(
        webhook.admit(pod(container("train", {"nvidia.com/gpu": 1}), volumes=[smuggled]))
    )
    assert not denied.allowed
    assert "volume=my-token" in denied.message and "audience gpu-timekeeper" in denied.message
    allowed = webhook.validate(
        webhook.admit(pod(container("train", {"nvidia.com/gpu": 1}), volumes=[other_audience]))
    )
    assert allowed.allowed


def test_update_may_not_change_our_annotations(webhook: Webhook) -> None:
    old = webhook.admit(pod(container("train", {"nvidia.com/gpu": 1})))
    new = copy.deepcopy(old)
    new["metadata"]["annotations"][names.ANNOTATION_GPU_SHARE] = "0.01"
    answer = webhook.validate(new, operation="UPDATE", old=old)
    assert not answer.allowed
    assert "annotation gpu-timekeeper.io/gpu-share='0.01'" in answer.message
    assert "was '1'" in answer.message and "rule protected-annotations" in answer.message
    removed = copy.deepcopy(old)
    del removed["metadata"]["annotations"][names.ANNOTATION_BUDGET_STATE]
    assert not webhook.validate(removed, operation="UPDATE", old=old).allowed


def test_update_of_other_metadata_is_allowed_even_when_rules_would_now_deny(webhook: Webhook) -> None:
    old = webhook.admit(
        pod(container("train", {"tencent.com/vcuda-core": 150, "tencent.com/vcuda-memory": 1}))
    )
    new = copy.deepcopy(old)
    new["metadata"]["labels"] |= {"touched": "yes"}
    assert webhook.validate(new, operation="UPDATE", old=old).allowed


SHARE_INPUT_UPDATES: dict[str, tuple[dict[str, Any], Any, list[str]]] = {
    # Issue 25: dropped together, so that after a relist the pod is no GPU pod to the timekeeper.
    "KAI marker and our annotations dropped": (
        pod(container("train"), annotations={"gpu-fraction": "0.5"}),
        lambda p: p["metadata"].update(annotations={}),
        [
            "annotation gpu-fraction=None: decides the pod's GPU share and may not change",
            "(was '0.5') (rule protected-share-inputs)",
            "annotation gpu-timekeeper.io/gpu-share=None",
            "rule protected-annotations",
        ],
    ),
    "KAI fraction lowered": (
        pod(container("train"), annotations={"gpu-fraction": "0.5"}),
        lambda p: p["metadata"]["annotations"].update({"gpu-fraction": "0.01"}),
        ["annotation gpu-fraction='0.01'", "(was '0.5')", "rule protected-share-inputs"],
    ),
    "KAI devices added": (
        pod(container("train"), annotations={"gpu-fraction": "0.5"}),
        lambda p: p["metadata"]["annotations"].update({"gpu-fraction-num-devices": "4"}),
        ["annotation gpu-fraction-num-devices='4'", "(was None)", "rule protected-share-inputs"],
    ),
    "ClearML label dropped": (
        pod(container("train"), labels={"clearml-injector/fraction": "0.5"}),
        lambda p: p["metadata"].pop("labels"),
        ["label clearml-injector/fraction=None", "(was '0.5')", "rule protected-share-inputs"],
    ),
    # A resource the GPU catalogue names (not in the device plugins' original list).
    "Volcano memory percentage lowered": (
        pod(container("train", {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-memory-percentage": 50})),
        lambda p: [
            p["spec"]["containers"][0]["resources"][key].update({"volcano.sh/vgpu-memory-percentage": 1})
            for key in ("limits", "requests")
        ],
        ["containers train GPU requests=", "rule protected-share-inputs"],
    ),
    "KAI marker added to a pod admitted without a GPU": (
        pod(container("train")),
        lambda p: p["metadata"].update(annotations={"gpu-fraction": "0.5"}),
        ["annotation gpu-fraction='0.5'", "(was None)", "rule protected-share-inputs"],
    ),
}


@pytest.mark.parametrize("case", sorted(SHARE_INPUT_UPDATES))
@pytest.mark.parametrize("username", ["alice", "system:serviceaccount:gpu-timekeeper:timekeeper"])
def test_update_may_not_change_what_the_share_is_computed_from(
    tls: Tls, state: Any, case: str, username: str
) -> None:
    """Judged against oldObject by /validate itself (1.20 drops matchConditions), for anyone."""
    created, change, expected = SHARE_INPUT_UPDATES[case]
    timekeeper = "system:serviceaccount:gpu-timekeeper:timekeeper"
    with serve_webhook(tls, state, privileged_usernames=timekeeper) as served:
        old = served.admit(copy.deepcopy(created))
        new = copy.deepcopy(old)
        change(new)
        answer = served.validate(new, operation="UPDATE", old=old, username=username)
    assert not answer.allowed
    for fragment in expected:
        # The privileged may change our annotations, never what the share is computed from.
        about_ours = "gpu-timekeeper.io/" in fragment or "protected-annotations" in fragment
        assert (fragment in answer.message) == (not about_ours or username != timekeeper), fragment


@pytest.mark.parametrize("value", [None, "false"], ids=["removed", "changed"])
def test_update_may_not_remove_or_change_our_label(tls: Tls, state: Any, value: str | None) -> None:
    """Issue 37: the pod watch that counts a workload's pods selects them by our label; a tenant that
    removed it from its running pods made room for more at its workload's class."""
    timekeeper = "system:serviceaccount:gpu-timekeeper:timekeeper"
    with serve_webhook(tls, state, privileged_usernames=timekeeper) as served:
        old = served.admit(pod(container("train", {"nvidia.com/gpu": 1})))
        new = copy.deepcopy(old)
        new["metadata"]["labels"].pop(names.LABEL_GPU_POD)
        if value is not None:
            new["metadata"]["labels"][names.LABEL_GPU_POD] = value

        answer = served.validate(new, operation="UPDATE", old=old, username="alice")

        assert not answer.allowed
        assert f"label {names.LABEL_GPU_POD}={value!r}: is written by gpu-timekeeper" in answer.message
        assert served.validate(new, operation="UPDATE", old=old, username=timekeeper).allowed


def test_update_may_not_change_the_sidecar(webhook: Webhook) -> None:
    old = webhook.admit(pod(container("train", {"nvidia.com/gpu": 1})))
    new = copy.deepcopy(old)
    new["spec"]["initContainers"][0]["image"] = "evil/reporter:1"
    answer = webhook.validate(new, operation="UPDATE", old=old)
    assert not answer.allowed and "rule protected-sidecar" in answer.message


def test_ephemeral_container_may_not_mount_the_token(webhook: Webhook) -> None:
    old = webhook.admit(pod(container("train", {"nvidia.com/gpu": 1})))
    debug = copy.deepcopy(old)
    debug["spec"]["ephemeralContainers"] = [
        {
            "name": "debugger",
            "image": "busybox:1.36",
            "volumeMounts": [{"name": names.SIDECAR_TOKEN_VOLUME, "mountPath": "/t"}],
        }
    ]
    answer = webhook.validate(debug, operation="UPDATE", old=old, subresource="ephemeralcontainers")
    assert not answer.allowed and 'container "debugger"' in answer.message
    debug["spec"]["ephemeralContainers"][0]["volumeMounts"] = []
    assert webhook.validate(debug, operation="UPDATE", old=old, subresource="ephemeralcontainers").allowed


def test_status_updates_deletes_and_other_kinds_are_allowed(webhook: Webhook) -> None:
    old = webhook.admit(pod(container("train", {"nvidia.com/gpu": 1})))
    status = copy.deepcopy(old)
    status["metadata"]["annotations"][names.ANNOTATION_GPU_SHARE] = "9"
    assert webhook.validate(status, operation="UPDATE", old=old, subresource="status").allowed
    assert webhook.validate(None, operation="DELETE", old=old).allowed
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "team-a"}}
    assert webhook.validate(config_map, kind=("", "v1", "ConfigMap")).allowed


def test_privileged_user_may_update_our_annotations(tls: Tls, state: Any) -> None:
    timekeeper = "system:serviceaccount:gpu-timekeeper:timekeeper"
    with serve_webhook(tls, state, privileged_usernames=timekeeper) as served:
        old = served.admit(pod(container("train", {"nvidia.com/gpu": 1})))
        new = copy.deepcopy(old)
        new["metadata"]["annotations"][names.ANNOTATION_BUDGET_STATE] = "exhausted"
        assert served.validate(new, operation="UPDATE", old=old, username=timekeeper).allowed
        assert not served.validate(new, operation="UPDATE", old=old, username="alice").allowed


def test_disabled_rules_warn_instead_of_deny(tls: Tls, state: Any) -> None:
    with serve_webhook(tls, state, disabled_rules="vcuda-core-range") as lenient:
        answer = lenient.validate(
            lenient.admit(
                pod(container("train", {"tencent.com/vcuda-core": 150, "tencent.com/vcuda-memory": 8}))
            )
        )
    assert answer.allowed
    assert any("rule vcuda-core-range" in warning for warning in answer.response["warnings"])


@pytest.mark.parametrize("subresource", ["exec", "attach"])
def test_a_session_in_our_sidecar_is_denied_and_one_in_the_pods_own_container_allowed(
    webhook: Webhook, subresource: str
) -> None:
    """`kubectl exec`/`cp`/`attach -c gpu-timekeeper-sidecar` would read the token it reports with (issue 37,
    point 6); a session in the tenant's own container, or one naming none, is none of ours."""
    into_sidecar = connect_review("train", subresource, names.SIDECAR_CONTAINER_NAME)

    denied = webhook.post("/validate", into_sidecar)

    assert denied.status_code == 200 and not denied.allowed
    assert denied.message.startswith("pod train in namespace team-a: ")
    assert f"`kubectl {subresource}` into the injected container" in denied.message
    assert "(rule token-volume-mount)" in denied.message
    for container_name in ("train", None):
        assert webhook.post("/validate", connect_review("train", subresource, container_name)).allowed


def test_a_session_for_port_forward_or_proxy_is_not_judged(webhook: Webhook) -> None:
    """Port forwarding names no container: the sidecar listens on no port, so it reaches nothing of ours."""
    forward = connect_review("train", "exec", names.SIDECAR_CONTAINER_NAME)
    forward["request"]["subResource"] = "portforward"
    forward["request"]["kind"]["kind"] = "PodPortForwardOptions"

    assert webhook.post("/validate", forward).allowed


def test_a_debug_container_targeting_our_sidecar_is_denied(webhook: Webhook) -> None:
    """`kubectl debug --target=gpu-timekeeper-sidecar` joins the sidecar's process namespace, where
    /proc/<pid>/root holds its token; a debug container targeting the tenant's own container is allowed."""
    old = webhook.admit(pod(container("train", {"nvidia.com/gpu": 1})))
    debug = copy.deepcopy(old)
    debug["spec"]["ephemeralContainers"] = [
        {"name": "debugger", "image": "busybox:1.36", "targetContainerName": names.SIDECAR_CONTAINER_NAME}
    ]

    answer = webhook.validate(debug, operation="UPDATE", old=old, subresource="ephemeralcontainers")

    assert not answer.allowed
    assert f'container "debugger": targetContainerName={names.SIDECAR_CONTAINER_NAME}' in answer.message
    debug["spec"]["ephemeralContainers"][0]["targetContainerName"] = "train"
    assert webhook.validate(debug, operation="UPDATE", old=old, subresource="ephemeralcontainers").allowed
