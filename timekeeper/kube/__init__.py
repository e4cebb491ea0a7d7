"""The timekeeper's boundary over the Kubernetes API: nothing else in the timekeeper imports `kubernetes`."""

from timekeeper.kube.client import Backoff, KubeClient, KubeConfig
from timekeeper.kube.types import (
    EvictionResult,
    KubeError,
    KubeUnavailableError,
    ObjectReference,
    PodEvent,
    PodInfo,
    PodSnapshot,
    QuotaChange,
    TokenReviewResult,
)

__all__ = [
    "Backoff",
    "EvictionResult",
    "KubeClient",
    "KubeConfig",
    "KubeError",
    "KubeUnavailableError",
    "ObjectReference",
    "PodEvent",
    "PodInfo",
    "PodSnapshot",
    "QuotaChange",
    "TokenReviewResult",
]
