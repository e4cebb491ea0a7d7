"""Small factories for Pod objects as the API server hands them to admission webhooks."""

from __future__ import annotations

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
