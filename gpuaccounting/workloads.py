"""Which workload a pod belongs to (what a gang scheduler places), from its gang markers and controlling
owner; a bare pod is its own. The markers are tenant input: always read within the pod's namespace."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

# Gang markers, most specific first: the group a gang scheduler places together, then the controllers that
# stamp their name on every pod they create (a JobSet's pods are owned by its Jobs, a LeaderWorkerSet's by
# its StatefulSets, so the owner alone would split them).
POD_GROUP_ANNOTATIONS: Final = (
    "scheduling.k8s.io/group-name",  # Volcano (KubeGroupNameAnnotationKey)
    "scheduling.volcano.sh/group-name",  # Volcano (VolcanoGroupNameAnnotationKey)
    "pod-group-name",  # KAI-Scheduler (PodGroupAnnotationForPod), set by its podgrouper
)
POD_GROUP_LABELS: Final = (
    "scheduling.x-k8s.io/pod-group",  # scheduler-plugins coscheduling
    "pod-group.scheduling.sigs.k8s.io",  # scheduler-plugins coscheduling, before v0.24
    "kueue.x-k8s.io/pod-group-name",  # Kueue's plain pod groups
)
JOBSET_LABEL: Final = "jobset.sigs.k8s.io/jobset-name"
LEADER_WORKER_SET_LABEL: Final = "leaderworkerset.sigs.k8s.io/name"

MARKERS: Final = (
    *(("annotation", key, "PodGroup") for key in POD_GROUP_ANNOTATIONS),
    *(("label", key, "PodGroup") for key in POD_GROUP_LABELS),
    ("label", JOBSET_LABEL, "JobSet"),
    ("label", LEADER_WORKER_SET_LABEL, "LeaderWorkerSet"),
)

MAX_NAME_LENGTH: Final = 253  # an object name's limit; a longer marker names no object and is ignored


@dataclass(frozen=True, slots=True)
class Workload:
    kind: str
    name: str
    via: str = field(default="", compare=False)  # the marker's key, or the owner's apiVersion

    @property
    def annotation(self) -> str:
        return f"{self.kind}/{self.name}"

    @property
    def is_bare_pod(self) -> bool:
        return self.kind == "Pod"


def _name(value: Any) -> str | None:
    return value if isinstance(value, str) and 0 < len(value) <= MAX_NAME_LENGTH else None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _controller(metadata: Mapping[str, Any]) -> Workload | None:
    """The owner reference marked `controller: true` (at most one is allowed): a Job, a ReplicaSet..."""
    owners = metadata.get("ownerReferences")
    for owner in owners if isinstance(owners, list) else ():
        owner = _mapping(owner)
        kind, name = _name(owner.get("kind")), _name(owner.get("name"))
        if owner.get("controller") is True and kind and name:
            api_version = owner.get("apiVersion")
            return Workload(kind, name, api_version if isinstance(api_version, str) else "")
    return None


def workload_of(pod: Mapping[str, Any], pod_name: str | None = None) -> Workload:
    """The pod's workload; `pod_name` is the name the API server gave a pod created with generateName."""
    metadata = _mapping(pod.get("metadata"))
    annotations, labels = _mapping(metadata.get("annotations")), _mapping(metadata.get("labels"))
    for source, key, kind in MARKERS:
        name = _name((annotations if source == "annotation" else labels).get(key))
        if name:
            return Workload(kind, name, key)
    owner = _controller(metadata)
    if owner is not None:
        return owner
    return Workload("Pod", _name(metadata.get("name")) or _name(pod_name) or "")
