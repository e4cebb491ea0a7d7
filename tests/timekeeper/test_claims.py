"""A DRA claim's charge from its allocation, decided without the API server: each allocated device's
share (whole, MIG profile, consumable capacity, admin access), its model (a MIG device's parent's), grouped
by model; no charge for devices that are no GPU, nor for the claim the scheduler made for a pod's extended
resources (known from the pod's status, never from the claim's annotations, which are the tenant's)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from gpuaccounting.shares import GpuHardware
from tests.support.dra import EXTENDED_RESOURCE_CLAIM
from timekeeper.kube.types import pod_info
from timekeeper.reconcile.claims import (
    ClaimConsumers,
    ClaimPart,
    ClaimRegistry,
    claim_parts,
    merged,
    pod_claim_names,
    slice_devices,
)
from timekeeper.reconcile.pods import TrackedPod

# What only a pod's status says, and only the scheduler writes: the claim it made for `nvidia.com/gpu`.
EXTENDED_STATUS = {
    "resourceClaimName": "c",
    "requestMappings": [{"containerName": "main", "resourceName": "nvidia.com/gpu", "requestName": "r0"}],
}

HARDWARE = GpuHardware()
T0 = datetime(2026, 3, 18, 12, 0, tzinfo=UTC)


def device(name: str, capacity: dict[str, str] | None = None, **attributes: Any) -> dict[str, Any]:
    found: dict[str, Any] = {
        "name": name,
        "attributes": {
            f"gpu.nvidia.com/{k}" if k == "uuid" else k: {"string": v} for k, v in attributes.items()
        },
    }
    if capacity:
        found["capacity"] = {k: {"value": v} for k, v in capacity.items()}
    return found


def resource_slice(driver: str, devices: list[dict[str, Any]], pool: str = "node-1") -> dict[str, Any]:
    return {"spec": {"driver": driver, "pool": {"name": pool}, "devices": devices}}


def claim(
    results: list[dict[str, Any]],
    requests: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
    uid: str = "claim-uid",
) -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "name": "c", "namespace": "team-a", "annotations": annotations or {}},
        "spec": {
            "devices": {
                "requests": requests or [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]
            }
        },
        "status": {"allocation": {"devices": {"results": results}}},
    }


def result(
    device_name: str, request: str = "gpu", driver: str = "gpu.nvidia.com", **extra: Any
) -> dict[str, Any]:
    return {"request": request, "driver": driver, "pool": "node-1", "device": device_name, **extra}


NVIDIA = resource_slice(
    "gpu.nvidia.com",
    [
        device("gpu-0", uuid="GPU-0", productName="NVIDIA H100 80GB HBM3"),
        device("gpu-1", uuid="GPU-1", productName="NVIDIA A100-SXM4-80GB"),
        device("mig-3g", uuid="MIG-3", profile="3g.40gb", parentUUID="GPU-1"),
    ],
)


def parts(obj: dict[str, Any], *slices: dict[str, Any]) -> list[ClaimPart]:
    return claim_parts(obj, slice_devices(slices or (NVIDIA,)), HARDWARE)


def test_whole_gpus_are_counted_per_device_and_grouped_by_model():
    found = parts(claim([result("gpu-0"), result("gpu-1")]))

    assert found == [
        ClaimPart("claim-uid", "NVIDIA-A100-SXM4-80GB", Decimal(1)),
        ClaimPart("claim-uid-1", "NVIDIA-H100-80GB-HBM3", Decimal(1)),
    ]


def test_a_mig_device_is_its_profiles_slices_of_its_parent_gpu():
    requests = [{"name": "mig", "exactly": {"deviceClassName": "mig.nvidia.com"}}]

    [part] = parts(claim([result("mig-3g", request="mig")], requests))

    assert (part.model, part.share) == ("NVIDIA-A100-SXM4-80GB", Decimal(3) / Decimal(7))


def test_a_first_available_alternative_is_read_by_its_subrequest_name():
    requests = [
        {
            "name": "gpu",
            "firstAvailable": [
                {"name": "big", "deviceClassName": "gpu.nvidia.com"},
                {"name": "small", "deviceClassName": "mig.nvidia.com"},
            ],
        }
    ]

    [part] = parts(claim([result("mig-3g", request="gpu/small")], requests))

    assert part.share == Decimal(3) / Decimal(7)


def test_consumable_capacity_is_the_part_consumed_of_the_device():
    hami = resource_slice(
        "hami.io", [device("gpu-0", {"cores": "100", "memory": "80Gi"}, productName="Tesla T4")]
    )
    requests = [{"name": "gpu", "exactly": {"deviceClassName": "hami-core-gpu.project-hami.io"}}]
    consumed = result("gpu-0", driver="hami.io", consumedCapacity={"cores": "30", "memory": "20Gi"})

    [part] = parts(claim([consumed], requests), hami)

    assert (part.model, part.share) == ("Tesla-T4", Decimal("0.3"))  # the larger of 30/100 and 20/80


def test_admin_access_devices_and_other_drivers_devices_charge_nothing():
    nic = resource_slice("nic.example.com", [device("eth-0")])
    requests = [
        {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "adminAccess": True}},
        {"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}},
    ]
    results = [result("gpu-0", adminAccess=True), result("eth-0", request="nic", driver="nic.example.com")]

    assert parts(claim(results, requests), NVIDIA, nic) == []


def test_a_claim_annotated_as_an_extended_resources_is_charged_as_any_claim():
    """The tenant writes its claim's annotations (or its template's spec.metadata, which the claim
    copies): `resource.kubernetes.io/extended-resource-claim` decides nothing."""
    annotated = claim([result("gpu-0")], annotations={EXTENDED_RESOURCE_CLAIM: "true"})

    assert parts(annotated) == [ClaimPart("claim-uid", "NVIDIA-H100-80GB-HBM3", Decimal(1))]


def tracked(uid: str, share: str, extended: dict[str, Any] | None = None) -> TrackedPod:
    raw: dict[str, Any] = {
        "metadata": {"name": uid, "namespace": "team-a", "uid": uid, "resourceVersion": "1"},
        "spec": {"containers": [{"name": "main"}]},
        "status": {"phase": "Running"},
    }
    if extended is not None:
        raw["status"]["extendedResourceClaimStatus"] = extended
    return TrackedPod(pod_info(raw), Decimal(share))


def extended_claim(reserved: list[str]):
    registry = ClaimRegistry()
    obj = claim([result("gpu-0")])
    obj["status"]["reservedFor"] = [{"resource": "pods", "name": uid, "uid": uid} for uid in reserved]
    registry.update([obj], [NVIDIA], HARDWARE)
    return registry.claims()["claim-uid"]


def test_the_schedulers_claim_for_a_pods_extended_resource_is_left_to_the_pods_share():
    consumers = ClaimConsumers([tracked("pod-a", "1", EXTENDED_STATUS)], HARDWARE.catalogue)
    made = extended_claim(["pod-a"])

    assert consumers.charged_to_pods(made, consumers.of(made))


@pytest.mark.parametrize(
    ("pods", "why"),
    [
        ([tracked("pod-a", "1")], "no pod's status names the claim"),
        ([tracked("pod-a", "0", EXTENDED_STATUS)], "the pod's admitted share counts nothing"),
        (
            [tracked("pod-a", "1", {**EXTENDED_STATUS, "requestMappings": []})],
            "no request is mapped to an extended resource",
        ),
        (
            [
                tracked(
                    "pod-a",
                    "1",
                    {
                        **EXTENDED_STATUS,
                        "requestMappings": [{"containerName": "main", "resourceName": "example.com/fast"}],
                    },
                )
            ],
            "the extended resource is no GPU to the catalogue, so the pod's share did not count it",
        ),
        (
            [tracked("pod-a", "1", EXTENDED_STATUS), tracked("pod-b", "1")],
            "another pod uses the claim too",
        ),
        (
            [tracked("pod-a", "1", {**EXTENDED_STATUS, "resourceClaimName": "other"})],
            "the pod's status names another claim",
        ),
        ([tracked("pod-a", "0.25", EXTENDED_STATUS)], "a time-sliced share below the whole device given"),
    ],
)
def test_any_other_claim_is_charged(pods: list[TrackedPod], why: str):
    consumers = ClaimConsumers(pods, HARDWARE.catalogue)
    made = extended_claim([pod.info.uid for pod in pods])

    assert not consumers.charged_to_pods(made, consumers.of(made)), why


def test_a_device_no_slice_publishes_counts_whole_and_unweighted():
    assert parts(claim([result("gone")])) == [ClaimPart("claim-uid", None, Decimal(1))]


def test_v1beta1_slices_nest_a_devices_fields_in_basic():
    old = {
        "spec": {
            "driver": "gpu.nvidia.com",
            "pool": {"name": "node-1"},
            "devices": [{"name": "gpu-0", "basic": {"attributes": {"productName": {"string": "Tesla T4"}}}}],
        }
    }

    [part] = parts(claim([result("gpu-0")]), old)

    assert part.model == "Tesla-T4"


def test_consumers_are_the_union_of_reserved_pods_and_their_time_merged():
    registry = ClaimRegistry()
    first = claim([result("gpu-0")])
    first["status"]["reservedFor"] = [{"resource": "pods", "name": "a", "uid": "pod-a"}]
    registry.update([first], [NVIDIA], HARDWARE)
    first["status"]["reservedFor"] = [{"resource": "pods", "name": "b", "uid": "pod-b"}]
    registry.update([first], [NVIDIA], HARDWARE)
    registry.update([], [NVIDIA], HARDWARE)

    tracked = registry.claims()["claim-uid"]
    assert (tracked.consumers, tracked.listed) == ({"pod-a", "pod-b"}, False)
    hour = timedelta(hours=1)
    assert merged([(T0 + hour, T0 + 2 * hour), (T0, T0 + hour), (T0 + 3 * hour, T0 + 4 * hour)]) == [
        (T0, T0 + 2 * hour),
        (T0 + 3 * hour, T0 + 4 * hour),
    ]


def test_a_pod_names_its_claims_and_the_ones_made_from_its_templates():
    pod = {
        "spec": {
            "resourceClaims": [
                {"name": "a", "resourceClaimName": "named"},
                {"name": "b", "resourceClaimTemplateName": "t"},
            ]
        },
        "status": {"resourceClaimStatuses": [{"name": "b", "resourceClaimName": "pod-b-xyz"}]},
    }

    assert pod_claim_names(pod) == {"named", "pod-b-xyz"}
