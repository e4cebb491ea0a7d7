"""The GPU catalogue at admission over real HTTPS: renamed NVIDIA resources are governed with the shipped
defaults; an accelerator the catalogue does not name is denied with the key to add, governed once added."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuaccounting import names
from tests.support.admission_state_server import StateServer, entry, snapshot
from tests.support.pods import container, pod
from tests.webhook.conftest import Publish, Tls, Webhook, serve_webhook

SHIPPED = Path(__file__).resolve().parents[2] / "deployment" / "base" / "hardware" / "hardware.json"


def reduced_and_injected(webhook: Webhook, original: dict[str, Any]) -> dict[str, Any]:
    """The pod as /mutate leaves it in an exhausted namespace: the reduced class and the sidecar."""
    patched = webhook.admit(original)
    assert patched["spec"]["priorityClassName"] == "gpu-over-budget"
    assert patched["spec"]["initContainers"][0]["name"] == names.SIDECAR_CONTAINER_NAME
    return patched


def test_a_renamed_nvidia_resource_is_governed_with_the_shipped_defaults(
    webhook: Webhook, publish: Publish
) -> None:
    publish(namespaces={"team-a": entry("exhausted")})
    patched = reduced_and_injected(webhook, pod(container("train", {"nvidia.com/gpu-0": 4})))
    annotations = patched["metadata"]["annotations"]
    assert (annotations[names.ANNOTATION_GPU_SHARE], annotations[names.ANNOTATION_SHARING_SYSTEM]) == (
        "0.5",
        "clearml",
    )
    assert webhook.validate(patched).allowed
    fractional = webhook.validate(webhook.admit(pod(container("train", {"nvidia.com/gpu-1": "500m"}))))
    assert not fractional.allowed and "rule positive-integer" in fractional.message


def test_an_unknown_accelerator_is_denied_naming_the_key_to_add(webhook: Webhook) -> None:
    answer = webhook.validate(webhook.admit(pod(container("train", {"amd.com/gpu": 1}))))
    assert not answer.allowed
    assert 'container "train": amd.com/gpu=1' in answer.message
    assert 'add "amd.com/gpu" to gpu_resources' in answer.message
    assert "rule unknown-accelerator" in answer.message


@pytest.fixture(scope="module")
def amd_webhook(tls: Tls, state: StateServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Webhook]:
    """A webhook whose hardware file is the shipped one with amd.com/gpu added, as an admin would."""
    document = json.loads(SHIPPED.read_text())
    document["gpu_resources"]["amd.com/gpu"] = {"system": "devices", "units_per_gpu": 1}
    path = tmp_path_factory.mktemp("hardware") / "hardware.json"
    path.write_text(json.dumps(document))
    with serve_webhook(tls, state, hardware_file=path) as served:
        served.wait_until(lambda: served.metric("webhook_state_version") == state.state["version"])
        yield served


def test_an_accelerator_added_to_the_catalogue_is_governed(amd_webhook: Webhook, state: StateServer) -> None:
    version = state.state["version"] + 1

    state.publish(snapshot(version=version, namespaces={"team-a": entry("exhausted")}))
    amd_webhook.wait_until(lambda: amd_webhook.metric("webhook_state_version") == version)
    patched = reduced_and_injected(amd_webhook, pod(container("train", {"amd.com/gpu": 2})))
    annotations = patched["metadata"]["annotations"]
    assert (annotations[names.ANNOTATION_GPU_SHARE], annotations[names.ANNOTATION_SHARING_SYSTEM]) == (
        "2",
        "devices",
    )
    assert amd_webhook.validate(patched).allowed
    state.publish(snapshot(version=version + 1))


@pytest.mark.parametrize(
    "profile", ["1g.10gb+me", "1g.24gb+me.all", "1g.24gb-me", "2g.48gb+gfx", "1c.2g.20gb"]
)
def test_mig_names_nvidias_tools_advertise_are_admitted(webhook: Webhook, profile: str) -> None:
    patched = webhook.admit(pod(container("train", {f"nvidia.com/mig-{profile}": 1})))
    assert patched["metadata"]["annotations"][names.ANNOTATION_SHARING_SYSTEM] == "nvidia-mig"
    assert webhook.validate(patched).allowed


@pytest.mark.parametrize(
    ("resource", "share"),
    [
        ("nvidia.com/mig-1g.10gb.me", "0.142857"),  # the device plugin writes go-nvlib's `+` as `.`
        ("nvidia.com/mig-1g.24gb.me.all", "0.142857"),
        ("nvidia.com/mig-2g.48gb.gfx", "0.285714"),
    ],
)
def test_mig_media_extension_names_are_admitted_at_their_profiles_share(
    webhook: Webhook, publish: Publish, resource: str, share: str
) -> None:
    publish(namespaces={"team-a": entry("exhausted")})
    patched = reduced_and_injected(webhook, pod(container("train", {resource: 1})))
    annotations = patched["metadata"]["annotations"]
    assert (annotations[names.ANNOTATION_GPU_SHARE], annotations[names.ANNOTATION_SHARING_SYSTEM]) == (
        share,
        "nvidia-mig",
    )
    assert webhook.validate(patched).allowed


@pytest.mark.parametrize(
    ("resource", "share", "system"),
    [
        ("nvidia.com/GA102GL_A10", "2", "nvidia"),  # the sandbox device plugin's passthrough A10
        ("nvidia.com/GH100_H100_PCIE", "2", "nvidia"),
        ("nvidia.com/NVIDIA_A10-12Q", "1", "nvidia-vgpu"),  # 12 of the A10's 24 GB, twice
        ("nvidia.com/GRID_T4-4Q", "0.5", "nvidia-vgpu"),
        ("nvidia.com/NVIDIA_A100-3-20C", "0.857143", "nvidia-vgpu"),  # MIG-backed: 3 of 7 slices, twice
        ("nvidia.com/NVIDIA_A100-1-5CME", "0.285714", "nvidia-vgpu"),  # with media extensions
    ],
)
def test_sandbox_and_vgpu_names_are_gpus_at_their_share(
    webhook: Webhook, publish: Publish, resource: str, share: str, system: str
) -> None:
    publish(namespaces={"team-a": entry("exhausted")})
    patched = reduced_and_injected(webhook, pod(container("vm", {resource: 2})))
    annotations = patched["metadata"]["annotations"]
    assert (annotations[names.ANNOTATION_GPU_SHARE], annotations[names.ANNOTATION_SHARING_SYSTEM]) == (
        share,
        system,
    )
    assert webhook.validate(patched).allowed


@pytest.mark.parametrize(
    ("resource", "key"),
    [
        ("nvidia.com/NVIDIA_B9-12Q", 'add "B9" to vgpu_board_memory_gb'),
        ("nvidia.com/2236", 'add "nvidia.com/2236" to gpu_resources'),  # pci.ids lacks the name
        ("nvidia.com/ANYTHING", 'add "nvidia.com/ANYTHING" to gpu_resources'),
    ],
)
def test_what_a_gpu_vendors_domain_holds_that_the_catalogue_does_not_know_is_denied_with_the_key(
    webhook: Webhook, resource: str, key: str
) -> None:
    answer = webhook.validate(webhook.admit(pod(container("vm", {resource: 1}))))
    assert not answer.allowed
    assert key in answer.message and "rule unknown-accelerator" in answer.message


@pytest.mark.parametrize(
    "resource",
    ["nvidia.com/GA102_HIGH_DEFINITION_AUDIO_CONTROLLER", "nvidia.com/hostdev", "nvidia.com/priority"],
)
def test_a_gpu_vendors_resources_that_are_no_gpu_leave_the_pod_alone(webhook: Webhook, resource: str) -> None:
    original = pod(container("vm", {resource: 1}))
    assert webhook.admit(original) == original


def test_hamis_task_priority_beside_its_gpu_resources_changes_no_share(webhook: Webhook) -> None:
    """`nvidia.com/priority` is HAMi's task priority: under NVIDIA's domain, and no GPU."""
    resources = {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 30, "nvidia.com/priority": 1}
    patched = webhook.admit(pod(container("train", resources)))
    annotations = patched["metadata"]["annotations"]
    assert (annotations[names.ANNOTATION_GPU_SHARE], annotations[names.ANNOTATION_SHARING_SYSTEM]) == (
        "0.3",
        "hami",
    )
    assert webhook.validate(patched).allowed
