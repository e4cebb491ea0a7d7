"""The sidecar the webhook injects into every GPU pod: container, volumes, and the env contract.

A native sidecar (an init container with `restartPolicy: Always`, Kubernetes 1.29+) is placed first among
the init containers, so it runs beside every later init container and Jobs still complete; on older
clusters (`sidecar_mode=container`) it is a plain container. Injection is idempotent: a pod that already
has the sidecar or our volumes keeps them as they are (the API server may have defaulted their fields).
"""

from __future__ import annotations

from typing import Any

from gpuaccounting import names
from gpuaccounting.podgpus import NODEAGENT_AUDIENCE, NODEAGENT_PORT
from webhook.settings import WebhookSettings

TOKEN_FILE_NAME = "token"
# The pod's token for the node agent of its node (docs/nodeagent.md): another audience than the
# timekeeper's, so the agent can never present it as a report.
NODEAGENT_TOKEN_FILE_NAME = "nodeagent-token"


def _field_env(name: str, field_path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}


class SidecarTemplate:
    """Builds the sidecar container and its volumes from settings (all but the share precomputed)."""

    def __init__(self, settings: WebhookSettings) -> None:
        self.settings = settings
        self.native = settings.sidecar_mode == "native"
        self.token_file = f"{settings.sidecar_token_dir.rstrip('/')}/{TOKEN_FILE_NAME}"
        self._env_tail = [
            {
                "name": "SIDECAR_TIMEKEEPER_URL",
                "value": settings.sidecar_timekeeper_url or settings.timekeeper_url,
            },
            {"name": "SIDECAR_TOKEN_FILE", "value": self.token_file},
            {
                "name": "SIDECAR_REPORT_INTERVAL_SECONDS",
                "value": str(settings.sidecar_report_interval_seconds),
            },
            {"name": "SIDECAR_BUFFER_DIR", "value": settings.sidecar_buffer_dir},
            {"name": "SIDECAR_PODINFO_DIR", "value": settings.sidecar_podinfo_dir},
            {"name": "SIDECAR_NVML_BACKEND", "value": "pynvml"},
            # The node agent on this pod's node, asked first; the sidecar falls back to its own NVML
            # where no agent answers. $(HOST_IP) is expanded by the kubelet from the variable above it.
            _field_env("HOST_IP", "status.hostIP"),
            {"name": "SIDECAR_NODEAGENT_URL", "value": f"http://$(HOST_IP):{NODEAGENT_PORT}"},
            {
                "name": "SIDECAR_NODEAGENT_TOKEN_FILE",
                "value": f"{settings.sidecar_token_dir.rstrip('/')}/{NODEAGENT_TOKEN_FILE_NAME}",
            },
        ]
        self.volumes = [
            {
                "name": names.SIDECAR_TOKEN_VOLUME,
                "projected": {
                    "sources": [
                        {
                            "serviceAccountToken": {
                                "audience": names.TOKEN_AUDIENCE,
                                "expirationSeconds": settings.sidecar_token_expiration_seconds,
                                "path": TOKEN_FILE_NAME,
                            }
                        },
                        {
                            "serviceAccountToken": {
                                "audience": NODEAGENT_AUDIENCE,
                                "expirationSeconds": settings.sidecar_token_expiration_seconds,
                                "path": NODEAGENT_TOKEN_FILE_NAME,
                            }
                        },
                    ]
                },
            },
            {
                "name": names.SIDECAR_BUFFER_VOLUME,
                "emptyDir": {"sizeLimit": settings.sidecar_buffer_size_limit},
            },
            {
                "name": names.SIDECAR_PODINFO_VOLUME,
                "downwardAPI": {
                    "items": [
                        {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}},
                        {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                    ]
                },
            },
        ]
        self.volume_names = frozenset(volume["name"] for volume in self.volumes)

    def container(self, share: str, claims: tuple[str, ...] = ()) -> dict[str, Any]:
        s = self.settings
        built: dict[str, Any] = {
            "name": names.SIDECAR_CONTAINER_NAME,
            "image": s.sidecar_image,
            "imagePullPolicy": s.sidecar_image_pull_policy,
            "env": [
                _field_env("POD_NAMESPACE", "metadata.namespace"),
                _field_env("POD_NAME", "metadata.name"),
                _field_env("POD_UID", "metadata.uid"),
                {"name": "SIDECAR_GPU_SHARE", "value": share},
                *self._env_tail,
            ],
            "resources": {
                "requests": {"cpu": s.sidecar_cpu_request, "memory": s.sidecar_memory_request},
                "limits": {"memory": s.sidecar_memory_limit},
            },
            "volumeMounts": [
                {"name": names.SIDECAR_TOKEN_VOLUME, "mountPath": s.sidecar_token_dir, "readOnly": True},
                {"name": names.SIDECAR_BUFFER_VOLUME, "mountPath": s.sidecar_buffer_dir},
                {"name": names.SIDECAR_PODINFO_VOLUME, "mountPath": s.sidecar_podinfo_dir, "readOnly": True},
            ],
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"]},
            },
        }
        if claims:  # the pod's GPU claims, so the sidecar's container sees their devices
            built["resources"]["claims"] = claim_list(claims)
        if self.native:
            built["restartPolicy"] = "Always"
        return built

    def inject(self, spec: dict[str, Any], share: str, claims: tuple[str, ...] = ()) -> None:
        """Add the sidecar and its volumes to a (copied) pod spec unless they are there already.

        A sidecar already present keeps every field but its share and claims: when a later mutator changed
        the pod's requests, the re-invocation brings SIDECAR_GPU_SHARE and the claims in line with them.
        """
        found = _find_sidecar(spec)
        if found is None:
            if self.native:
                spec["initContainers"] = [self.container(share, claims), *(spec.get("initContainers") or [])]
            else:
                spec["containers"] = [*(spec.get("containers") or []), self.container(share, claims)]
        else:
            key, index = found
            listed = spec[key]
            updated = _with_claims(_with_share(listed[index], share), claims)
            if updated is not listed[index]:
                spec[key] = [*listed[:index], updated, *listed[index + 1 :]]
        volumes = spec.get("volumes") or []
        have = {volume.get("name") for volume in volumes}
        missing = [volume for volume in self.volumes if volume["name"] not in have]
        if missing:
            spec["volumes"] = [*volumes, *missing]


def _find_sidecar(spec: dict[str, Any]) -> tuple[str, int] | None:
    for key in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(key) or ()):
            if container.get("name") == names.SIDECAR_CONTAINER_NAME:
                return key, index
    return None


def _with_share(container: dict[str, Any], share: str) -> dict[str, Any]:
    """The container with SIDECAR_GPU_SHARE set to `share`; the same object when it already is."""
    listed = container.get("env")
    env: list[Any] = listed if isinstance(listed, list) else []
    wanted = {"name": "SIDECAR_GPU_SHARE", "value": share}
    if wanted in env:
        return container
    kept = [item for item in env if not (isinstance(item, dict) and item.get("name") == "SIDECAR_GPU_SHARE")]
    return {**container, "env": [*kept, wanted]}


def claim_list(claims: tuple[str, ...]) -> list[dict[str, str]]:
    """A container's `resources.claims` naming each of the pod's claims."""
    return [{"name": claim} for claim in claims]


def _with_claims(container: dict[str, Any], claims: tuple[str, ...]) -> dict[str, Any]:
    """The container with `resources.claims` naming `claims` (none: no key); the same object if it does."""
    resources = container.get("resources")
    resources = resources if isinstance(resources, dict) else {}
    if resources.get("claims", []) == claim_list(claims):
        return container
    updated = {key: value for key, value in resources.items() if key != "claims"}
    if claims:
        updated["claims"] = claim_list(claims)
    return {**container, "resources": updated}
