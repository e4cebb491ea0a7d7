"""The workloads of the GPU pods the reconciler evicts: a workload's pods go together or not at all."""

from __future__ import annotations

from gpuaccounting import names
from gpuaccounting.workloads import workload_of
from timekeeper.kube import PodInfo


def workload_key(pod: PodInfo) -> tuple[str, str]:
    """The pod's namespace and workload: the webhook's protected annotation, else the pod's own markers
    (a pod admitted before the webhook named workloads). A bare pod is keyed by its uid."""
    named = pod.annotations.get(names.ANNOTATION_WORKLOAD) or workload_of(pod.raw, pod.name).annotation
    if named.startswith("Pod/"):
        return pod.namespace, f"Pod/{pod.uid}"
    return pod.namespace, named
