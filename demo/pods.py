"""Simulated pods: created the way the API server does it (an AdmissionReview to the real webhook's
/mutate, the returned JSONPatch applied, the final object to /validate), then "run" the way a kubelet
would run the injected sidecar: its env resolved, its volumes as local folders, `python -m sidecar`.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jsonpatch

from gpuaccounting import names
from webhook.decisions.injection import TOKEN_FILE_NAME

DEMO_USER = "alice@example.com"


@dataclass(frozen=True)
class PodSpec:
    """A pod to create: which sharing system it uses and how it asks (requests, labels or annotations)."""

    namespace: str
    name: str
    system: str
    requests: dict[str, str]
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None

    def manifest(self) -> dict[str, Any]:
        container: dict[str, Any] = {"name": "main", "image": "ghcr.io/example/trainer:1.0"}
        if self.requests:
            container["resources"] = {"requests": dict(self.requests), "limits": dict(self.requests)}
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if self.labels:
            metadata["labels"] = dict(self.labels)
        if self.annotations:
            metadata["annotations"] = dict(self.annotations)
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": {"containers": [container]}}


@dataclass(frozen=True)
class Admitted:
    """A pod the webhooks let in, as it would be stored: patched by /mutate, with a uid."""

    spec: PodSpec
    pod: dict[str, Any]

    @property
    def annotations(self) -> dict[str, str]:
        return dict(self.pod["metadata"].get("annotations") or {})

    @property
    def share(self) -> str:
        return self.annotations.get(names.ANNOTATION_GPU_SHARE, "?")

    @property
    def priority_class(self) -> str:
        return str(self.pod["spec"].get("priorityClassName", "-"))

    @property
    def over_budget(self) -> bool:
        return self.priority_class == names.DEFAULT_OVER_BUDGET_PRIORITY_CLASS

    @property
    def decision(self) -> str:
        return self.annotations.get(names.ANNOTATION_PRIORITY_DECISION, "")


@dataclass(frozen=True)
class Denied:
    spec: PodSpec
    message: str


def review(pod: dict[str, Any]) -> dict[str, Any]:
    """An admission.k8s.io/v1 AdmissionReview for creating `pod`, as the API server sends it."""
    kind = {"group": "", "version": "v1", "kind": "Pod"}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": kind,
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": kind,
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": pod["metadata"]["name"],
            "namespace": pod["metadata"]["namespace"],
            "operation": "CREATE",
            "userInfo": {"username": DEMO_USER, "groups": ["system:authenticated"]},
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def _answer(webhook: httpx.Client, path: str, pod: dict[str, Any]) -> dict[str, Any]:
    response = webhook.post(path, json=review(pod))
    response.raise_for_status()
    return dict(response.json()["response"])


def admit(webhook: httpx.Client, spec: PodSpec) -> Admitted | Denied:
    """Mutate, apply the patch, validate the result: the two admission phases of a pod CREATE."""
    pod = spec.manifest()
    mutated = _answer(webhook, "/mutate", pod)
    if not mutated["allowed"]:
        return Denied(spec, mutated["status"]["message"])
    if mutated.get("patch"):
        operations = json.loads(base64.b64decode(mutated["patch"]))
        pod = jsonpatch.apply_patch(pod, operations)
    validated = _answer(webhook, "/validate", pod)
    if not validated["allowed"]:
        return Denied(spec, validated["status"]["message"])
    stored = copy.deepcopy(pod)
    stored["metadata"]["uid"] = str(uuid.uuid4())  # the API server gives it on storing
    return Admitted(spec, stored)


_VARIABLE_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _downward_file(values: dict[str, str]) -> str:
    """The downward API's format: `key="value"` a line, the value quoted."""
    return "".join(f"{key}={json.dumps(value)}\n" for key, value in sorted(values.items()))


def sidecar_command(
    admitted: Admitted, root: Path, reporter_token: str, base: dict[str, str]
) -> tuple[list[str], dict[str, str]]:
    """What a kubelet would start for the injected sidecar: `python -m sidecar` with `sidecar_env`."""
    return [sys.executable, "-m", "sidecar"], sidecar_env(admitted.pod, root, reporter_token, base)


def sidecar_env(
    pod: dict[str, Any], root: Path, reporter_token: str, base: dict[str, str] | None = None
) -> dict[str, str]:
    """The injected sidecar's env as a kubelet resolves it (downward-API fields, `$(NAME)` references),
    with every mounted volume a local folder under `root` (token, emptyDir buffer, pod info), on top of
    `base`. The demo has no GPUs, so the NVML backend is the sidecar's fake one; the token is the static
    reporter token where a cluster would project a ServiceAccount token. tests/e2e runs its sidecar from
    this too, so the two cannot resolve the webhook's container differently."""
    spec = pod["spec"]
    sidecar = next(
        c
        for c in (*spec.get("initContainers", []), *spec["containers"])
        if c["name"] == names.SIDECAR_CONTAINER_NAME
    )
    mounts = {mount["mountPath"]: root / mount["name"] for mount in sidecar.get("volumeMounts", [])}
    for folder in mounts.values():
        folder.mkdir(parents=True, exist_ok=True)
    (root / names.SIDECAR_TOKEN_VOLUME / TOKEN_FILE_NAME).write_text(reporter_token)
    podinfo = root / names.SIDECAR_PODINFO_VOLUME
    (podinfo / "annotations").write_text(_downward_file(pod["metadata"].get("annotations") or {}))
    (podinfo / "labels").write_text(_downward_file(pod["metadata"].get("labels") or {}))
    fields = {f"metadata.{key}": pod["metadata"][key] for key in ("namespace", "name", "uid")}
    fields["status.hostIP"] = "127.0.0.1"  # the one local "node"
    env = dict(base or {})
    for variable in sidecar.get("env", []):
        if "valueFrom" in variable:
            env[variable["name"]] = fields[variable["valueFrom"]["fieldRef"]["fieldPath"]]
            continue
        # The kubelet expands $(NAME) from the variables defined above this one.
        value = _VARIABLE_REFERENCE.sub(lambda m: env.get(m.group(1), m.group(0)), variable["value"])
        for mount_path, folder in mounts.items():
            if value == mount_path or value.startswith(mount_path.rstrip("/") + "/"):
                value = str(folder) + value[len(mount_path.rstrip("/")) :]
        env[variable["name"]] = value
    env.update({"SIDECAR_NVML_BACKEND": "fake", "SIDECAR_LOG_FORMAT": "text"})
    return env
