"""Small factories for the Kubernetes objects the tests put into the stand-in API server."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuaccounting.names import (
    ANNOTATION_GPU_SHARE,
    ANNOTATION_WORKLOAD,
    DEFAULT_IN_BUDGET_PRIORITY_CLASS,
    SIDECAR_CONTAINER_NAME,
)
from tests.support.kube_apiserver import KubeApiServer


def gpu_pod(
    server: KubeApiServer,
    namespace: str,
    name: str,
    *,
    phase: str = "Running",
    gpus: int = 1,
    share: str | None = "1",
    labels: dict[str, str] | None = None,
    controlled: bool = True,
    started_at: str | None = "2026-11-22T00:00:00Z",
    finished_at: str | None = None,
    priority_class: str | None = DEFAULT_IN_BUDGET_PRIORITY_CLASS,
    sidecar: bool = False,
    node: str = "gpu-node-1",
    workload: str | None = None,
) -> dict[str, Any]:
    """A GPU pod as the webhook leaves it (share annotation, class; None: no class; with `sidecar`, our
    native sidecar injected) and the kubelet reports it (phase, times)."""
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": labels or {"app": name},
        "annotations": {ANNOTATION_GPU_SHARE: share} if share is not None else {},
    }
    if workload is not None:  # the workload the webhook named (`<kind>/<name>`)
        metadata["annotations"][ANNOTATION_WORKLOAD] = workload
    if controlled:
        metadata["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": f"{name}-rs",
                "uid": "rs-uid",
                "controller": True,
            }
        ]
    status: dict[str, Any] = {"phase": phase}
    if started_at:
        status["startTime"] = started_at
    if finished_at:
        status["containerStatuses"] = [
            {"name": "main", "state": {"terminated": {"exitCode": 0, "finishedAt": finished_at}}}
        ]
    spec: dict[str, Any] = {
        "nodeName": node,
        "containers": [
            {"name": "main", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
        ],
    }
    if priority_class is not None:
        spec["priorityClassName"] = priority_class
    if sidecar:
        spec["initContainers"] = [
            {"name": SIDECAR_CONTAINER_NAME, "image": "gpu-timekeeper-sidecar:1", "restartPolicy": "Always"}
        ]
    return server.put(
        {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec, "status": status}
    )


def gpu_node(server: KubeApiServer, name: str, product: str | None) -> dict[str, Any]:
    """A node as GPU Feature Discovery labels it (`nvidia.com/gpu.product`; None: no label)."""
    labels = {"kubernetes.io/hostname": name} | ({"nvidia.com/gpu.product": product} if product else {})
    return server.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}})


def pdb(
    server: KubeApiServer, namespace: str, name: str, match: dict[str, str], allowed: int
) -> dict[str, Any]:
    return server.put(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": match}},
            "status": {"disruptionsAllowed": allowed, "currentHealthy": 1, "desiredHealthy": 1},
        }
    )


def dra_pod(
    server: KubeApiServer,
    namespace: str,
    name: str,
    claim: str,
    *,
    started_at: str | None,
    finished_at: str | None = None,
    phase: str = "Running",
    share: str = "1",
) -> dict[str, Any]:
    """A pod whose GPU comes from the ResourceClaim `claim` (no GPU in its limits), as the webhook leaves
    it (its claim's share recorded, our sidecar listing the claim) and the kubelet reports it."""
    pod = gpu_pod(
        server,
        namespace,
        name,
        phase=phase,
        share=share,
        started_at=started_at,
        finished_at=finished_at,
        sidecar=True,
    )
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
    for container in [*pod["spec"]["containers"], *pod["spec"]["initContainers"]]:
        container["resources"] = {"claims": [{"name": "gpu"}]}
    return server.put(pod)


def resource_slice(
    server: KubeApiServer, node: str, devices: list[dict[str, Any]], driver: str = "gpu.nvidia.com"
) -> dict[str, Any]:
    """The devices a DRA driver publishes for a node (resource.k8s.io/v1), each `{"name", "attributes"}`
    with attributes as plain strings."""
    return server.put(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{driver}"},
            "spec": {
                "driver": driver,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {
                        "name": device["name"],
                        "attributes": {k: {"string": v} for k, v in device["attributes"].items()},
                        **({"capacity": device["capacity"]} if "capacity" in device else {}),
                    }
                    for device in devices
                ],
            },
        }
    )


def resource_claim(
    server: KubeApiServer,
    namespace: str,
    name: str,
    devices: list[str],
    *,
    node: str = "gpu-node-1",
    reserved_for: Sequence[dict[str, Any]] = (),
    device_class: str = "gpu.nvidia.com",
    annotations: dict[str, str] | None = None,
    driver: str = "gpu.nvidia.com",
) -> dict[str, Any]:
    """A claim for len(devices) devices of `device_class`, allocated as the scheduler writes it (the named
    devices of the node's pool) and reserved for the pods given."""
    return server.put(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {"deviceClassName": device_class, "count": len(devices)},
                        }
                    ]
                }
            },
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {"request": "gpu", "driver": driver, "pool": node, "device": device}
                            for device in devices
                        ]
                    }
                },
                "reservedFor": [
                    {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
                    for pod in reserved_for
                ],
            },
        }
    )
