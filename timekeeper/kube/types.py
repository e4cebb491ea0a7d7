"""Typed results of the Kubernetes boundary: what the rest of the timekeeper sees instead of client models."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

JSON = dict[str, Any]

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "gpu-timekeeper"

POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"


class KubeError(Exception):
    """The Kubernetes API failed or answered something the timekeeper cannot act on."""


class KubeApiError(KubeError):
    """The API server refused the request (a 4xx); `status` says how (404, 409, 429 mean something)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"kubernetes API error {status}: {reason}")
        self.status = status


class KubeUnavailableError(KubeError):
    """The Kubernetes API could not be reached or answered a server error: worth retrying later."""


@dataclass(frozen=True, slots=True)
class TokenReviewResult:
    """What a TokenReview said about a token."""

    authenticated: bool
    username: str = ""
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    audiences: tuple[str, ...] = ()
    error: str = ""

    def extra_value(self, key: str) -> str | None:
        """The single value of an extra, or None when it is absent or ambiguous."""
        values = self.extra.get(key, ())
        return values[0] if len(values) == 1 else None


class EvictionResult(StrEnum):
    EVICTED = "evicted"
    BLOCKED_BY_PDB = "blocked_by_pdb"  # 429: a PodDisruptionBudget allows no disruption now; retry later
    GONE = "gone"  # the pod no longer exists


class QuotaChange(StrEnum):
    CREATED = "created"
    UPDATED = "updated"  # it existed and differed (drift, or a new limit) and was corrected
    UNCHANGED = "unchanged"
    DELETED = "deleted"
    ABSENT = "absent"


@dataclass(frozen=True, slots=True)
class PodInfo:
    """A pod as the timekeeper needs it; `raw` keeps the API's JSON for the share computation."""

    namespace: str
    name: str
    uid: str
    phase: str
    resource_version: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    node_name: str | None
    created_at: datetime | None
    started_at: datetime | None
    # The latest finishedAt of the app containers once the pod has ended (Succeeded / Failed).
    finished_at: datetime | None
    deleting_since: datetime | None
    raw: JSON

    @property
    def ended(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


@dataclass(frozen=True, slots=True)
class PodSnapshot:
    """The complete set of pods as of a (re-)list; anything not in it is gone."""

    pods: tuple[PodInfo, ...]
    resource_version: str


@dataclass(frozen=True, slots=True)
class PodEvent:
    type: Literal["ADDED", "MODIFIED", "DELETED"]
    pod: PodInfo


@dataclass(frozen=True, slots=True)
class ObjectReference:
    """The object an Event is about."""

    kind: str
    name: str
    namespace: str | None = None
    api_version: str = "v1"
    uid: str | None = None


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def pod_info(raw: JSON) -> PodInfo:
    """The typed view of a pod's JSON."""
    meta, spec, status = raw["metadata"], raw.get("spec") or {}, raw.get("status") or {}
    finished = [
        _parse_time(((cs.get("state") or {}).get("terminated") or {}).get("finishedAt"))
        for cs in status.get("containerStatuses") or []
    ]
    phase = status.get("phase") or "Pending"
    known_finishes = [f for f in finished if f is not None]
    return PodInfo(
        namespace=meta["namespace"],
        name=meta["name"],
        uid=meta["uid"],
        phase=phase,
        resource_version=meta.get("resourceVersion", ""),
        labels=meta.get("labels") or {},
        annotations=meta.get("annotations") or {},
        node_name=spec.get("nodeName"),
        created_at=_parse_time(meta.get("creationTimestamp")),
        started_at=_parse_time(status.get("startTime")),
        finished_at=max(known_finishes) if phase in ("Succeeded", "Failed") and known_finishes else None,
        deleting_since=_parse_time(meta.get("deletionTimestamp")),
        raw=raw,
    )
