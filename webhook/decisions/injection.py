"""The sidecar injected into every GPU pod: a native sidecar first among the init containers (a plain
container with `sidecar_mode=container`). It and its volumes are ours, whole: a pod's own under their names
are replaced, and `/validate` compares stored forms (`stored_form`), so re-invocation patches nothing."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

from gpuaccounting import names
from gpuaccounting.podgpus import NODEAGENT_AUDIENCE, NODEAGENT_PORT
from gpuaccounting.quantity import QuantityError, parse_quantity
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
            # A fleet's member (docs/fleet.md): the sidecar names our cluster to the hub, so no pod needs
            # configuring. Left out otherwise: a single cluster's sidecar is built as it always was.
            *([{"name": "SIDECAR_CLUSTER", "value": settings.cluster}] if settings.cluster else []),
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
        # What we build, in stored form, once (per share for the container: pods repeat a few shares).
        self._volume_forms = {volume["name"]: stored_form(volume) for volume in self.volumes}
        self.container_form = lru_cache(maxsize=1024)(self._container_form)
        self._matched: dict[str, object] = {}

    def _container_form(self, share: str, claims: tuple[str, ...] = ()) -> dict[str, Any]:
        form = stored_form(self.container(share, claims))
        return form if isinstance(form, dict) else {}

    def is_ours(self, given: object, share: str, claims: tuple[str, ...] = ()) -> bool:
        """Whether `given` is the sidecar we build for `share` and the pod's GPU `claims`, in stored form."""
        return self._matches(given, self.container_form(share, claims), f"container {share} {claims}")

    def _matches(self, given: object, form: object, key: str) -> bool:
        """`stored_form(given) == form`, remembering the last object that matched under `key`: every pod
        one API server stores repeats it, so the usual answer is one comparison."""
        if given == self._matched.get(key):
            return True
        if stored_form(given) != form:
            return False
        if len(self._matched) >= _REMEMBERED:
            self._matched.clear()
        self._matched[key] = copy.deepcopy(given)
        return True

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
        """Put the sidecar and its volumes into a (copied) pod spec; what the pod brought under our names is
        replaced unless it already is ours (a re-invocation's, the API server's defaults filled in)."""
        built = self.container(share, claims)
        key = "initContainers" if self.native else "containers"
        found = [
            (k, i)
            for k in ("initContainers", "containers")
            for i, container in enumerate(_list(spec.get(k)))
            if _is_sidecar(container)
        ]
        if len(found) == 1 and found[0][0] == key:  # in its list: rebuilt where it is, when it must be
            index = found[0][1]
            if not self.is_ours(spec[key][index], share, claims):
                spec[key] = [*spec[key][:index], built, *spec[key][index + 1 :]]
        else:
            for listed_key in ("initContainers", "containers"):
                if listed_key in spec:
                    spec[listed_key] = [c for c in _list(spec[listed_key]) if not _is_sidecar(c)]
            listed = _list(spec.get(key))
            spec[key] = [built, *listed] if self.native else [*listed, built]
        volumes = _list(spec.get("volumes"))
        if self.volume_problems(volumes):
            others = [v for v in volumes if not (isinstance(v, dict) and v.get("name") in self.volume_names)]
            spec["volumes"] = [*others, *self.volumes]

    def volume_problems(self, volumes: Iterable[object]) -> list[str]:
        """How the pod's volumes under our names differ from ours (missing, altered, given twice)."""
        listed = [v for v in volumes if isinstance(v, dict) and v.get("name") in self.volume_names]
        problems = []
        for volume in self.volumes:
            given = [v for v in listed if v.get("name") == volume["name"]]
            name = volume["name"]
            if len(given) != 1 or not self._matches(given[0], self._volume_forms[name], f"volume {name}"):
                problems.append(f"volume {volume['name']} is not the one gpu-timekeeper injects")
        return problems


def differing_fields(given: Mapping[str, Any], ours: Mapping[str, Any]) -> list[str]:
    """The top-level fields in which a container differs from ours (`ours` in stored form already)."""
    theirs = stored_form(dict(given))
    if not isinstance(theirs, dict):
        return []
    return sorted(key for key in ours.keys() | theirs.keys() if ours.get(key) != theirs.get(key))


# Fields the API server fills in at these values when it stores a pod (v1 defaulting): a field left out
# and a field at its default are the same. tests/webhook/fixtures has a pod as kube-apiserver stored it.
_DEFAULTED: frozenset[tuple[str, object]] = frozenset(
    {
        ("terminationMessagePath", "/dev/termination-log"),
        ("terminationMessagePolicy", "File"),
        ("defaultMode", 420),
    }
)
_QUANTITY_MAPS = frozenset({"requests", "limits"})
_REMEMBERED = 1024  # matched objects kept, one per share and volume
_DEEPEST = 16


def stored_form(value: object, key: str = "", depth: int = 0) -> object:
    """`value` with the API server's defaults left out and its quantities read as numbers ("1024Mi" is
    stored as "1Gi"), so that what we built and what the API server stored compare equal."""
    if depth > _DEEPEST:  # deeper than anything we build: left as it is, and unequal to ours
        return value
    if isinstance(value, list):
        if key == "resizePolicy" and all(
            isinstance(item, dict) and item.get("restartPolicy") == "NotRequired" for item in value
        ):
            return None
        return [stored_form(item, depth=depth + 1) for item in value]
    if not isinstance(value, dict):
        return _quantity(value) if key == "sizeLimit" else value
    if key in _QUANTITY_MAPS:
        return {name: _quantity(amount) for name, amount in value.items()}
    fieldref = "fieldPath" in value
    form = {}
    for name, item in value.items():
        if isinstance(item, str | int) and (name, item) in _DEFAULTED:
            continue
        if fieldref and name == "apiVersion" and item == "v1":
            continue
        normal = stored_form(item, name, depth + 1)
        if name != "resizePolicy" or normal is not None:
            form[name] = normal
    return form


def _quantity(value: object) -> object:
    try:
        return parse_quantity(value)
    except QuantityError:
        return value


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _is_sidecar(container: object) -> bool:
    return isinstance(container, dict) and container.get("name") == names.SIDECAR_CONTAINER_NAME


def claim_list(claims: tuple[str, ...]) -> list[dict[str, str]]:
    """A container's `resources.claims` naming each of the pod's claims."""
    return [{"name": claim} for claim in claims]
