"""The timekeeper's boundary over the Kubernetes API: nothing else in the timekeeper imports
`kubernetes_asyncio`."""

from timekeeper.kube.client import KubeClient, KubeConfig
from timekeeper.kube.types import (
    EvictionResult,
    KubeApiError,
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
    "EvictionResult",
    "KubeApiError",
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
