"""Fractional-request governance, run by `/validate` on the final object: the rules that need the namespace's
cap or the object's previous version (`gpuaccounting.shares` has the rest). A pod's own requests are judged
on CREATE only, so a later rule change never blocks a metadata update of a running pod."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from fractions import Fraction
from typing import Any

from gpuaccounting import names
from gpuaccounting.catalogue import GpuCatalogue
from gpuaccounting.quantity import shorten
from gpuaccounting.shares import GpuHardware, PodShare, Rule, Violation, format_share, share_inputs
from gpuaccounting.supply import NODE_SETTINGS, RouteUse, refused_uses
from gpuaccounting.workloads import workload_of
from webhook.decisions.injection import SidecarTemplate, claim_list, differing_fields
from webhook.reviews.review import AdmissionRequest
from webhook.settings import WebhookSettings
from webhook.watches.budgetcache import NamespaceView


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _containers(spec: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for container in _list(spec.get(key)):
            if isinstance(container, dict):
                yield key, container


def _spec(pod: Mapping[str, Any] | None) -> Mapping[str, Any]:
    spec = pod.get("spec") if pod else None
    return spec if isinstance(spec, dict) else {}


def _ours(pod: Mapping[str, Any] | None, field: str = "annotations") -> dict[str, Any]:
    """Our annotations (or labels) on the pod: those under our prefix."""
    metadata = pod.get("metadata") if pod else None
    annotations = metadata.get(field) if isinstance(metadata, dict) else None
    if not isinstance(annotations, dict):
        return {}
    return {key: value for key, value in annotations.items() if key.startswith(names.ANNOTATION_PREFIX)}


def _sidecar(spec: Mapping[str, Any]) -> Mapping[str, Any] | None:
    return next((c for _, c in _containers(spec) if c.get("name") == names.SIDECAR_CONTAINER_NAME), None)


def _requests_our_token(volume: Mapping[str, Any]) -> bool:
    projected = volume.get("projected")
    sources = _list(projected.get("sources")) if isinstance(projected, dict) else []
    return any(
        isinstance(source, dict)
        and isinstance(source.get("serviceAccountToken"), dict)
        and source["serviceAccountToken"].get("audience") == names.TOKEN_AUDIENCE
        for source in sources
    )


# The sidecar's token, and its buffer of reports not yet sent (what it sends with that token).
_SIDECAR_ONLY_VOLUMES = frozenset({names.SIDECAR_TOKEN_VOLUME, names.SIDECAR_BUFFER_VOLUME})


def token_mounts(pod: Mapping[str, Any]) -> list[Violation]:
    """Only our sidecar may hold a token for the timekeeper, or write what it reports with it: either
    lets its holder report as this pod."""
    found = []
    spec = _spec(pod)
    for key, container in _containers(spec):
        if key != "ephemeralContainers" and container.get("name") == names.SIDECAR_CONTAINER_NAME:
            continue
        if (
            key == "ephemeralContainers"
            and container.get("targetContainerName") == names.SIDECAR_CONTAINER_NAME
        ):
            found.append(
                Violation(
                    Rule.TOKEN_VOLUME_MOUNT,
                    "a debug container in the gpu-timekeeper-sidecar's process namespace reads its token"
                    " through /proc/<pid>/root; target another container",
                    str(container.get("name")),
                    "targetContainerName",
                    names.SIDECAR_CONTAINER_NAME,
                )
            )
        for mount in _list(container.get("volumeMounts")):
            if isinstance(mount, dict) and mount.get("name") in _SIDECAR_ONLY_VOLUMES:
                found.append(
                    Violation(
                        Rule.TOKEN_VOLUME_MOUNT,
                        "only the injected gpu-timekeeper-sidecar may mount this volume",
                        str(container.get("name")),
                        "volumeMount",
                        str(mount.get("name")),
                    )
                )
    if spec.get("shareProcessNamespace") is True and _sidecar(spec) is not None:
        found.append(
            Violation(
                Rule.TOKEN_VOLUME_MOUNT,
                "one process namespace for all containers lets any of them read the sidecar's token"
                " through /proc/<pid>/root; a pod with the gpu-timekeeper-sidecar may not share it",
                resource="shareProcessNamespace",
                value="true",
            )
        )
    for volume in _list(spec.get("volumes")):
        if (
            isinstance(volume, dict)
            and volume.get("name") != names.SIDECAR_TOKEN_VOLUME
            and _requests_our_token(volume)
        ):
            found.append(
                Violation(
                    Rule.TOKEN_VOLUME_MOUNT,
                    f"only the injected {names.SIDECAR_TOKEN_VOLUME} volume may request a token"
                    f" for audience {names.TOKEN_AUDIENCE}",
                    resource="volume",
                    value=str(volume.get("name")),
                )
            )
    return found


# The subresources whose CONNECT opens a session in one container the options name (`kubectl exec`, `kubectl
# cp`, which runs tar through exec, and `kubectl attach`).
SESSION_SUBRESOURCES = frozenset({"exec", "attach"})


def sidecar_session(request: AdmissionRequest) -> list[Violation]:
    """A session in our sidecar hands its holder the sidecar's token (`cat` the file) and with it the pod's
    reports. The options name the container; one left out is resolved by the API server to the pod's only
    app container, never ours (an init container when native, else one of at least two)."""
    if request.operation != "CONNECT" or request.subresource not in SESSION_SUBRESOURCES:
        return []
    options = request.object or {}
    if options.get("container") != names.SIDECAR_CONTAINER_NAME:
        return []
    return [
        Violation(
            Rule.TOKEN_VOLUME_MOUNT,
            f"`kubectl {request.subresource}` into the injected container would hand over the token it"
            " reports with; open a session in one of the pod's own containers",
            names.SIDECAR_CONTAINER_NAME,
        )
    ]


def capped_grace(spec: Mapping[str, Any], settings: WebhookSettings) -> int | None:
    """The cap, where a GPU pod at the reduced class has a longer terminationGracePeriodSeconds (None:
    within it, or another class). Preemption waits out its victim's grace: the reduced class must free
    the GPU within a bounded time, or it would mean nothing to the in-budget team waiting for it."""
    if spec.get("priorityClassName") != settings.over_budget_priority_class:
        return None
    own = spec.get("terminationGracePeriodSeconds", names.DEFAULT_TERMINATION_GRACE_SECONDS)
    cap = settings.over_budget_max_grace_seconds
    if isinstance(own, int) and not isinstance(own, bool) and own <= cap:
        return None
    return cap


def reduced_grace(pod: Mapping[str, Any], settings: WebhookSettings) -> list[Violation]:
    """A later mutation (another webhook's, after ours) may not lengthen a reduced pod's grace again."""
    spec = _spec(pod)
    cap = capped_grace(spec, settings)
    if cap is None:
        return []
    return [
        Violation(
            Rule.REDUCED_GRACE,
            f"a GPU pod at PriorityClass {settings.over_budget_priority_class} frees its GPU within {cap} s"
            f" of its preemption (WEBHOOK_OVER_BUDGET_MAX_GRACE_SECONDS); set at most {cap}",
            resource="terminationGracePeriodSeconds",
            value=shorten(repr(spec.get("terminationGracePeriodSeconds"))),
        )
    ]


def _sidecar_problems(
    sidecar: Mapping[str, Any], share: PodShare, volumes: list[Any], template: SidecarTemplate
) -> list[str]:
    """How the pod's sidecar and its volumes differ from the ones built from settings for its share."""
    if not share.uses_gpu:
        return ["this pod requests no GPU"]
    share_text = format_share(share.share)
    if template.is_ours(sidecar, share_text, share.claims):
        return template.volume_problems(volumes)
    built = template.container_form(share_text, share.claims)  # in stored form
    problems = []
    if sidecar.get("image") != built["image"]:
        problems.append(f"image {sidecar.get('image')} is not {built['image']}")
    resources = sidecar.get("resources")
    if (resources.get("claims", []) if isinstance(resources, dict) else []) != claim_list(share.claims):
        problems.append("its resources.claims are not the pod's GPU claims")
    fields = [field for field in differing_fields(sidecar, built) if field != "image"]
    if fields:
        problems.append(f"its {', '.join(fields)} differ from the sidecar gpu-timekeeper builds")
    return problems + template.volume_problems(volumes)


def on_create(
    pod: Mapping[str, Any], share: PodShare, view: NamespaceView, template: SidecarTemplate
) -> list[Violation]:
    found = list(share.violations)
    cap = view.admission["max_gpu_share_per_pod"] if view.admission is not None else None
    if cap is not None and share.share > Fraction(str(cap)):
        found.append(
            Violation(
                Rule.NAMESPACE_CAP,
                f"the pod's GPU share {format_share(share.share)} is above"
                f" this namespace's per-pod cap of {cap}",
            )
        )
    annotations = _ours(pod)
    expected = {
        names.ANNOTATION_GPU_SHARE: format_share(share.share) if share.uses_gpu else None,
        names.ANNOTATION_SHARING_SYSTEM: share.system.value if share.system else None,
        names.ANNOTATION_WORKLOAD: workload_of(pod).annotation if share.uses_gpu else None,
    }
    if share.uses_gpu and str(annotations.get(names.ANNOTATION_WORKLOAD, "")).startswith("Pod/"):
        # A bare pod's name may be generated after the mutation named it; a bare pod shares no class.
        expected.pop(names.ANNOTATION_WORKLOAD)
    for key, value in expected.items():
        if key in annotations and annotations[key] != value:
            found.append(
                Violation(
                    Rule.PROTECTED_ANNOTATIONS,
                    "is written by gpu-timekeeper from the pod's requests and may not be set by users"
                    + (f" (the requests give {value})" if value else " (this pod requests no GPU)"),
                    resource=f"annotation {key}",
                    value=str(annotations[key]),
                )
            )
    sidecar = _sidecar(_spec(pod))
    if sidecar is None and share.uses_gpu:
        found.append(
            Violation(
                Rule.SIDECAR_REQUIRED,
                "this GPU pod has no gpu-timekeeper-sidecar: the mutating webhook did not run for it"
                " (its use could not be accounted); create the pod again",
            )
        )
    if sidecar is not None:
        problems = _sidecar_problems(sidecar, share, _list(_spec(pod).get("volumes")), template)
        if problems:
            found.append(
                Violation(
                    Rule.PROTECTED_SIDECAR,
                    "is injected by gpu-timekeeper and may not be supplied or altered: "
                    + "; ".join(problems),
                    names.SIDECAR_CONTAINER_NAME,
                )
            )
    found.extend(token_mounts(pod))
    return found


def _share_inputs_changed(
    old: Mapping[str, Any], new: Mapping[str, Any], catalogue: GpuCatalogue
) -> list[Violation]:
    """What a pod's share was computed from is fixed once it is admitted: a change (a KAI or ClearML
    marker dropped, say) would make it another pod, or none, to the timekeeper after a relist."""
    before, after = share_inputs(old, catalogue), share_inputs(new, catalogue)
    return [
        Violation(
            Rule.PROTECTED_SHARE_INPUTS,
            "decides the pod's GPU share and may not change after the pod is created"
            f" (was {shorten(repr(before.get(key)))})",
            resource=key,
            value=shorten(repr(after.get(key))),
        )
        for key in sorted(before.keys() | after.keys())
        if before.get(key) != after.get(key)
    ]


def on_update(
    request: AdmissionRequest, settings: WebhookSettings, catalogue: GpuCatalogue
) -> list[Violation]:
    """What an update may not change: what the share is computed from (for anyone), our annotations and
    our sidecar (but by the privileged users). Without the old object (the API server always sends it; a
    broken client may not) there is no change to judge."""
    found = token_mounts(request.object or {})
    if request.old_object is None:
        return found
    found.extend(_share_inputs_changed(request.old_object, request.object or {}, catalogue))
    if request.username in settings.privileged_usernames:
        return found
    # Our labels too: the pod watch that counts a workload's pods selects them by our label, so a pod
    # relabelled would stop counting while it runs (issue 37).
    for field, what in (("annotations", "annotation"), ("labels", "label")):
        old, new = _ours(request.old_object, field), _ours(request.object, field)
        for key in sorted(old.keys() | new.keys()):
            if old.get(key) != new.get(key):
                found.append(
                    Violation(
                        Rule.PROTECTED_ANNOTATIONS,
                        f"is written by gpu-timekeeper and may not be changed (was {old.get(key)!r})",
                        resource=f"{what} {key}",
                        value=repr(new.get(key)),
                    )
                )
    old_spec, new_spec = _spec(request.old_object), _spec(request.object)
    if _sidecar(old_spec) != _sidecar(new_spec):
        found.append(
            Violation(
                Rule.PROTECTED_SIDECAR,
                "is injected by gpu-timekeeper and may not be added, removed or changed",
                names.SIDECAR_CONTAINER_NAME,
            )
        )
    return found


def _supply_violation(use: RouteUse) -> Violation:
    return Violation(
        Rule.GPU_SUPPLY,
        f"hands the container GPUs beside the device plugin, uncharged (route {use.route}, open where"
        f" {NODE_SETTINGS[use.route]}); ask for the GPU as a resource such as nvidia.com/gpu, or an admin"
        " allows the route (hardware file: gpu_supply_routes, gpu_supply_exempt)",
        use.container,
        use.field,
        use.value,
    )


def supply_routes(
    pod: Mapping[str, Any], namespace: str, share: PodShare, hardware: GpuHardware
) -> list[Violation]:
    """A new pod's uses of a GPU route the hardware file's policy refuses (docs/security.md, "The GPU
    supply on a node")."""
    uses = refused_uses(pod, namespace, hardware.supply, asks_for_gpu=share.uses_gpu)
    return [_supply_violation(use) for use in uses]


def supply_routes_added(
    request: AdmissionRequest, namespace: str, share: PodShare, hardware: GpuHardware
) -> list[Violation]:
    """An UPDATE (an annotation, an ephemeral container) may not add a route the policy refuses; a pod
    admitted with one before the policy keeps it, so its metadata can still change."""
    if request.old_object is None:
        return supply_routes(request.object or {}, namespace, share, hardware)
    before = set(refused_uses(request.old_object, namespace, hardware.supply, asks_for_gpu=share.uses_gpu))
    after = refused_uses(request.object or {}, namespace, hardware.supply, asks_for_gpu=share.uses_gpu)
    return [_supply_violation(use) for use in after if use not in before]
