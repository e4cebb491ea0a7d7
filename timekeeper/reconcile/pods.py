"""What the timekeeper knows of every GPU pod, kept current by the pod watch and read by the reconcile
pass (both on the event loop: no locks)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal

from gpuaccounting.dra import claim_refs
from gpuaccounting.names import SIDECAR_CONTAINER_NAME
from gpuaccounting.shares import GpuHardware
from timekeeper.clock import Clock
from timekeeper.kube import PodEvent, PodInfo, PodSnapshot
from timekeeper.usage.admitted import admitted_share


@dataclass(frozen=True, slots=True)
class TrackedPod:
    info: PodInfo
    # The share it was admitted at outside DRA claims (usage/admitted.py): what its silent time is charged
    # at; 0 for a pod whose GPUs all come from claims (their claims' charge, reconcile/claims.py).
    share: Decimal
    sidecar: bool = False  # the webhook injected our sidecar: reports are expected from it
    # When it stopped holding its GPUs: its containers' real finishedAt, else when it was seen gone.
    ended_at: datetime | None = None
    closed: bool = False  # its final charge is done

    @property
    def running(self) -> bool:
        return self.ended_at is None and self.info.phase == "Running" and self.info.started_at is not None


def has_sidecar(pod: PodInfo) -> bool:
    """Whether the pod carries our sidecar (a native sidecar among the init containers, or a plain
    container on older clusters). A pod without one (admitted while the webhook was down, or in a
    namespace it skips) never reports, so its silence says nothing about a sidecar."""
    spec = pod.raw.get("spec") or {}
    containers = [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]
    return any(container.get("name") == SIDECAR_CONTAINER_NAME for container in containers)


class PodRegistry:
    """GPU pods, and pods using DRA claims (their claims' consumers), by uid. A pod stays until its final
    charge is done and it is gone from the API."""

    def __init__(self, clock: Clock, hardware: GpuHardware | None = None) -> None:
        self._clock = clock
        self._hardware = hardware or GpuHardware()
        self._pods: dict[str, TrackedPod] = {}
        self._present: set[str] = set()  # uids the API still has
        self.synced = asyncio.Event()

    def reset(self) -> None:
        """Forget every pod: a new leadership's watch lists them again. The same `synced` event, cleared,
        so a pass already waiting for a list is woken by the new watch's (a fresh registry would leave
        it waiting on the old one's event, which nothing sets any more)."""
        self._pods.clear()
        self._present.clear()
        self.synced.clear()

    def apply(self, item: PodSnapshot | PodEvent) -> None:
        if isinstance(item, PodSnapshot):
            seen = set()
            for pod in item.pods:
                seen.add(pod.uid)
                self._upsert(pod)
            for uid in self._present - seen:
                self._gone(uid)
            self._present = seen & set(self._pods)
            self.synced.set()
        elif item.type == "DELETED":
            self._upsert(item.pod)
            self._gone(item.pod.uid)
        else:
            self._upsert(item.pod)

    def _upsert(self, pod: PodInfo) -> None:
        tracked = self._pods.get(pod.uid)
        if tracked is None:
            share = admitted_share(pod, self._hardware)
            if share is None and not claim_refs(pod.raw):
                return
            tracked = TrackedPod(pod, share or Decimal(0), sidecar=has_sidecar(pod))
        ended_at = tracked.ended_at
        if ended_at is None and pod.ended:
            ended_at = pod.finished_at or self._clock.now()
        self._pods[pod.uid] = replace(tracked, info=pod, ended_at=ended_at)
        self._present.add(pod.uid)

    def _gone(self, uid: str) -> None:
        self._present.discard(uid)
        tracked = self._pods.get(uid)
        if tracked is None:
            return
        if tracked.closed:
            del self._pods[uid]
        elif tracked.ended_at is None:
            self._pods[uid] = replace(tracked, ended_at=tracked.info.finished_at or self._clock.now())

    def pods(self) -> list[TrackedPod]:
        return list(self._pods.values())

    def mark_closed(self, uid: str) -> None:
        """The pod's final charge is done: forget it once the API no longer has it."""
        tracked = self._pods.get(uid)
        if tracked is None:
            return
        if uid in self._present:
            self._pods[uid] = replace(tracked, closed=True)
        else:
            del self._pods[uid]
