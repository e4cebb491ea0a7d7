"""The running-pod action `kueue`: an exhausted namespace's Kueue Workloads lowered in place to the reduced
WorkloadPriorityClass's value, and given back once it is not, never above what the priority policy allows
(the annotation keeping the old value is the tenant's to write too). Each pass decides which namespaces are
lowered; between passes a watch on the Workloads lowers one the tenant raised (or made anew) as soon as the
change arrives. docs/kubernetes.md, "Kueue Workloads"."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gpuaccounting.admission_state import is_exempt
from gpuaccounting.dra import claim_refs
from gpuaccounting.names import DOMAIN
from gpuaccounting.shares import read_pod
from timekeeper.audit.repository import AuditRepository
from timekeeper.auth.base import Principal
from timekeeper.clock import Clock
from timekeeper.domain.clusters import in_cluster, namespace_key
from timekeeper.kube import KubeApiError, KubeClient, KubeError, ObjectReference
from timekeeper.metrics import DowngradeMetrics
from timekeeper.reconcile.repository import ReconcileRepository
from timekeeper.settings import Settings

log = logging.getLogger(__name__)

KUEUE_GROUP: Final = "kueue.x-k8s.io"
KUEUE_VERSION: Final = "v1beta1"
WORKLOADS: Final = "workloads"
PRIORITY_CLASSES: Final = "workloadpriorityclasses"
LOWERED_LABEL: Final = f"{DOMAIN}/kueue-priority-lowered"
ORIGINAL_ANNOTATION: Final = f"{DOMAIN}/kueue-priority-before"
NO_PRIORITY: Final = "none"  # the annotation's value for a Workload that had no spec.priority
ACTOR: Final = "gpu-timekeeper:reconcile"
INT32 = range(-(2**31), 2**31)


@dataclass(frozen=True, slots=True)
class KueuePolicy:
    """What the pass needs of a namespace: whether its Workloads are lowered now, and its priority policy."""

    lowering: bool
    exempt_classes: frozenset[str]
    user_classes: str
    ceiling: int | None

    def bound(self, in_budget: int | None) -> int | None:
        """The highest priority a Workload is given back: the ceiling under `keep_up_to_ceiling`, else
        (and when no ceiling is set) the in-budget class's value; None when that class is unknown."""
        if self.user_classes == "keep_up_to_ceiling" and self.ceiling is not None:
            return self.ceiling
        return in_budget


async def kueue_policies(
    session: AsyncSession, namespaces: Iterable[str], cluster: str | None
) -> dict[str, KueuePolicy]:
    """Every exhausted namespace of `cluster` (None: the local one) and each of `namespaces` (its bare
    names), with its effective action and priority policy (its own budget's, else the default's), by
    bare name: that cluster's only, never another's of the same name (docs/fleet.md)."""
    keys = (namespace_key(cluster, namespace) for namespace in namespaces)
    found = in_cluster(await ReconcileRepository(session).kueue_policies(keys), cluster)
    return {
        namespace: KueuePolicy(
            lowering=lowering,
            exempt_classes=frozenset(policy["exempt_classes"]),
            user_classes=policy["user_classes"],
            ceiling=policy["ceiling"],
        )
        for namespace, (lowering, policy) in found.items()
    }


def priority_of(workload: Mapping[str, Any]) -> int | None:
    value = (workload.get("spec") or {}).get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def recorded_priority(workload: Mapping[str, Any]) -> int | str | None:
    """The priority the annotation says the Workload had: an int, None (it had none), or the annotation's
    raw text when it is missing or not a priority (a Workload a tenant tampered with)."""
    raw: str = ((workload.get("metadata") or {}).get("annotations") or {}).get(ORIGINAL_ANNOTATION, "")
    if raw == NO_PRIORITY:
        return None
    try:
        value = int(raw)
    except ValueError:
        return raw
    return value if value in INT32 else raw


def restored_priority(workload: Mapping[str, Any], bound: int) -> int | None:
    """What a lowered Workload is given back: the recorded priority, at most `bound`; `bound` when the
    record is missing or garbled (never more than the namespace's policy allows)."""
    recorded = recorded_priority(workload)
    if isinstance(recorded, str):
        return bound
    return None if recorded is None else min(recorded, bound)


def is_finished(workload: Mapping[str, Any]) -> bool:
    conditions = (workload.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Finished" and c.get("status") == "True" for c in conditions)


def uses_gpus(workload: Mapping[str, Any], settings: Settings) -> bool:
    """Whether any of its pod sets' templates asks for a GPU (a device plugin's, or a DRA claim)."""
    for pod_set in (workload.get("spec") or {}).get("podSets") or []:
        template = pod_set.get("template") or {}
        if claim_refs(template) or read_pod(template, settings.hardware).uses_gpu:
            return True
    return False


class KueuePriorities:
    """The action: a pass, run by the reconciler after its evictions, and the Workload watch between
    passes (on the leader only, like the pass)."""

    def __init__(
        self,
        kube: KubeClient,
        sessionmaker: async_sessionmaker[AsyncSession],
        settings: Settings,
        clock: Clock,
        metrics: DowngradeMetrics,
        cluster: str | None = None,
    ) -> None:
        self.kube = kube
        self.cluster = cluster  # whose Workloads `kube` reaches (None: the local cluster)
        self.sessionmaker = sessionmaker
        self.settings = settings
        self.clock = clock
        self.metrics = metrics
        self._reduced: int | None = None  # the reduced class's value, as the last pass (or the watch) read it

    def forget(self) -> None:
        """Not leading: the reduced value is read again by the next leadership."""
        self._reduced = None

    async def follow(self) -> None:
        """Every Workload change, once Kueue's Workloads are served (asked each reconcile interval until
        then): a GPU Workload of a namespace lowered now, above the reduced value (a tenant's raise, or a
        Workload made anew), is lowered at once, not on the next pass. The namespace's state and action
        are read when such a change arrives; the watch's first events list every Workload."""
        served = False
        while not served:
            served = await self._served()
            if not served:
                await asyncio.sleep(self.settings.reconcile_interval_seconds)
        try:
            changes = self.kube.watch_custom_raw(KUEUE_GROUP, KUEUE_VERSION, WORKLOADS)
            async with aclosing(changes):
                async for type_, workload in changes:
                    if type_ != "DELETED":
                        await self.on_change(workload)
        except Exception:
            log.exception("kueue_watch_crashed")  # the passes still lower every Workload that lasts
            raise

    async def _served(self) -> bool:
        try:
            found = await self.kube.list_served_objects(
                KUEUE_GROUP, KUEUE_VERSION, WORKLOADS, label_selector=LOWERED_LABEL
            )
        except KubeError as error:
            log.warning("kueue_priority_failed", extra={"error": str(error)})
            return False
        return found is not None

    async def on_change(self, workload: Mapping[str, Any]) -> None:
        """Lower one changed Workload if the pass would (cheap checks first: most changes are status)."""
        namespace = (workload.get("metadata") or {}).get("namespace")
        if not isinstance(namespace, str) or is_finished(workload) or not uses_gpus(workload, self.settings):
            return
        try:
            if self._reduced is None:
                self._reduced = await self._class_value(self.settings.kueue_over_budget_priority_class)
            reduced = self._reduced
            if reduced is None or (priority_of(workload) or 0) <= reduced:
                return
            async with self.sessionmaker() as session:
                policy = (await kueue_policies(session, [namespace], self.cluster))[namespace]
            if (
                policy.lowering
                and self._to_lower(workload, policy, reduced)
                and await self._lower(workload, reduced)
            ):
                self.metrics.kueue_lowered.labels(trigger="watch").inc()
        except KubeError as error:
            log.warning("kueue_priority_failed", extra={"namespace": namespace, "error": str(error)})

    async def run(self, lowered: list[tuple[str, str]], restored: list[tuple[str, str]]) -> None:
        """Give back what no longer needs lowering, then lower what does; nothing where Kueue's Workloads
        are not served. A failing call is logged and tried again next pass."""
        try:
            marked = await self.kube.list_served_objects(
                KUEUE_GROUP, KUEUE_VERSION, WORKLOADS, label_selector=LOWERED_LABEL
            )
            if marked is None:
                return
            async with self.sessionmaker() as session:
                policies = await kueue_policies(
                    session, (w["metadata"]["namespace"] for w in marked), self.cluster
                )
            giving_back = [w for w in marked if not policies[w["metadata"]["namespace"]].lowering]
            if giving_back:
                in_budget = await self._class_value(self.settings.kueue_in_budget_priority_class)
                for workload in giving_back:
                    policy = policies[workload["metadata"]["namespace"]]
                    if await self._restore(workload, policy.bound(in_budget)):
                        restored.append(_key(workload))
            lowering = sorted(ns for ns, policy in policies.items() if policy.lowering)
            if not lowering:
                return
            reduced = self._reduced = await self._class_value(self.settings.kueue_over_budget_priority_class)
            if reduced is None:
                return
            for namespace in lowering:
                workloads = await self.kube.list_served_objects(
                    KUEUE_GROUP, KUEUE_VERSION, WORKLOADS, namespace=namespace
                )
                for workload in workloads or ():
                    if self._to_lower(workload, policies[namespace], reduced) and await self._lower(
                        workload, reduced
                    ):
                        lowered.append(_key(workload))
                        self.metrics.kueue_lowered.labels(trigger="pass").inc()
        except KubeError as error:
            log.warning("kueue_priority_failed", extra={"error": str(error)})

    async def _class_value(self, name: str) -> int | None:
        found = await self.kube.read_cluster_object(KUEUE_GROUP, KUEUE_VERSION, PRIORITY_CLASSES, name)
        value = (found or {}).get("value")
        if not isinstance(value, int) or isinstance(value, bool):
            log.warning("kueue_priority_class_missing", extra={"workload_priority_class": name})
            return None
        return value

    def _to_lower(self, workload: Mapping[str, Any], policy: KueuePolicy, reduced: int) -> bool:
        spec = workload.get("spec") or {}
        namespace = workload["metadata"]["namespace"]
        exempt = is_exempt(
            spec.get("priorityClassName"), namespace, policy.exempt_classes, self.settings.exempt_namespaces
        )
        return (
            (priority_of(workload) or 0) > reduced
            and not exempt
            and not is_finished(workload)
            and uses_gpus(workload, self.settings)
        )

    async def _lower(self, workload: Mapping[str, Any], reduced: int) -> bool:
        """Set spec.priority to `reduced`, recording the value it had unless a record is there already
        (a Workload raised again after our lowering keeps its first record)."""
        before = priority_of(workload)
        metadata: dict[str, Any] = {"labels": {LOWERED_LABEL: "true"}}
        if isinstance(recorded_priority(workload), str):
            metadata["annotations"] = {ORIGINAL_ANNOTATION: NO_PRIORITY if before is None else str(before)}
        reason = (
            f"GPU budget of namespace {workload['metadata']['namespace']} spent: Workload priority "
            f"{before} -> {reduced} (WorkloadPriorityClass {self.settings.kueue_over_budget_priority_class})"
        )
        return await self._write(
            workload, metadata, reduced, "kueue.lower", "GPUBudgetPriorityLowered", reason
        )

    async def _restore(self, workload: Mapping[str, Any], bound: int | None) -> bool:
        if bound is None:
            return False  # the in-budget class is missing (logged): kept lowered until it exists
        metadata = {"labels": {LOWERED_LABEL: None}, "annotations": {ORIGINAL_ANNOTATION: None}}
        given = restored_priority(workload, bound)
        reason = (
            f"GPU budget of namespace {workload['metadata']['namespace']} no longer spent: Workload priority "
            f"{priority_of(workload)} -> {given}"
        )
        return await self._write(
            workload, metadata, given, "kueue.restore", "GPUBudgetPriorityRestored", reason
        )

    async def _write(
        self,
        workload: Mapping[str, Any],
        metadata: dict[str, Any],
        priority: int | None,
        action: str,
        reason: str,
        message: str,
    ) -> bool:
        """The patch, conditional on the version read (a Workload changed since is left for its next
        watch event or the next pass), then its audit entry and an Event on the Workload."""
        meta = workload["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        patch = {
            "metadata": {**metadata, "resourceVersion": meta["resourceVersion"]},
            "spec": {"priority": priority},
        }
        try:
            await self.kube.merge_patch_object(KUEUE_GROUP, KUEUE_VERSION, WORKLOADS, namespace, name, patch)
        except KubeApiError as error:
            log.warning(
                "kueue_priority_failed", extra={"namespace": namespace, "workload": name, "error": str(error)}
            )
            return False
        before = {"workload": name, "uid": meta.get("uid"), "priority": priority_of(workload)}
        async with self.sessionmaker() as session, session.begin():
            await AuditRepository(session).record(
                self.clock.now(),
                Principal(ACTOR),
                action,
                namespace_key(self.cluster, namespace),
                before,
                {**before, "priority": priority},
            )
        log.info(
            action.replace(".", "_"), extra={"namespace": namespace, "workload": name, "priority": priority}
        )
        involved = ObjectReference(
            "Workload", name, namespace, f"{KUEUE_GROUP}/{KUEUE_VERSION}", meta.get("uid")
        )
        event_type = "Warning" if action == "kueue.lower" else "Normal"
        try:
            await self.kube.post_event(namespace, reason, message, event_type, involved)
        except KubeError as error:
            log.warning("event_failed", extra={"namespace": namespace, "reason": reason, "error": str(error)})
        return True


def _key(workload: Mapping[str, Any]) -> tuple[str, str]:
    return workload["metadata"]["namespace"], workload["metadata"]["name"]
