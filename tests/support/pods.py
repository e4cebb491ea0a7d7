"""Small factories for Pod objects as the API server hands them to admission webhooks."""

from __future__ import annotations

import uuid
from typing import Any


def container(
    name: str = "main", requests: dict[str, Any] | None = None, *, restartable: bool = False
) -> dict[str, Any]:
    """A container requesting exactly `requests` (limits equal, as extended resources need)."""
    built: dict[str, Any] = {"name": name, "image": "busybox:1.36"}
    if requests:
        built["resources"] = {"limits": dict(requests), "requests": dict(requests)}
    if restartable:
        built["restartPolicy"] = "Always"
    return built


def pod(
    *containers: dict[str, Any],
    init: tuple[dict[str, Any], ...] = (),
    name: str | None = "work",
    namespace: str = "team-a",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A Pod; without a name it has only `generateName`, as a Job's or a Deployment's pods do."""
    metadata: dict[str, Any] = {"namespace": namespace}
    if name is None:
        metadata["generateName"] = "work-"
    else:
        metadata["name"] = name
    if labels:
        metadata["labels"] = dict(labels)
    if annotations:
        metadata["annotations"] = dict(annotations)
    body: dict[str, Any] = {"containers": list(containers) or [container()], **spec}
    if init:
        body["initContainers"] = list(init)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": body}


def review(
    pod: dict[str, Any] | None,
    *,
    operation: str = "CREATE",
    old: dict[str, Any] | None = None,
    dry_run: bool = False,
    subresource: str | None = None,
    kind: tuple[str, str, str] = ("", "v1", "Pod"),
    api_version: str = "admission.k8s.io/v1",
    username: str = "alice",
) -> dict[str, Any]:
    """An AdmissionReview as the API server sends it."""
    group, version, kind_name = kind
    source = pod or old or {}
    metadata = source.get("metadata", {})
    request: dict[str, Any] = {
        "uid": str(uuid.uuid4()),
        "kind": {"group": group, "version": version, "kind": kind_name},
        "resource": {"group": group, "version": version, "resource": kind_name.lower() + "s"},
        "requestKind": {"group": group, "version": version, "kind": kind_name},
        "namespace": metadata.get("namespace", "team-a"),
        "operation": operation,
        "userInfo": {"username": username, "groups": ["system:authenticated"]},
        "object": pod,
        "oldObject": old,
        "dryRun": dry_run,
        "options": None,
    }
    if metadata.get("name"):
        request["name"] = metadata["name"]
    if subresource:
        request["subResource"] = subresource
    return {"apiVersion": api_version, "kind": "AdmissionReview", "request": request}


def connect_review(
    pod_name: str,
    subresource: str,
    container: str | None,
    *,
    namespace: str = "team-a",
    username: str = "alice",
) -> dict[str, Any]:
    """The AdmissionReview of a CONNECT to `pods/exec` or `pods/attach` (`kubectl exec`, `cp`, `attach`), as
    the API server sends it: the object is the options, naming the container (left out when not given)."""
    kind = "PodExecOptions" if subresource == "exec" else "PodAttachOptions"
    options: dict[str, Any] = {"kind": kind, "apiVersion": "v1", "stdout": True, "stderr": True}
    if subresource == "exec":
        options["command"] = ["cat", "/var/run/secrets/gpu-timekeeper/token"]
    if container is not None:
        options["container"] = container
    body = review(
        options, operation="CONNECT", subresource=subresource, kind=("", "v1", kind), username=username
    )
    request = body["request"]
    request["resource"] = {"group": "", "version": "v1", "resource": "pods"}
    request |= {"name": pod_name, "namespace": namespace}
    return body


# One valid GPU pod per sharing system (keyed by its `sharing-system` annotation value), with its share.
GPU_PODS: dict[str, tuple[dict[str, Any], str]] = {
    "nvidia": (pod(container("main", {"nvidia.com/gpu": 2})), "2"),
    "nvidia-mig": (pod(container("main", {"nvidia.com/mig-3g.40gb": "1"})), "0.428571"),
    "gpu-manager": (
        pod(container("main", {"tencent.com/vcuda-core": 50, "tencent.com/vcuda-memory": 8})),
        "0.5",
    ),
    "metagpu": (pod(container("main", {"cnvrg.io/metagpu": "25"})), "0.25"),
    "aliyun-gpushare": (pod(container("main", {"aliyun.com/gpu-mem": 20})), "0.25"),
    "hami": (pod(container("main", {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 30})), "0.3"),
    "clearml": (pod(container("main"), labels={"clearml-injector/fraction": "0.125"}), "0.125"),
    "kai": (pod(container("main"), annotations={"gpu-fraction": "0.5"}), "0.5"),
    "volcano-vgpu": (
        pod(container("main", {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-memory": "40960"})),
        "0.5",
    ),
}
