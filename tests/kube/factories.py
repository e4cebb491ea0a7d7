"""Small factories for the Kubernetes objects the tests put into the stand-in API server."""

from __future__ import annotations

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
