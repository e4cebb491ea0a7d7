"""The sidecar is ours, whole: `/mutate` replaces whatever a pod brings under its name, `/validate` compares
the whole container and its volumes with the ones built from settings, and the fields the API server fills
in when it stores a pod never count as a change."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from gpuaccounting import names
from sidecar.config import Config
from tests.support.pods import container, pod, review
from tests.webhook.conftest import Tls, Webhook, serve_webhook
from webhook.decisions.injection import SidecarTemplate
from webhook.reviews.review import MAX_REVIEW_DEPTH

# A GPU pod admitted by the webhook (sidecar_mode=container) and created on kube-apiserver 1.20.2, read back
# with `kubectl get -o json`: terminationMessage*, fieldRef apiVersion, defaultMode filled in.
# (The sidecar's timekeeper URL was the test's own; the file has the shipped one. The workload annotation
# and our label, written since issue 30, were added by hand.)
STORED = Path(__file__).parent / "fixtures" / "stored-pod-1.20.json"
URL = "http://gpu-timekeeper.gpu-timekeeper.svc:8080"


def sidecars(patched: dict[str, Any]) -> list[dict[str, Any]]:
    spec = patched["spec"]
    listed = (*spec.get("initContainers", ()), *spec.get("containers", ()))
    return [c for c in listed if c["name"] == names.SIDECAR_CONTAINER_NAME]


def own_sidecar() -> dict[str, Any]:
    """The sidecar issue 25's tenant brought: the official image, its own command, SIDECAR_GPU_SHARE listed
    twice (the kubelet keeps the last) and a shared emptyDir mounted beside the token."""
    return {
        "name": names.SIDECAR_CONTAINER_NAME,
        "image": "ghcr.io/gpu-timekeeper/sidecar:0.1.0",
        "command": [
            "sh",
            "-c",
            "cp /var/run/secrets/gpu-timekeeper/token /shared/ && exec python -m sidecar",
        ],
        "env": [
            {"name": "SIDECAR_GPU_SHARE", "value": "1"},
            {"name": "SIDECAR_GPU_SHARE", "value": "0.000001"},
        ],
        "volumeMounts": [
            {"name": names.SIDECAR_TOKEN_VOLUME, "mountPath": "/var/run/secrets/gpu-timekeeper"},
            {"name": "shared", "mountPath": "/shared"},
        ],
    }


def attacked_pod(*, in_init: bool) -> dict[str, Any]:
    reader = container("train", {"nvidia.com/gpu": 1})
    reader["volumeMounts"] = [{"name": "shared", "mountPath": "/shared"}]
    placed = {"init": (own_sidecar(),)} if in_init else {}
    containers = (reader,) if in_init else (reader, own_sidecar())
    return pod(*containers, volumes=[{"name": "shared", "emptyDir": {}}], **placed)


@pytest.mark.parametrize("in_init", [True, False], ids=["as-init-container", "as-container"])
def test_a_sidecar_the_pod_brings_is_replaced_by_ours(webhook: Webhook, in_init: bool) -> None:
    patched = webhook.admit(attacked_pod(in_init=in_init))
    [sidecar] = sidecars(patched)
    assert sidecar == SidecarTemplate(webhook.settings).container("1")
    assert patched["spec"]["initContainers"][0] == sidecar
    env_names = [item["name"] for item in sidecar["env"]]
    assert len(env_names) == len(set(env_names))
    assert webhook.validate(patched).allowed
    assert webhook.mutate(patched).patch == []


def test_our_volumes_the_pod_brings_are_replaced_by_ours(webhook: Webhook) -> None:
    squatted = pod(
        container("train", {"nvidia.com/gpu": 1}),
        volumes=[{"name": names.SIDECAR_TOKEN_VOLUME, "emptyDir": {}}, {"name": "data", "emptyDir": {}}],
    )
    patched = webhook.admit(squatted)
    assert patched["spec"]["volumes"] == [
        {"name": "data", "emptyDir": {}},
        *SidecarTemplate(webhook.settings).volumes,
    ]
    assert webhook.validate(patched).allowed


ALTERATIONS = {
    "own command": ("command", lambda s: s.update(command=["sh", "-c", "sleep infinity"])),
    "share listed twice": (
        "env",
        lambda s: s["env"].append({"name": "SIDECAR_GPU_SHARE", "value": "0.000001"}),
    ),
    "extra mount": (
        "volumeMounts",
        lambda s: s["volumeMounts"].append({"name": "shared", "mountPath": "/s"}),
    ),
    "token mounted writable": ("volumeMounts", lambda s: s["volumeMounts"][0].update(readOnly=False)),
    "more memory": ("resources", lambda s: s["resources"]["limits"].update(memory="64Gi")),
    "privileged": ("securityContext", lambda s: s["securityContext"].update(privileged=True)),
}


@pytest.mark.parametrize("case", sorted(ALTERATIONS))
def test_a_sidecar_altered_after_injection_is_denied(webhook: Webhook, case: str) -> None:
    """What a later mutator (or a pod the mutation missed) holds is compared whole with ours."""
    field, alter = ALTERATIONS[case]
    patched = webhook.admit(pod(container("train", {"nvidia.com/gpu": 1})))
    alter(sidecars(patched)[0])
    answer = webhook.validate(patched)
    assert not answer.allowed
    assert (
        'container "gpu-timekeeper-sidecar"' in answer.message and "rule protected-sidecar" in answer.message
    )
    assert f"its {field} differ from the sidecar gpu-timekeeper builds" in answer.message


def test_a_sidecar_of_another_image_is_denied_with_the_image_named(webhook: Webhook) -> None:
    patched = webhook.admit(pod(container("train", {"nvidia.com/gpu": 1})))
    sidecars(patched)[0]["image"] = "evil/reporter:1"
    answer = webhook.validate(patched)
    assert not answer.allowed
    assert "image evil/reporter:1 is not ghcr.io/gpu-timekeeper/sidecar:0.1.0" in answer.message


def test_a_token_volume_altered_after_injection_is_denied(webhook: Webhook) -> None:
    patched = webhook.admit(pod(container("train", {"nvidia.com/gpu": 1})))
    token = next(v for v in patched["spec"]["volumes"] if v["name"] == names.SIDECAR_TOKEN_VOLUME)
    token["projected"]["sources"][0]["serviceAccountToken"]["expirationSeconds"] = 86400 * 365
    answer = webhook.validate(patched)
    assert not answer.allowed
    assert "volume gpu-timekeeper-token is not the one gpu-timekeeper injects" in answer.message


def stored(native: bool) -> dict[str, Any]:
    """The stored pod; native: as a 1.29+ API server stores it (1.20 drops initContainers[].restartPolicy)."""
    admitted = json.loads(STORED.read_text())
    if native:
        spec = admitted["spec"]
        [sidecar] = [c for c in spec["containers"] if c["name"] == names.SIDECAR_CONTAINER_NAME]
        spec["containers"].remove(sidecar)
        spec["initContainers"] = [{**sidecar, "restartPolicy": "Always"}]
    return admitted


@pytest.mark.parametrize("mode", ["container", "native"])
def test_the_pod_as_the_api_server_stores_it_is_ours(tls: Tls, state: Any, mode: str) -> None:
    """The defaults and canonical quantities the API server writes are no change: no denial, no patch."""
    with serve_webhook(
        tls, state, sidecar_mode=mode, sidecar_memory_limit="0.0625Gi", sidecar_timekeeper_url=URL
    ) as served:
        as_stored = stored(mode == "native")
        assert served.validate(as_stored).allowed
        assert served.mutate(as_stored).patch == []
        old = copy.deepcopy(as_stored)
        as_stored["metadata"]["labels"] |= {"touched": "yes"}
        assert served.validate(as_stored, operation="UPDATE", old=old).allowed


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
def test_a_sidecar_nested_a_thousand_deep_is_answered(webhook: Webhook, path: str) -> None:
    """A sidecar nested deeper than any review the API server sends is refused as malformed before
    anything compares or patches it: a precise 400, never a 500."""
    patched = webhook.admit(pod(container("train", {"nvidia.com/gpu": 1})))
    sidecars(patched)[0]["args"] = "NESTED"
    body = orjson.dumps(review(patched)).replace(b'"NESTED"', b"[" * 1000 + b"]" * 1000)
    answer = webhook.post(path, body)
    assert answer.status_code == 400
    assert answer.body["detail"] == f"body: nested deeper than {MAX_REVIEW_DEPTH} levels"


TOKEN_READERS = {
    "a subPath mount": (
        "containers",
        {"name": names.SIDECAR_TOKEN_VOLUME, "mountPath": "/t", "subPath": "token"},
    ),
    "an init container's mount": ("initContainers", {"name": names.SIDECAR_TOKEN_VOLUME, "mountPath": "/t"}),
    # The reports the sidecar has not sent yet: whoever writes them reports as this pod.
    "the buffer": ("containers", {"name": names.SIDECAR_BUFFER_VOLUME, "mountPath": "/b"}),
}


@pytest.mark.parametrize("case", sorted(TOKEN_READERS))
def test_no_container_but_ours_mounts_the_token(webhook: Webhook, case: str) -> None:
    key, mount = TOKEN_READERS[case]
    reader = container("reader")
    reader["volumeMounts"] = [mount]
    placed = {"init": (reader,)} if key == "initContainers" else {}
    containers = (container("train", {"nvidia.com/gpu": 1}),) + (() if placed else (reader,))
    answer = webhook.validate(webhook.admit(pod(*containers, **placed)))
    assert not answer.allowed
    assert f'container "reader": volumeMount={mount["name"]}' in answer.message


def test_a_gpu_pod_may_not_share_its_process_namespace(webhook: Webhook) -> None:
    """A container running as the sidecar's user would read the token through /proc/<pid>/root."""
    shared = pod(container("train", {"nvidia.com/gpu": 1}), shareProcessNamespace=True)
    answer = webhook.validate(webhook.admit(shared))
    assert not answer.allowed
    assert "shareProcessNamespace=true" in answer.message and "rule token-volume-mount" in answer.message
    assert webhook.validate(webhook.admit(pod(container("train", {"nvidia.com/gpu": 1})))).allowed


def test_a_rebuilt_sidecar_keeps_its_place(tls: Tls, state: Any) -> None:
    """Re-invoked after a later mutator appended a GPU container: the share changes, the order does not."""
    with serve_webhook(tls, state, sidecar_mode="container") as served:
        patched = served.admit(pod(container("train", {"nvidia.com/gpu": 1})))
        patched["spec"]["containers"].append(container("helper", {"nvidia.com/gpu": 1}))
        again = served.admit(patched)
    assert [c["name"] for c in again["spec"]["containers"]] == [
        "train",
        names.SIDECAR_CONTAINER_NAME,
        "helper",
    ]
    assert {"name": "SIDECAR_GPU_SHARE", "value": "2"} in sidecars(again)[0]["env"]


@pytest.mark.parametrize("case", sorted(ALTERATIONS))
def test_an_update_may_change_no_field_of_the_sidecar(webhook: Webhook, case: str) -> None:
    """protected-sidecar compares the whole container against oldObject, not only its image."""
    old = webhook.admit(pod(container("train", {"nvidia.com/gpu": 1})))
    new = copy.deepcopy(old)
    ALTERATIONS[case][1](sidecars(new)[0])
    answer = webhook.validate(new, operation="UPDATE", old=old)
    assert not answer.allowed and "rule protected-sidecar" in answer.message


def sidecar_environment(sidecar: dict[str, Any]) -> dict[str, str]:
    """The sidecar's environment as the kubelet would give it (fieldRefs read from a made-up pod)."""
    fields = {"metadata.namespace": "team-x", "metadata.name": "train-0", "metadata.uid": "uid-1"}
    fields["status.hostIP"] = "10.0.0.7"
    return {
        item["name"]: item["value"] if "value" in item else fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
        for item in sidecar["env"]
    }


def test_a_members_webhook_gives_its_sidecars_the_cluster(tls: Tls, state: Any, webhook: Webhook) -> None:
    """In a fleet's member the webhook injects its own WEBHOOK_CLUSTER, so no pod is configured by hand
    and the sidecar names its cluster to the hub; a single cluster's sidecar is built as it always was."""
    with serve_webhook(tls, state, cluster="eu-b") as member:
        patched = member.admit(pod(container("train", {"nvidia.com/gpu": 1})))
        assert member.validate(patched).allowed
        assert member.mutate(patched).patch == []
    [sidecar] = sidecars(patched)
    assert {"name": "SIDECAR_CLUSTER", "value": "eu-b"} in sidecar["env"]
    assert Config.from_env(sidecar_environment(sidecar)).cluster == "eu-b"

    [single] = sidecars(webhook.admit(pod(container("train", {"nvidia.com/gpu": 1}))))
    assert "SIDECAR_CLUSTER" not in sidecar_environment(single)
    assert Config.from_env(sidecar_environment(single)).cluster is None
