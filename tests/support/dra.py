"""DRA objects shaped like NVIDIA's DRA driver quickstart specs (gpu-test1..6) and HAMi's DRA demo claims, in
resource.k8s.io/v1, for admission tests: DeviceClasses, claim templates, claims and the pods naming them."""

from __future__ import annotations

from typing import Any

from tests.support.pods import container, pod

GROUP = "resource.k8s.io"
NVIDIA_GPU_CLASS = "gpu.nvidia.com"
NVIDIA_MIG_CLASS = "mig.nvidia.com"
HAMI_CLASS = "hami-core-gpu.project-hami.io"
# The annotation the scheduler puts on the claim it makes for a pod's extended resources; a tenant can put
# it on its own claims too, so the charge reads it nowhere (issue 37).
EXTENDED_RESOURCE_CLAIM = "resource.kubernetes.io/extended-resource-claim"


def device_class(name: str, expression: str, extended_resource: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": expression}}]}
    if extended_resource:
        spec["extendedResourceName"] = extended_resource
    return {"apiVersion": f"{GROUP}/v1", "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


def _typed(driver: str, kind: str) -> str:
    return f"device.driver == '{driver}' && device.attributes['{driver}'].type == '{kind}'"


DEVICE_CLASSES = [
    device_class(NVIDIA_GPU_CLASS, _typed("gpu.nvidia.com", "gpu")),
    device_class(NVIDIA_MIG_CLASS, _typed("gpu.nvidia.com", "mig")),
    device_class(HAMI_CLASS, _typed(HAMI_CLASS, "hami-gpu"), "nvidia.com/gpu"),
]


def exactly(device_class_name: str, **fields: Any) -> dict[str, Any]:
    return {"deviceClassName": device_class_name, **fields}


def request(name: str, device_class_name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "exactly": exactly(device_class_name, **fields)}


def mig_profile(profile: str) -> list[dict[str, Any]]:
    return [{"cel": {"expression": f"device.attributes['gpu.nvidia.com'].profile == '{profile}'"}}]


def claim_spec(*requests: dict[str, Any], config: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": list(requests)}
    if config:
        devices["config"] = config
    return {"devices": devices}


def sharing(strategy: str) -> list[dict[str, Any]]:
    """The NVIDIA driver's opaque GpuConfig (gpu-test4: TimeSlicing, gpu-test5: MPS)."""
    parameters = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "GpuConfig",
        "sharing": {"strategy": strategy},
    }
    return [{"opaque": {"driver": "gpu.nvidia.com", "parameters": parameters}}]


def template(name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": spec},
    }


def claim(name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def claiming_pod(
    namespace: str,
    *,
    templates: dict[str, str] | None = None,
    claims: dict[str, str] | None = None,
    containers: int = 1,
) -> dict[str, Any]:
    """A pod whose containers all use every claim: entries from `templates` (entry: template name) and
    `claims` (entry: claim name)."""
    entries = [{"name": e, "resourceClaimTemplateName": t} for e, t in (templates or {}).items()]
    entries += [{"name": e, "resourceClaimName": c} for e, c in (claims or {}).items()]
    built = [container(f"ctr{index}") for index in range(containers)]
    for each in built:
        each["resources"] = {"claims": [{"name": entry["name"]} for entry in entries]}
    return pod(*built, namespace=namespace, resourceClaims=entries)


# The quickstart's claim specs and what each could at most be allocated, in GPUs (7 MIG slices per GPU).
SINGLE_GPU = claim_spec(request("gpu", NVIDIA_GPU_CLASS))
QUICKSTART: dict[str, tuple[dict[str, Any], str]] = {
    "gpu-test1": (SINGLE_GPU, "1"),  # one GPU per pod, from a template
    "gpu-test2": (SINGLE_GPU, "1"),  # two containers sharing one claim
    "gpu-test3": (SINGLE_GPU, "1"),  # two pods sharing one named claim
    "gpu-test4": (claim_spec(request("gpu", NVIDIA_GPU_CLASS), config=sharing("TimeSlicing")), "1"),
    "gpu-test5": (claim_spec(request("gpu", NVIDIA_GPU_CLASS, count=2), config=sharing("MPS")), "2"),
    "gpu-test6": (
        claim_spec(
            request("mig-1g", NVIDIA_MIG_CLASS, selectors=mig_profile("1g.10gb")),
            request("mig-2g", NVIDIA_MIG_CLASS, selectors=mig_profile("2g.20gb")),
        ),
        "0.428571",
    ),
    "first-available": (
        claim_spec(
            {
                "name": "gpu",
                "firstAvailable": [
                    {"name": "small", **exactly(NVIDIA_MIG_CLASS, selectors=mig_profile("1g.10gb"))},
                    {"name": "medium", **exactly(NVIDIA_MIG_CLASS, selectors=mig_profile("3g.40gb"))},
                ],
            }
        ),
        "0.428571",
    ),
    "all-gpus": (claim_spec(request("gpus", NVIDIA_GPU_CLASS, allocationMode="All")), "8"),
    "hami-cores": (
        claim_spec(
            request("double-gpu-0-0", HAMI_CLASS, capacity={"requests": {"cores": 30, "memory": "4Gi"}}),
            request("double-gpu-0-1", HAMI_CLASS, capacity={"requests": {"cores": 60, "memory": "8Gi"}}),
        ),
        "0.9",
    ),
    "hami-memory": (
        claim_spec(request("gpu", HAMI_CLASS, capacity={"requests": {"memory": "20Gi"}})),
        "0.25",
    ),
}
